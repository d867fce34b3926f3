#!/usr/bin/env bash
# Set up everything and run the main job on the embedded default (tiny model, bundled data):
# one GRPO step rendered as a report under reports/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/rookworld-debug main "$@"
