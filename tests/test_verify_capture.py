"""`rookworld-debug verify-capture` on a real TRL run with save_steps=1 (embedded tiny model): the
captured step replayed from checkpoint N−1 reproduces checkpoint N (exit 0); paired with the wrong
checkpoints it fails (exit 1) naming the layers. Run as a user runs it: subprocess, stdin closed, timeout."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def run(trl_checkpointed_run):
    return trl_checkpointed_run


def _verify(run, step, before, after):
    return subprocess.run([CLI, "verify-capture", str(run / "captures" / f"step-{step:06d}"), "--before",
                           str(run / "run" / f"checkpoint-{before}"), "--after", str(run / "run" / f"checkpoint-{after}")],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240, env=ENV)


@pytest.mark.parametrize("step", [2, 3])
def test_the_captured_step_reproduces_its_checkpoint(run, step):
    r = _verify(run, step, step - 1, step)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "VERIFIED" in r.stdout and "NOT VERIFIED" not in r.stdout
    import re
    replayed, captured = map(float, re.search(r"clipping: replayed ([\d.e+-]+), captured ([\d.e+-]+)", r.stdout).groups())
    assert abs(replayed - captured) <= 1e-4 * captured          # the replayed gradient is TRL's


def test_wrong_checkpoints_fail_naming_the_layers(run):
    r = _verify(run, 3, 1, 2)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "NOT VERIFIED" in r.stdout and "worst: " in r.stdout and "FAIL" in r.stdout
    assert "not the captured step 3" in r.stdout


def test_bad_folders_are_one_line_exit_2(run, tmp_path):
    r = subprocess.run([CLI, "verify-capture", str(run / "captures" / "step-000002"), "--before", str(tmp_path),
                        "--after", str(run / "run" / "checkpoint-2")], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and "rookworld-debug verify-capture: error:" in r.stderr and "Traceback" not in r.stderr


def _verify_args(run, *extra, before=None, after=None, step=3):
    return subprocess.run([CLI, "verify-capture", str(run / "captures" / f"step-{step:06d}"), "--before",
                           str(before or run / "run" / f"checkpoint-{step - 1}"), "--after",
                           str(after or run / "run" / f"checkpoint-{step}"), *extra],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240, env=ENV)


def _one_line_exit_2(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("rookworld-debug verify-capture: error:") and "Traceback" not in r.stderr
    for w in words:
        assert w in last, (w, last)


@pytest.mark.parametrize("args,word", [(("--rtol", "nan"), "--rtol"), (("--rtol", "-0.1"), "--rtol"),
                                       (("--rtol", "inf"), "--rtol"), (("--threads", "0"), "--threads"),
                                       (("--threads", "-3"), "--threads")])
def test_tolerance_and_threads_out_of_range_are_named(run, args, word):
    _one_line_exit_2(_verify_args(run, *args), word)


def test_checkpoints_of_another_model_are_named(run, tmp_path):
    import shutil

    from transformers import GPT2Config, GPT2LMHeadModel
    other = tmp_path / "other"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=1, vocab_size=64, n_positions=64)).save_pretrained(other)
    shutil.copy(run / "run" / "checkpoint-2" / "optimizer.pt", other / "optimizer.pt")
    _one_line_exit_2(_verify_args(run, before=other), "CheckpointError", "another model")
    _one_line_exit_2(_verify_args(run, after=other), "CheckpointError", "--after")


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "config.json"])
def test_corrupted_checkpoint_files_are_named(run, tmp_path, name):
    import shutil
    bad = tmp_path / "checkpoint-2"
    shutil.copytree(run / "run" / "checkpoint-2", bad)
    data = (bad / name).read_bytes()
    (bad / name).write_bytes(data[: len(data) // 3] + b"\x00corrupt")
    _one_line_exit_2(_verify_args(run, before=bad), "CheckpointError")


def test_corrupted_capture_is_named(run, tmp_path):
    import shutil
    bad = tmp_path / "captures" / "step-000003"
    shutil.copytree(run / "captures" / "step-000003", bad)
    data = (bad / "trace.safetensors").read_bytes()
    (bad / "trace.safetensors").write_bytes(data[:100])
    r = subprocess.run([CLI, "verify-capture", str(bad), "--before", str(run / "run" / "checkpoint-2"), "--after",
                        str(run / "run" / "checkpoint-3")], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=240, env=ENV)
    _one_line_exit_2(r, "TraceError")
