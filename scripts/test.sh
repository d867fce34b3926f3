#!/usr/bin/env bash
# Set up everything (venv, CPU torch, Stockfish, Chromium) and run the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
exec .venv/bin/python -m pytest -m "not slow" --durations=15 "$@"
