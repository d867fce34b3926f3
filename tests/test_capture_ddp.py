"""A 2-process CPU run (torchrun, accelerate MULTI_CPU, gloo) of TRL's GRPOTrainer on the tiny model,
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


@pytest.fixture(scope="module")
def ddp_spg(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-spg")
    r = subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--master_port", str(28500 + os.getpid() % 1000),
                        str(REPO / "tests" / "ddp_capture_worker.py"), str(out), "spg"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV, cwd=out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads((out / "spg.json").read_text())


@pytest.mark.slow              # ~25 s more torchrun; the single-process spg tests (test_trl_capture) stay default
def test_two_processes_steps_per_generation_above_grad_accumulation(ddp_spg):
    """2 ranks × 16 local rows = one 32-row generation batch feeding 2 optimizer steps (4 = spg > ga = 2): each
    step's loss equals TRL's, each step trains 16 distinct rows (8 per rank), and the two steps cover all 32."""
    from rookworld_debug import StepTrace
    out, res = ddp_spg
    assert res["errors"] == {} and set(res["paths"]) == {"1", "2"}
    seen = []
    for step, path in res["paths"].items():
        tr = StepTrace.load(path)
        cap = tr.capture
        assert abs(cap.trl_loss - res["logged"][step]) <= 1e-5 and cap.loss_recompute_diff <= 1e-5
        assert tr.rollout.completion_ids.shape[0] == 32 and tr.setup.provenance["rows_per_process"] == [16, 16]
        rows = [r for mb in cap.micro_batch_rows for r in mb]
        assert len(rows) == len(set(rows)) == 16
        assert cap.advantages_recompute_diff <= 1e-5
        seen += rows
    assert sorted(seen) == list(range(32))


def test_notebook_views_and_panel_open_a_multi_process_capture(ddp):
    """What notebooks 01/02 call on a capture works on a multi-process capture (report --trace renders the same
    notebook: tests/test_trl_capture.py and the slow test below; the spg capture: the slow test)."""
    from rookworld_debug import StepTrace, viz
    from rookworld_debug.widgets import tune_panel_from_trace
    for res in (ddp[1],):
        tr = StepTrace.load(next(iter(res["paths"].values())))
        assert len(viz.advantage_table_from_trace(tr).data) == tr.rollout.completion_ids.shape[0]
        assert viz.capture_table_from_trace(tr).html and viz.loss_waterfall_from_trace(tr) is not None
        panel = tune_panel_from_trace(tr)
        assert float(panel.loss.loss) == pytest.approx(float(tr.loss.loss), abs=1e-6)


@pytest.mark.slow
def test_report_trace_renders_multi_process_captures(ddp, ddp_spg, tmp_path):
    for i, res in enumerate((ddp[1], ddp_spg[1])):
        path = next(iter(res["paths"].values()))
        r = subprocess.run([sys.executable, "-m", "rookworld_debug.cli", "report", "--trace", path,
                            "--out", str(tmp_path / f"r{i}")], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=600, env=ENV)
        assert r.returncode == 0, r.stderr[-3000:]
        assert list((tmp_path / f"r{i}").rglob("report.html"))
