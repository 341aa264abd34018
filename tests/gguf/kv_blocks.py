#!/usr/bin/env python3
"""Writes blocks of 32 float32 values and what the gguf package's Q8_0 and Q4_0 (ggml's reference
quantizers, bit for bit) make of them after quantize + dequantize, as raw little-endian float32 files
x.f32, q8_0.f32 and q4_0.f32 in the folder given. test_kvcache compares memtrade's q8_0 / q4_0 KV records
with them. The blocks: normal values at several scales, a block with one outlier, halves that roundf
takes away from zero (q8_0), values on q4_0's truncation edges, a block whose largest magnitude is
negative, an all-zero block and one whose scale underflows fp16 (an even count: records of two blocks). Exit code 77 when the gguf package is missing."""
import sys
from pathlib import Path

try:
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize
except ImportError as e:
    print(f"kv_blocks: {e} (python3 -m pip install gguf)", file=sys.stderr)
    sys.exit(77)

rng = np.random.default_rng(7)
blocks = [rng.standard_normal(32) * s for s in (1e-3, 0.5, 1.0, 3.0, 40.0, 1e4) for _ in range(40)]
outlier = rng.standard_normal(32)
outlier[11] = 60.0
blocks.append(outlier)
halves = np.arange(32, dtype=np.float64) - 15.5  # with amax 127: x / d lands on k + 0.5
halves[0] = 127.0
blocks.append(halves)
edges = np.linspace(-8.0, 7.0, 32)  # max -8: d = 1, x / d + 8.5 on and near whole numbers
edges[3] = -8.0
blocks.append(edges)
negmax = rng.standard_normal(32)
negmax[20] = -9.0
blocks.append(negmax)
blocks.append(np.zeros(32))
blocks.append(rng.standard_normal(32) * 1e-9)  # a scale below fp16's smallest: stored as 0
x = np.concatenate(blocks).astype(np.float32).reshape(-1, 32)

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
x.tofile(out / "x.f32")
for name, t in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0)):
    dequantize(quantize(x, t), t).astype(np.float32).tofile(out / f"{name}.f32")
