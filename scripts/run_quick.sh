#!/usr/bin/env bash
# The main job: install dependencies, build, run every suite's quick profile (CPU, and CUDA when a
# device is present), compare with the committed baseline, and write the HTML report.
#   output: reports/out/results.json, reports/out/report.html
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh release
mkdir -p reports/out
bin=build/release/memtrade
$bin run --suite all --profile quick --backend auto --out reports/out/results.json
baseline=suites/baselines/cpu/quick.json
# Time is report-only here: a laptop or shared runner is not the baseline's machine.
$bin compare "$baseline" reports/out/results.json --time report --allow-missing || true
$bin report reports/out/results.json --baseline "$baseline" -o reports/out/report.html
echo "open reports/out/report.html"
