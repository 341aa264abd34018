#!/usr/bin/env bash
# The tests: install dependencies, build, run every CTest test (GoogleTest units and numerics, the
# CLI end-to-end test and the headless-Chromium report test). CUDA tests skip, printing why, without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh release
ctest --preset release -j "$(nproc)"
if [ -x build/release/tests/test_cuda ]; then
  # Say why CUDA tests were skipped (or that they ran).
  build/release/tests/test_cuda --gtest_brief=1 2>&1 | grep -m1 -E "no CUDA device|PASSED|FAILED" | sed 's/^/cuda tests: /' || true
fi
