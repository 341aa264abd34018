#!/usr/bin/env bash
# The CPU build on aarch64 Linux, checked on an x86-64 Debian/Ubuntu machine:
#   1. every tracked C++ source compiled for aarch64 by GCC 12 (-fsyntax-only);
#   2. the SIMD kernels' test programs (quantized matvec, KV cache decode, attention) cross-built against
#      Debian's arm64 libraries and run under qemu-user, whose CPU has NEON, SVE and SVE2.
# Installs what it needs when missing: the cross compiler, the arm64 architecture with libhwy, OpenBLAS,
# GoogleTest and Google Benchmark for it, and qemu-user-static. About 15 minutes on 2 cores, most of it
# the cross build (build/aarch64). Exit 1 if a file does not compile or a test fails. CUDA is not built.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=aarch64-linux-gnu-g++-12
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_install() { DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
if ! command -v "$CXX" >/dev/null || [ ! -d /usr/aarch64-linux-gnu/include/c++/12 ]; then
  echo "check_aarch64: installing the aarch64 cross compiler and headers"
  apt_install gcc-12-aarch64-linux-gnu g++-12-aarch64-linux-gnu libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross
fi
if ! dpkg -s libhwy-dev:arm64 libopenblas-dev:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64 qemu-user-static \
     >/dev/null 2>&1; then
  echo "check_aarch64: installing the arm64 libraries and qemu-user-static"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  apt_install libhwy-dev:arm64 libopenblas-dev:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64 libgomp1:arm64 \
    qemu-user-static
fi

echo "check_aarch64: 1. every C++ source, syntax only"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
mkdir -p "$gen/memtrade"
cat > "$gen/memtrade/build_info.hpp" <<'H'
#pragma once
namespace memtrade::build {
inline constexpr const char *source_dir = "", *build_type = "", *cxx_compiler = "", *cxx_flags = "",
                            *cuda_compiler = "", *cuda_architectures = "", *version = "";
}
H
flags=(-std=c++20 -fsyntax-only -fopenmp -I. -isystem "$gen" -isystem /usr/include/aarch64-linux-gnu
       -DMEMTRADE_SOURCE_DIR=\"$PWD\")
failed=0
while read -r f; do
  # The tests that compare with CUDA's own conversion headers are built only where those headers exist.
  if grep -q '#include <cuda_' "$f"; then continue; fi
  if ! out=$("$CXX" "${flags[@]}" "$f" 2>&1); then
    echo "check_aarch64: $f does not compile for aarch64:"
    echo "$out" | grep -E 'error' | head -5
    failed=1
  fi
done < <(git ls-files '*.cpp')
[ "$failed" -eq 0 ] || exit 1

echo "check_aarch64: 2. the SIMD kernels' tests, cross-built and run under qemu"
mkdir -p build/aarch64
# OpenBLAS's thread pool and OpenMP's spinning threads stall under qemu-user: one thread each. The same
# command runs the tests below and, as CMake's emulator, their discovery at build time.
emulator=(/usr/bin/env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 /usr/bin/qemu-aarch64-static
          -L /usr/aarch64-linux-gnu)
cat > build/aarch64/toolchain.cmake <<T
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc-12)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++-12)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR $(IFS=';'; echo "${emulator[*]}"))
T
cmake -S . -B build/aarch64 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$PWD/build/aarch64/toolchain.cmake" \
  -DMEMTRADE_CUDA=OFF -DMEMTRADE_NATIVE=OFF >/dev/null
tests=(test_quant_kernels test_kvcache test_attention)
cmake --build build/aarch64 --target "${tests[@]}"
for t in "${tests[@]}"; do
  "${emulator[@]}" "build/aarch64/tests/$t" --gtest_brief=1 || failed=1
done
[ "$failed" -eq 0 ] && echo "check_aarch64: every source compiles for aarch64 and the kernel tests pass under qemu"
exit "$failed"
