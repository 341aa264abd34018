#!/usr/bin/env python3
"""Writes a small GGUF file with the `gguf` package (every metadata value type, nested arrays, tensors of
types F32, F16, Q8_0, Q4_0, Q4_1) and a JSON of what it holds: each key's type and value, each tensor's
shape, type and its values dequantized by the package, as float32 bit patterns. test_gguf reads both.
Exit code 77 when the gguf package is missing."""
import json
import sys
from pathlib import Path

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize, quantize
except ImportError as e:
    print(f"make_small_gguf: {e} (python3 -m pip install gguf)", file=sys.stderr)
    sys.exit(77)

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
path = out / "small.gguf"
T = gguf.GGUFValueType
w = gguf.GGUFWriter(str(path), arch="llama")
meta = [  # key, type, value (general.architecture is written by the writer)
    ("test.u8", T.UINT8, 200), ("test.i8", T.INT8, -100), ("test.u16", T.UINT16, 60000),
    ("test.i16", T.INT16, -30000), ("test.u32", T.UINT32, 4000000000), ("test.i32", T.INT32, -2000000000),
    ("test.f32", T.FLOAT32, 0.15625), ("test.bool", T.BOOL, True), ("test.string", T.STRING, "héllo, GGUF"),
    ("test.u64", T.UINT64, 2**63 + 5), ("test.i64", T.INT64, -(2**62)), ("test.f64", T.FLOAT64, 2.5e-300),
]
for key, t, v in meta:
    w.add_key_value(key, v, t)
w.add_array("test.array_i32", [1, -2, 3])
w.add_array("test.array_str", ["a", "", "ccc"])
w.add_array("test.array_nested", [[1, 2], [3]])

rng = np.random.default_rng(7)
tensors = {}
def add(name, arr, qtype):
    data = quantize(arr, qtype) if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) \
        else arr.astype(np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16)
    w.add_tensor(name, data, raw_dtype=qtype)
    tensors[name] = (arr.shape, qtype, dequantize(data, qtype).astype(np.float32).reshape(-1))

add("f32.weight", rng.standard_normal((3, 5)).astype(np.float32), gguf.GGMLQuantizationType.F32)
add("f16.weight", rng.standard_normal((7,)).astype(np.float32), gguf.GGMLQuantizationType.F16)
add("q8.weight", (rng.standard_normal((4, 64)) * 0.1).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
add("q40.weight", rng.standard_normal((2, 96)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
add("q41.weight", (rng.standard_normal((3, 32)) + 0.5).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

expected = {
    "metadata": [{"key": k, "type": int(t), "value": v} for k, t, v in meta]
    + [{"key": "test.array_i32", "value": [1, -2, 3]}, {"key": "test.array_str", "value": ["a", "", "ccc"]},
       {"key": "test.array_nested", "value": [[1, 2], [3]]}],
    "tensors": [{"name": n, "shape": list(shape), "type": q.name,
                 "bits": [int(b) for b in vals.view(np.uint32)]} for n, (shape, q, vals) in tensors.items()],
}
(out / "small.json").write_text(json.dumps(expected))
print(path)
