#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: system packages, venv, CPU torch first, the project.
# Usage: bash scripts/setup.sh [--browser]   (--browser also installs Chromium for the UI tests)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ROOKWORLD_VENV:-.venv}"
want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1

apt_pkgs=()
if ! command -v stockfish >/dev/null 2>&1 && [ ! -x /usr/games/stockfish ]; then apt_pkgs+=(stockfish); fi
if [ "$want_browser" = 1 ] && [ ! -x /usr/bin/chromium ]; then apt_pkgs+=(chromium); fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[setup] apt-get install ${apt_pkgs[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
  else
    echo "[setup] WARNING: cannot install ${apt_pkgs[*]} (need root + apt-get); install them yourself" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.rookworld-setup-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  # CPU torch FIRST: an open torch range in a fresh venv would pull a multi-GB CUDA build.
  "$PY" -m pip install -q "torch==2.13.0" || "$PY" -m pip install -q "torch>=2.2,<2.14"
  "$PY" -m pip install -q -e ".[dev]"
  rm -f "$VENV"/.rookworld-setup-*
  touch "$stamp"
else
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
fi
# the package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (containers often set it) every
# process would compile the package's modules from source again (about a second per command on 2 cores)
"$PY" -m compileall -q -j 0 rookworld_debug >/dev/null || true
echo "[setup] ok: $("$PY" -c 'import torch, transformers, chess; print("torch", torch.__version__, "transformers", transformers.__version__, "chess", chess.__version__)')"
