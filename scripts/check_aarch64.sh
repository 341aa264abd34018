#!/usr/bin/env bash
# Compiles every C++ source of the CPU build for aarch64 Linux (GCC 12, -fsyntax-only): what an ARM64
# build would have to compile, checked on any x86-64 Debian/Ubuntu machine without linking or running it.
# Installs the cross compiler and Debian's arm64 cross headers when missing. Highway's headers do not
# depend on the architecture; OpenBLAS's cblas.h and the generated build_info.hpp are taken from the host
# and from a stub. Exit 1 if a file does not compile. CUDA sources (.cu) are not checked.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=aarch64-linux-gnu-g++-12
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v "$CXX" >/dev/null || [ ! -d /usr/aarch64-linux-gnu/include/c++/12 ]; then
  echo "check_aarch64: installing the aarch64 cross compiler and headers"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends g++-12-aarch64-linux-gnu \
    libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross >/dev/null
fi
cblas=$(find /usr/include -name cblas.h | head -1)
[ -n "$cblas" ] || { echo "check_aarch64: no cblas.h (scripts/install_deps.sh installs OpenBLAS)" >&2; exit 2; }
inc=$(mktemp -d)
trap 'rm -rf "$inc"' EXIT
mkdir -p "$inc/hwy_root" "$inc/memtrade"
ln -s /usr/include/hwy "$inc/hwy_root/hwy"  # Highway without the rest of the host's /usr/include
for h in "$(dirname "$cblas")"/{cblas.h,f77blas.h,openblas_config.h}; do [ -e "$h" ] && ln -s "$h" "$inc/"; done
cat > "$inc/memtrade/build_info.hpp" <<'H'
#pragma once
namespace memtrade::build {
inline constexpr const char *source_dir = "", *build_type = "", *cxx_compiler = "", *cxx_flags = "",
                            *cuda_compiler = "", *cuda_architectures = "", *version = "";
}
H
flags=(-std=c++20 -fsyntax-only -fopenmp -I. -isystem "$inc" -isystem "$inc/hwy_root" -DMEMTRADE_SOURCE_DIR=\"$PWD\")
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
[ "$failed" -eq 0 ] && echo "check_aarch64: every C++ source compiles for aarch64 (syntax only)"
exit "$failed"
