#!/usr/bin/env bash
# The one prepared check for a lent GPU (one H200, 16 cores; budget under 8 minutes):
#   build for the GPU found (native architecture), run the CUDA tests, probe the ceilings, run the
#   quick suites on the CUDA backend, compare with the CUDA baseline when one is committed, and write
#   logs, results and the report under $OUT (default build/gpu_check).
# Dependencies the GPU machine lacks come from .gpudeps/ (scripts/fetch_gpu_deps.sh, carried).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_check}"
mkdir -p "$OUT"
log() { echo "[gpu_check $(date +%T)] $*" | tee -a "$OUT/summary.txt"; }

prefix=""
if compgen -G ".gpudeps/*.deb" >/dev/null; then
  prefix="$PWD/.gpudeps/root"
  mkdir -p "$prefix"
  for f in .gpudeps/*.deb; do dpkg -x "$f" "$prefix"; done
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:$prefix/usr/lib/x86_64-linux-gnu/openblas-pthread:${LD_LIBRARY_PATH:-}"
  # The unpacked tree has the libraries but not Debian's alternatives links: add the plain names.
  (cd "$prefix/usr/lib/x86_64-linux-gnu" && { [ -e libopenblas.so ] || ln -sf openblas-pthread/libopenblas.so libopenblas.so; }
   [ -e libblas.so ] || ln -sf openblas-pthread/libblas.so libblas.so) 2>/dev/null
  [ -e "$prefix/usr/include/cblas.h" ] || ln -sf x86_64-linux-gnu/openblas-pthread/cblas.h "$prefix/usr/include/cblas.h" 2>/dev/null
  # The training suites' text corpus (the fortunes packages), unpacked with the rest.
  [ -d "$prefix/usr/share/games/fortunes" ] && export MEMTRADE_FORTUNES_DIR="$prefix/usr/share/games/fortunes"
  log "dependencies unpacked from .gpudeps into $prefix"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
log "GPU: $(tail -n +2 "$OUT/nvidia-smi.csv" | head -1)"

t0=$(date +%s)
# MEMTRADE_CUDA_ARCH overrides the detected architecture (e.g. 90 to rehearse the script without a GPU).
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${MEMTRADE_CUDA_ARCH:-native}" \
  ${prefix:+-DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu" -DCMAKE_INCLUDE_PATH="$prefix/usr/include"} \
  > "$OUT/configure.log" 2>&1 || { log "configure FAILED (see configure.log)"; tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" > "$OUT/build.log" 2>&1 || { log "build FAILED (see build.log)"; tail -40 "$OUT/build.log"; exit 1; }
log "built in $(( $(date +%s) - t0 )) s"

bin=build/gpu/memtrade
(cd build/gpu && timeout 240 ctest -L cuda --output-on-failure) > "$OUT/ctest_cuda.log" 2>&1
rc_tests=$?
log "CUDA tests: $(grep -E 'tests passed|tests failed' "$OUT/ctest_cuda.log" | tail -1) (rc $rc_tests)"

timeout 120 $bin probe --backend auto --out "$OUT/ceilings.json" > "$OUT/probe.log" 2>&1
log "ceilings: $(tr '\n' ';' < "$OUT/probe.log")"

timeout 300 $bin run --suite all --profile quick --backend cuda --out "$OUT/results.json" > "$OUT/run.log" 2>&1
rc_run=$?
log "quick suites (cuda): $(tail -1 "$OUT/run.log") (rc $rc_run)"

# The attention target case (bf16 forward, d = 128, n = 8192) from the full profile.
timeout 120 $bin run --suite attention --profile full --backend cuda \
  --filter "n=8192,d=128,causal=false,dtype=bf16,pass=fwd/" --out "$OUT/attention_8k.json" > "$OUT/attention_8k.log" 2>&1
log "attention n=8192 d=128 bf16 fwd: $(grep -E '/(naive|flash) ' "$OUT/attention_8k.log" | sed -E 's/ +/ /g' | tr '\n' ';')"

if [ -f suites/baselines/cuda/quick.json ]; then
  $bin compare suites/baselines/cuda/quick.json "$OUT/results.json" --markdown "$OUT/compare.md" > "$OUT/compare.log" 2>&1
  log "compare with the CUDA baseline: rc $? ($(tail -1 "$OUT/compare.log"))"
else
  log "no CUDA baseline committed: copy results.json to suites/baselines/cuda/quick.json after review"
fi
# PyTorch on the same cases, where the machine has it (scripts/install_peers.sh): plotted beside memtrade.
peers=""
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  timeout 180 python3 scripts/peers.py --memtrade $bin --suite attention,gemm,quant --profile quick --backend cuda \
    --out "$OUT/peers.json" --against "$OUT/results.json" > "$OUT/peers.log" 2>&1 && peers="$OUT/peers.json"
  log "peers (PyTorch, cuda): ${peers:-failed (see peers.log)}"
fi
if python3 -c "import matplotlib" 2>/dev/null; then
  $bin report "$OUT/results.json" $peers -o "$OUT/report.html" > "$OUT/report.log" 2>&1 && log "report: $OUT/report.html"
fi

echo
echo "=== per-case table (cuda, quick) ==="
grep -E " ok | oom | skipped | error " "$OUT/run.log" | sed -E 's/ +/ /g' | cut -c1-200
echo
cat "$OUT/summary.txt"
[ $rc_tests -eq 0 ] && [ $rc_run -eq 0 ]
