"""Notebooks 01 and 02 opened on a step that another writer recorded: the step of examples/manual_loop.py (the
user's own loop, through StepRecorder) runs through every cell, and where the writer recorded less than run_step
(no step-0 invariants, no inner iterations) the cell says so in place, naming the writer, instead of a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
WRITER = "the training loop 'manual loop example' (recorded through StepRecorder)"


@pytest.fixture(scope="module")
def manual_step(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("manual") / "step-2"
    r = subprocess.run([sys.executable, str(REPO / "examples" / "manual_loop.py"), "--out", str(out)], cwd=out.parent,
                       env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def _run(name: str, step: Path, tmp_path: Path) -> list[str]:
    """The notebook executed on `step`; every text it printed, by cell."""
    import papermill as pm
    out = tmp_path / name
    pm.execute_notebook(str(REPO / "notebooks" / name), str(out), parameters={"trace_path": str(step),
                        "run_dir": str(tmp_path)}, kernel_name="python3", progress_bar=False, execution_timeout=600,
                        cwd=str(tmp_path))
    nb = nbformat.read(out, as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    return ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells if c.cell_type == "code"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_step_notebook_on_a_step_of_your_own_loop(manual_step, tmp_path):
    printed = _run("01_grpo_step.ipynb", manual_step, tmp_path)
    assert any(f"no inner iterations recorded: {WRITER} records none" in t for t in printed), printed
    assert any("no greedy before/after evaluation and no step-0 invariants" in t for t in printed)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tune_notebook_on_a_step_of_your_own_loop(manual_step, tmp_path):
    printed = _run("02_tune_beta_temperature.ipynb", manual_step, tmp_path)
    assert any(f"step-0 invariants: not recorded: {WRITER} checks none" in t for t in printed), printed
    assert not any("a TRL capture" in t for t in printed)
