#!/usr/bin/env bash
# Set up everything (venv, CPU torch, Stockfish, Chromium) and run the default test suite (-m "not slow").
#   bash scripts/test.sh          the default run: about 7 minutes of pytest on a 2-core machine
#   bash scripts/test.sh --all    the default run, then the slow set (every test; what CI runs)
# Other arguments go to pytest (both runs with --all).
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [ "${1:-}" = "--all" ]; then all=1; shift; fi
bash scripts/setup.sh --browser
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
# Two workers (pytest-xdist), a test file at a time each: the suite waits on subprocesses (Stockfish, kernels,
# Chromium, CLIs) for much of its time, so two files in flight keep both cores busy. RW_TEST_WORKERS=0: one process.
run() {
  local name=$1; shift
  local start=$SECONDS status=0
  .venv/bin/python -m pytest -n "${RW_TEST_WORKERS:-2}" --dist loadfile --durations=15 "$@" || status=$?
  echo "scripts/test.sh: the $name took $((SECONDS - start)) s (exit $status)"
  return $status
}
if [ $all = 0 ]; then
  run "default run" -m "not slow" "$@"
else
  status=0
  run "default run" -m "not slow" "$@" || status=$?
  run "slow set" -m slow "$@" || status=$?    # even after a failure above: CI reports every test
  exit $status
fi
