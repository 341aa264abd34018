#!/usr/bin/env bash
# Installs what memtrade needs to build, test and report, on Debian/Ubuntu. Idempotent: installs only
# what is missing. The CUDA toolkit is optional (the CUDA backend is built when nvcc is found).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkgs=(cmake ninja-build g++ git libgtest-dev libbenchmark-dev nlohmann-json3-dev libhwy-dev libopenblas-dev libopenblas-openmp-dev chromium fortunes)
missing=()
# With a second architecture's copy installed too (scripts/check_aarch64.sh adds arm64's), the plain name is
# ambiguous to dpkg: ask for this machine's architecture then.
arch=$(dpkg --print-architecture)
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || dpkg -s "$p:$arch" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# matplotlib for the report; safetensors and gguf only as independent writers/readers in the format tests.
if ! python3 -c "import matplotlib, numpy, PIL, safetensors, gguf" 2>/dev/null; then
  echo "install_deps: installing matplotlib, safetensors and gguf for $(command -v python3)"
  python3 -m pip install -q matplotlib numpy pillow safetensors gguf
fi
# The pretrained model of the real-model cases (98 MB, once). Without it those cases record `skipped`
# with the command that fetches it, and their tests skip; everything else runs.
"$(dirname "$0")/fetch_models.sh" || echo "install_deps: could not fetch the models; their cases will be skipped" >&2
