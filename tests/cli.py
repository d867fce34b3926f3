"""The package's command as a user runs it from the tests: a subprocess with stdin closed, a deadline and the
environment every test shares (offline hub, this checkout first on the import path)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
       "PYTHONPATH": str(REPO)}


def run_cli(*args, cwd=None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`rookworld-debug ARGS` (text output captured); TimeoutExpired past `timeout` s."""
    return subprocess.run([CLI, *map(str, args)], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env=env or ENV)
