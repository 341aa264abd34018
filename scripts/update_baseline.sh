#!/usr/bin/env bash
# Rewrites a committed baseline from a fresh run. Baselines change only through this command, and the
# diff is reviewed like code:  scripts/update_baseline.sh [cpu|cuda] [quick|full]
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-cpu}"
profile="${2:-quick}"
scripts/build.sh release
mkdir -p "suites/baselines/$backend"
build/release/memtrade run --suite all --profile "$profile" --backend "$backend" --out "suites/baselines/$backend/$profile.json"
echo "baseline written: suites/baselines/$backend/$profile.json (review and commit it)"
