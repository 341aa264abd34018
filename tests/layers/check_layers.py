#!/usr/bin/env python3
"""The include graph follows the layers (README, "Architecture"): every #include "..." of a layer names
only itself or a layer below it. Prints each violation (file:line, the include, what the layer may use)
and exits 1 if there is any."""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])

# Layer folder -> the include prefixes it may use ("memtrade/" is the generated build_info header).
BELOW = {
    "common": ["common/", "memtrade/"],
    "datasets": ["common/", "datasets/"],
    "harness": ["common/", "datasets/", "harness/", "memtrade/"],
    "precision": ["common/", "precision/"],
    "model": ["common/", "datasets/", "harness/", "precision/", "model/", "impls/attention/"],
}
# Techniques may use everything below app/, and another technique only where the README says so.
TECHNIQUE_USES = {"quant_model": ["impls/quant/"], "kvcache": ["impls/quant/", "impls/attention/"], "lora": ["impls/quant/"]}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def allowed(path: pathlib.Path):
    top = path.relative_to(ROOT).parts
    if top[0] in BELOW:
        return BELOW[top[0]]
    if top[0] == "impls":
        name = top[1]
        return ["common/", "datasets/", "harness/", "precision/", "model/", f"impls/{name}/"] + TECHNIQUE_USES.get(name, [])
    return None  # app/ and tests/ may include anything


def main():
    bad = []
    files = 0
    for path in sorted(ROOT.glob("**/*")):
        if path.suffix not in {".cpp", ".hpp", ".cu", ".cuh", ".in"} or "build" in path.relative_to(ROOT).parts[:1]:
            continue
        ok = allowed(path)
        if ok is None:
            continue
        files += 1
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if "/" not in inc:  # a header beside the file
                continue
            if not any(inc.startswith(p) for p in ok):
                bad.append(f"{path.relative_to(ROOT)}:{n}: includes \"{inc}\"; this layer may use {', '.join(ok)}")
    for b in bad:
        print(b)
    print(f"layers: {files} files checked, {len(bad)} includes pointing up or sideways")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
