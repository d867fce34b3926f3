#!/usr/bin/env bash
# Set up everything (venv, CPU torch, Stockfish, Chromium) and run the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
# Two workers (pytest-xdist), a test file at a time each: the suite waits on subprocesses (Stockfish, kernels,
# Chromium, CLIs) for much of its time, so two files in flight keep both cores busy. RW_TEST_WORKERS=0: one process.
exec .venv/bin/python -m pytest -m "not slow" -n "${RW_TEST_WORKERS:-2}" --dist loadfile --durations=15 "$@"
