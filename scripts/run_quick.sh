#!/usr/bin/env bash
# The main job: install dependencies, build, run every suite's quick profile (CPU, and CUDA when a
# device is present), compare with the committed baseline, and write the HTML report. Compare and report
# are written whatever the run's outcome; the script then exits with the run's status (0 ok, 3 when a
# case ended in error, 2 when the run could not start).
#   output: reports/out/results.json, reports/out/compare.md, reports/out/report.html
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install_deps.sh
scripts/build.sh release
built=$(date +%s)
mkdir -p reports/out
bin=build/release/memtrade
status=0
$bin run --suite all --profile quick --backend auto --out reports/out/results.json || status=$?
ran=$(date +%s)
if [ ! -f reports/out/results.json ]; then
  echo "run_quick: the run wrote no results (exit $status)" >&2
  exit "$status"
fi
baseline=suites/baselines/cpu/quick.json
# Time is listed, not gated: one run a side cannot gate it, and a laptop is not the baseline's machine.
$bin compare "$baseline" reports/out/results.json --time report --allow-missing --markdown reports/out/compare.md || true
$bin report reports/out/results.json --baseline "$baseline" -o reports/out/report.html
echo "run_quick: install and build $(( built - start )) s, suites $(( ran - built )) s, all $(( $(date +%s) - start )) s"
echo "open reports/out/report.html"
exit "$status"
