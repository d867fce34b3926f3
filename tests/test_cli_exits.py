"""Every `rookworld-debug` command, run as a user runs it (a real subprocess, stdin closed, a
timeout), EXITS with status 0. `rookworld-debug step` used to print its log and then hang at interpreter exit
forever (engine threads); the default `step` is asserted in tests/test_engine_faults.py.

The small arguments keep each command to seconds; the exit path (engine/threads/kernels cleaned up) is the
same as with the defaults. `measure`, `bench` and `main` take about a minute each here: marked slow.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
SMALL_STEP = ["--set", "batch_size=2", "--set", "num_generations=2", "--set", "max_new_tokens=8",
              "--set", "eval_max_new_tokens=8", "--set", "heldout_n=0"]


def _exits(args: list[str], cwd: Path, timeout: float = 110) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    out = subprocess.run([CLI, *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout, env=ENV)
    return out, time.perf_counter() - t0


def _data(tmp_path: Path) -> Path:
    out, _ = _exits(["generate-data", "--out", str(tmp_path / "g.jsonl"), "--n-p", "16", "--n-a", "16",
                     "--depth", "1", "--workers", "1", "--quiet", "--heldout-frac", "0"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return tmp_path / "g.jsonl"


COMMANDS = {
    "smoke": lambda tmp: ["smoke", "--depth", "1"],
    "generate-data": lambda tmp: ["generate-data", "--out", str(tmp / "d.jsonl"), "--n-p", "2", "--n-a", "2",
                                  "--depth", "1", "--workers", "1", "--quiet"],
    "run": lambda tmp: ["run", "--steps", "1", *SMALL_STEP, "--out", str(tmp / "run"), "--no-progress"],
    "report-dry-run": lambda tmp: ["report", "--dry-run", "-p", "beta=0,0.1"],
    "train-tiny": lambda tmp: ["train-tiny", "--out", str(tmp / "tt"), "--data", str(_data(tmp)), "--n-layer", "1",
                               "--n-embd", "16", "--n-head", "1", "--n-positions", "256", "--steps", "2",
                               "--batch-size", "2", "--threads", "1"],
}
SLOW = {
    "measure": lambda tmp: ["measure", "tiny", "--n-positions", "4", "--no-rewards", "--threads", "1"],
    "bench": lambda tmp: ["bench", "--variants", "a", "--reps", "1", "--warmup", "0", "-B", "1", "-G", "2",
                          "--max-new-tokens", "8", "--no-widget", "--engine-reps", "1", "--isolate", "none",
                          "--out", str(tmp / "bench"), "--heldout-n", "0", "--eval-max-new-tokens", "8",
                          "--threads", "1"],
}


# The deadlines catch a command that waits forever (on stdin, a child, a lock); they are not timings. Each is
# several times what the command took on the 2-core machine with other test jobs beside it (`measure`: 190 s
# there, its A-by-band phase alone 146 s), so a loaded machine never turns one into a failure.
@pytest.mark.timeout(330)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_exits_0_with_stdin_closed(tmp_path, name):
    out, elapsed = _exits(COMMANDS[name](tmp_path), tmp_path, timeout=300)
    assert out.returncode == 0, f"{name}: rc={out.returncode}\n{out.stderr[-3000:]}"
    print(f"\nrookworld-debug {name}: exit 0 after {elapsed:.1f} s")


@pytest.mark.slow
@pytest.mark.timeout(960)
@pytest.mark.parametrize("name", list(SLOW))
def test_heavy_command_exits_0_with_stdin_closed(tmp_path, name):
    out, elapsed = _exits(SLOW[name](tmp_path), tmp_path, timeout=900)
    assert out.returncode == 0, f"{name}: rc={out.returncode}\n{out.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_main_job_exits_0_with_stdin_closed(tmp_path):
    out, _ = _exits(["main", "--out", str(tmp_path / "reports"), "--no-progress"], tmp_path, timeout=590)
    assert out.returncode == 0, out.stderr[-3000:]
    assert list((tmp_path / "reports").rglob("report.html"))


@pytest.mark.timeout(120)
def test_report_dry_run_rejects_what_a_real_run_rejects(tmp_path):
    """`report --dry-run -p beta_=0.1` listed the typo as a run and exited 0; a real run exits 2."""
    for extra in (["--dry-run"], []):
        out, _ = _exits(["report", *extra, "-p", "beta_=0.1", "--out", str(tmp_path / "r")], tmp_path)
        assert out.returncode == 2, (extra, out.stdout, out.stderr)
        assert "beta_" in out.stderr and "not a parameter" in out.stderr
        assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("report.html"))
    out, _ = _exits(["report", "--dry-run", "-p", "beta=0,0.1", "--workers", "0"], tmp_path)
    assert out.returncode == 2 and "workers" in out.stderr
