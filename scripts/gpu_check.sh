#!/usr/bin/env bash
# The GPU check in one command: the default test suite on CUDA, `step` / `whatif` / `diagnose` of the embedded model on
# CUDA, a captured TRL run on CUDA, and the benchmark of our step against TRL's at the rookworld debug run's scale.
# A quick pass first (two test files, small steps, the tiny bench; ~1-2 minutes) writes
# docs/bench/gpu-check-<date>-<gpu>-quick.json BEFORE the long pass starts, so a short loan still yields numbers;
# the long pass (the suite on the machine's cores, every command, the TRL capture, the bench at B = 8, G = 24, 128
# tokens with each variant's peak GPU memory) writes docs/bench/gpu-check-<date>-<gpu>.json. Each part records
# the device it ran on. Without CUDA it refuses (exit 2, one line) and writes nothing.
#
#   bash scripts/gpu_check.sh                  # on a machine with a CUDA GPU (< 5 minutes on an H100/H200)
#   bash scripts/gpu_check.sh --device cpu --quick   # a rehearsal of the same flow on a CPU-only machine
#
# A machine without network and without the project's set-up (torch, transformers, accelerate, pandas, pytest and
# pytest-xdist present; trl, datasets, chess, plotly... missing): first run `bash scripts/gpu_pack.sh` on a machine
# with network, then bring the folder `.gpu/` (wheels, python-chess, Stockfish) with the checkout. This script
# installs them into a `.venv` of its own that sees the system's packages, and points the project at the Stockfish.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  echo "[gpu-check] creating .venv over the system packages"
  "$PY" -m venv --without-pip --system-site-packages .venv
  touch .venv/.made-by-gpu-check
fi
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# a machine whose python3 is itself a virtual environment (torch installed there, e.g. /opt/torch/.venv): a venv
# made from it sees only the base interpreter's packages, so ours also reads the parent's (after its own)
if [ -f .venv/.made-by-gpu-check ]; then
  "$PY" -c 'import sys, sysconfig; p = sysconfig.get_paths()
if sys.prefix != sys.base_prefix: print(p["purelib"]); print(p["platlib"])' > "$SITE/parent-python.pth"
fi
# this checkout first on the import path, as `pip install -e .` would put it (only in a .venv made here: a
# developer's own .venv already has its editable install, and may serve other checkouts)
if [ -f .venv/.made-by-gpu-check ]; then
  echo "$PWD" > "$SITE/rookworld-debug-checkout.pth"
fi
if [ -d .gpu/whl ] && ! .venv/bin/python -c 'import trl, datasets, chess, plotly' 2>/dev/null; then
  echo "[gpu-check] installing the carried wheels into .venv"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/whl/*.whl
  [ -d .gpu/chess ] && cp -r .gpu/chess "$SITE/"
fi
if [ ! -x .venv/bin/rookworld-debug ]; then   # the console script `pip install` would write
  printf '#!%s\nimport sys\nfrom rookworld_debug.cli import main\nsys.exit(main())\n' "$PWD/.venv/bin/python" \
    > .venv/bin/rookworld-debug
  chmod +x .venv/bin/rookworld-debug
fi
if [ -z "${ROOKWORLD_STOCKFISH:-}" ] && ! command -v stockfish >/dev/null && [ ! -x /usr/games/stockfish ]; then
  if [ -f .gpu/stockfish.xz ]; then
    xz -dc .gpu/stockfish.xz > /tmp/rookworld-stockfish && chmod +x /tmp/rookworld-stockfish
    export ROOKWORLD_STOCKFISH=/tmp/rookworld-stockfish
  else
    echo "[gpu-check] WARNING: no Stockfish (apt-get install stockfish, or .gpu/stockfish.xz from gpu_pack.sh)" >&2
  fi
fi
[ -z "${ROOKWORLD_SHARED:-}" ] && [ -d .gpu/shared/fixtures ] && export ROOKWORLD_SHARED="$PWD/.gpu/shared"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
exec .venv/bin/python scripts/gpu_check.py "$@"
