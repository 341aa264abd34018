#!/usr/bin/env bash
# The GPU machine has CUDA, CMake and ninja but cannot install packages. This downloads (here, where
# apt works) the Debian packages memtrade builds against into .gpudeps/, which the device call
# carries; scripts/gpu_check.sh unpacks them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps
grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >> .git/info/exclude
apt-get update -qq
(cd .gpudeps && apt-get download -qq libgtest-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev libhwy-dev libhwy1 \
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 fortunes fortunes-min)
ls -la .gpudeps
