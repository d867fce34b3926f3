"""Issue 26: a 2-process CPU run (torchrun, accelerate MULTI_CPU, gloo) of TRL's GRPOTrainer on the tiny model,
launched as a user launches it (subprocess, stdin closed, timeout). For every captured step: the captured loss
equals TRL's logged loss, every row of the global batch is present exactly once (in generation order: our
advantages from the gathered rewards equal TRL's), and the weights are bit-identical with and without capture."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    for mode in ("capture", "plain"):
        r = subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--master_port", str(29500 + os.getpid() % 1000),
                            str(REPO / "tests" / "ddp_capture_worker.py"), str(out), mode],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV, cwd=out)
        assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads((out / "capture.json").read_text())


def test_two_processes_every_captured_step_is_the_global_batch(ddp):
    from rookworld_debug import StepTrace
    out, res = ddp
    assert res["world"] == 2 and res["errors"] == {}
    assert {"2", "3"} <= set(res["paths"])
    for step, path in res["paths"].items():
        tr = StepTrace.load(path)
        cap = tr.capture
        assert abs(cap.trl_loss - res["logged"][step]) <= 1e-5, (step, cap.trl_loss, res["logged"][step])
        assert cap.loss_recompute_diff <= 1e-5
        assert tr.setup.provenance["num_processes"] == 2 and tr.setup.provenance["rows_per_process"] == [8, 8]
        rows = sorted(r for mb in cap.micro_batch_rows for r in mb)
        assert rows == list(range(16)) == list(range(tr.rollout.completion_ids.shape[0]))    # each row once
        assert cap.advantages_recompute_diff <= 1e-5        # our group advantages over the gathered batch = TRL's
    index = json.loads((Path(res["paths"]["2"]).parent / "captures.json").read_text())
    assert {e["step"] for e in index["captures"]} >= {2, 3}


def test_weights_bit_identical_with_and_without_capture(ddp):
    out, _ = ddp
    assert torch.equal(torch.load(out / "capture-weights.pt"), torch.load(out / "plain-weights.pt"))
