#!/usr/bin/env python3
"""Reference values for memtrade's SmolLM2 GGUF tests, computed by independent implementations:
the gguf package's dequantize (every tensor, as SHA-256 of its fp32 bytes), the tokenizer and the
LlamaForCausalLM that transformers builds from the same GGUF file (its own GGUF loading, which undoes
llama.cpp's Q/K permutation itself).

Writes tests/reference/smollm2.json. Not run by the default tests (it needs PyPI's torch, transformers,
gguf, accelerate); rerun it by hand or in the nightly job when the model file, the fortunes package or a
pinned choice below changes:

    python3 -m pip install torch transformers gguf accelerate
    python3 tests/reference/smollm2_reference.py --model ~/.cache/memtrade/models/SmolLM2-135M-Instruct.Q4_1.gguf

The corpus is rebuilt exactly as datasets/corpus.cpp builds it (entries of every fortune file without an
extension, sorted by name, joined by one newline); its SHA-256 is stored, and the C++ tests compare only
against the same corpus.
"""
import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path

# Pinned choices (the C++ tests read them from the JSON, not from here).
PROMPT = "The capital of France is Paris. Fortune favours the bold; 1234 + 5678 = 6912.\nIt's  a test."
PPL_TOKENS = 1024          # one window of this many tokens
PPL_START_FRACTION = 0.9   # starting at token floor(0.9 * corpus tokens): the validation split's region
LOGIT_PROBES = 48          # logits stored per position at these many token ids, evenly spread


def load_fortunes(directory):
    out = bytearray()
    for name in sorted(os.listdir(directory)):
        path = Path(directory) / name
        if "." in name or not path.is_file():
            continue
        text = path.read_bytes()
        entry = bytearray()

        def flush():
            nonlocal entry
            if any(c not in b" \t\n\r" for c in entry):
                if out:
                    out.extend(b"\n")
                out.extend(entry)
            entry = bytearray()

        lines = text.split(b"\n")
        if text.endswith(b"\n"):
            lines = lines[:-1]
        for line in lines:
            if line == b"%":
                flush()
            else:
                entry.extend(line + b"\n")
        flush()
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("smollm2.json"))
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    import tokenizers
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ref = {
        "generated_by": "tests/reference/smollm2_reference.py",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "gguf": importlib.metadata.version("gguf"), "numpy": np.__version__},
        "model_file": args.model.name,
        "model_sha256": hashlib.sha256(args.model.read_bytes()).hexdigest(),
    }

    reader = GGUFReader(str(args.model))
    ref["dequantized_sha256"] = {
        t.name: hashlib.sha256(np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).tobytes()).hexdigest()
        for t in reader.tensors
    }

    corpus = load_fortunes(args.fortunes)
    ref["corpus_sha256"] = hashlib.sha256(corpus).hexdigest()
    tok = AutoTokenizer.from_pretrained(str(args.model.parent), gguf_file=args.model.name)
    ids = tok(corpus.decode("utf-8"), add_special_tokens=False)["input_ids"]
    ref["corpus_tokens"] = len(ids)
    ref["corpus_ids_sha256"] = hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()
    ref["corpus_ids_head"] = ids[:64]

    model = AutoModelForCausalLM.from_pretrained(str(args.model.parent), gguf_file=args.model.name,
                                                 dtype=torch.float32)
    model.eval()
    prompt_ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    vocab = model.config.vocab_size
    probes = [round(i * (vocab - 1) / (LOGIT_PROBES - 1)) for i in range(LOGIT_PROBES)]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0].double()
    ref["prompt"] = PROMPT
    ref["prompt_ids"] = prompt_ids
    ref["logit_probe_ids"] = probes
    ref["prompt_logits"] = [{"argmax": int(row.argmax()), "max": float(row.max()),
                             "logsumexp": float(torch.logsumexp(row, 0)),
                             "probes": [float(row[p]) for p in probes]} for row in logits]

    start = int(PPL_START_FRACTION * len(ids))
    window = ids[start:start + PPL_TOKENS]
    with torch.no_grad():
        out = model(torch.tensor([window]), labels=torch.tensor([window]))
        lg = model(torch.tensor([window])).logits[0, :-1].double()
    nll = torch.nn.functional.cross_entropy(lg, torch.tensor(window[1:]), reduction="mean").item()
    ref["perplexity"] = {"start_token": start, "tokens": len(window), "predicted": len(window) - 1,
                         "mean_nll": nll, "perplexity": float(np.exp(nll)),
                         "transformers_loss": float(out.loss)}
    args.out.write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {args.out}: corpus {len(ids)} tokens, perplexity {np.exp(nll):.4f} over {len(window) - 1} predictions")


if __name__ == "__main__":
    sys.exit(main())
