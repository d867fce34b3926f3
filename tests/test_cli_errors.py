"""Every sub-command, run as a user runs it (subprocess, stdin closed, timeout), turns a bad path or a
bad value into ONE line `rookworld-debug <cmd>: error: …` and exit 2, with no traceback, and checks paths
before the work starts (a bad --out fails in seconds, not after a step)."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _file(tmp: Path) -> str:
    f = tmp / "a_file"
    f.write_text("x")
    return str(f)


CASES = {
    "step-config-missing": lambda t: ["step", "--config", "/nonexistent.yaml"],
    "step-out-is-file": lambda t: ["step", "--out", _file(t)],
    "step-bad-value": lambda t: ["step", "--set", "beta=abc"],
    "step-bad-vespo": lambda t: ["step", "--set", "loss_type=vespo", "--set", "vespo_lambda_pos=-1"],
    "run-out-is-file": lambda t: ["run", "--steps", "2", "--out", _file(t)],
    "run-bad-steps": lambda t: ["run", "--steps", "0", "--out", str(t / "r")],
    "run-resume-missing": lambda t: ["run", "--steps", "2", "--resume", "/nonexistent/step_00002", "--out", str(t / "r")],
    "report-trace-missing": lambda t: ["report", "--trace", "/nonexistent", "--out", str(t / "rep")],
    "report-out-is-file": lambda t: ["report", "-p", "beta=0", "--out", _file(t)],
    "report-bad-param": lambda t: ["report", "-p", "no_such_field=1", "--out", str(t / "rep")],
    "main-out-is-file": lambda t: ["main", "--out", _file(t)],
    "generate-data-out-under-file": lambda t: ["generate-data", "--out", _file(t) + "/d.jsonl", "--n-p", "2"],
    "generate-data-bad-n": lambda t: ["generate-data", "--out", str(t / "d.jsonl"), "--n-p", "-3", "--n-a", "1"],
    "train-tiny-data-missing": lambda t: ["train-tiny", "--data", "/nonexistent", "--out", str(t / "tt")],
    "train-tiny-bad-steps": lambda t: ["train-tiny", "--steps", "0", "--out", str(t / "tt")],
    "measure-model-missing": lambda t: ["measure", "/nonexistent/model", "--n-positions", "2"],
    "measure-zero-positions": lambda t: ["measure", "--n-positions", "0"],
    "bench-out-is-file": lambda t: ["bench", "--out", _file(t), "--variants", "a", "--reps", "1"],
    "bench-bad-reps": lambda t: ["bench", "--reps", "0", "--out", str(t / "b")],
    "smoke-bad-model": lambda t: ["smoke", "--model", "/nonexistent/model", "--depth", "1"],
    "verify-capture-before-missing": lambda t: ["verify-capture", str(t), "--before", "/nonexistent",
                                                "--after", "/nonexistent"],
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_named_line_and_exit_2(tmp_path, name):
    args = CASES[name](tmp_path)
    t0 = time.perf_counter()
    r = subprocess.run([CLI, *args], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=80, env=ENV)
    elapsed = time.perf_counter() - t0
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"rookworld-debug {args[0]}: error:" in r.stderr, r.stderr[-2000:]
    assert elapsed < 60, f"{name} took {elapsed:.0f} s: the check must come before the work"


# Bad paths and bounds are checked before torch is imported: the error line comes before the seconds the imports
# take (the same commands as above, in one process each, asking whether torch was loaded when the error came).
BEFORE_TORCH = ("step-config-missing", "step-out-is-file", "run-out-is-file", "run-bad-steps", "measure-zero-positions",
                "report-trace-missing", "verify-capture-before-missing")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", BEFORE_TORCH)
def test_bad_paths_and_bounds_fail_before_torch_is_imported(tmp_path, name):
    args = CASES[name](tmp_path)
    code = ("import sys; from rookworld_debug.cli import main\n"
            f"try:\n    rc = main({args!r})\nexcept SystemExit as stop:\n    rc = stop.code\n"   # argparse's exit 2
            "print(rc, 'torch' in sys.modules)")
    r = subprocess.run([str(REPO / ".venv/bin/python"), "-c", code], cwd=tmp_path, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=80, env=ENV)
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr[-2000:])
    assert f"rookworld-debug {args[0]}: error:" in r.stderr, r.stderr[-2000:]


@pytest.mark.timeout(90)
def test_verify_capture_help_answers_without_torch():
    code = ("import sys; from rookworld_debug.cli import main\n"
            "try:\n    main(['verify-capture', '--help'])\nexcept SystemExit as stop:\n    rc = stop.code\n"
            "print(rc, 'torch' in sys.modules, file=sys.stderr)")
    r = subprocess.run([str(REPO / ".venv/bin/python"), "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=80, env=ENV)
    assert r.stderr.split()[-2:] == ["0", "False"], r.stderr[-2000:]
    assert "--before" in r.stdout and "verify-capture" in r.stdout
