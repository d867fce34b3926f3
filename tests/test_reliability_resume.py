"""`train-tiny --resume` reads its state with weights_only=True: a real checkpoint resumes; a state file that
would run code when unpickled, or holds the wrong things, is one line and exit 2, and runs nothing."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--n-layer", "1", "--n-embd", "16", "--n-head", "1", "--n-positions", "256", "--batch-size", "2",
             "--threads", "1", "--a-fraction", "0", "--m-order", "sorted"]


def _cli(args, cwd, timeout=110):
    cmd = [str(REPO / ".venv/bin/rookworld-debug"), "train-tiny", *args]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})


class _Canary:
    """Unpickling this object would create the canary file (what a hostile state file does)."""
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from test_train_tiny import _data_lines
    tmp = tmp_path_factory.mktemp("tt")
    data = tmp / "d.jsonl"
    data.write_text("\n".join(_data_lines(4, with_a=False)))
    out = tmp / "run"
    r = _cli(["--out", str(out), "--data", str(data), "--steps", "3", "--checkpoint-every", "1", *TINY_ARGS], tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "checkpoint" / "trainer_state.pt").is_file()
    return tmp, data, out / "checkpoint"


@pytest.mark.timeout(240)
def test_resume_continues_from_a_real_checkpoint(checkpoint):
    tmp, data, ck = checkpoint
    r = _cli(["--out", str(tmp / "resumed"), "--data", str(data), "--steps", "4", "--resume", str(ck), *TINY_ARGS], tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (tmp / "resumed" / "train_log.txt").read_text()
    assert "resumed from" in log and "at step 3" in log
    assert json.loads((tmp / "resumed" / "training_args.json").read_text())["final_step"] == 3


@pytest.mark.timeout(240)
@pytest.mark.parametrize("payload", ["pickle", "not_a_dict", "wrong_types", "garbage"])
def test_hostile_or_wrong_state_file_is_one_line_exit_2_and_runs_nothing(checkpoint, tmp_path, payload):
    import shutil
    tmp, data, ck = checkpoint
    bad = tmp_path / "ck"
    shutil.copytree(ck, bad)
    canary = tmp_path / "CANARY"
    state = bad / "trainer_state.pt"
    if payload == "pickle":
        real = torch.load(ck / "trainer_state.pt", weights_only=True)
        torch.save({**real, "ema": _Canary(canary)}, state)
    elif payload == "not_a_dict":
        torch.save([1, 2, 3], state)
    elif payload == "wrong_types":
        real = torch.load(ck / "trainer_state.pt", weights_only=True)
        torch.save({**real, "step": "three", "rng": [1]}, state)
    else:
        state.write_bytes(pickle.dumps({"a": 1})[:7] + b"\x00garbage")
    r = _cli(["--out", str(tmp_path / "out"), "--data", str(data), "--steps", "4", "--resume", str(bad), *TINY_ARGS],
             tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip().splitlines()
    assert err[-1].startswith("rookworld-debug train-tiny: error: CheckpointError:") and "trainer_state.pt" in err[-1]
    assert "Traceback" not in r.stderr
    assert not canary.exists(), "the state file's pickle ran code"
