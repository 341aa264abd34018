#!/usr/bin/env bash
# Rewrites a committed baseline from a fresh run of HEAD on a clean tree (the results file records the
# commit). Baselines change only through this command, and the diff is reviewed like code:
#   scripts/update_baseline.sh [cpu|cuda] [quick|full]
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-cpu}"
profile="${2:-quick}"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "update_baseline: the working tree has uncommitted changes; a baseline is recorded from a commit" >&2
  git status --short --untracked-files=no >&2
  exit 1
fi
scripts/build.sh release
mkdir -p "suites/baselines/$backend"
build/release/memtrade run --suite all --profile "$profile" --backend "$backend" --out "suites/baselines/$backend/$profile.json"
echo "baseline written: suites/baselines/$backend/$profile.json from $(git rev-parse --short HEAD) (review and commit it)"
