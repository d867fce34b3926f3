"""Notebook 05 (what if): stored without outputs, a papermill parameters cell first, runnable headless."""
from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

NB = Path(__file__).resolve().parents[1] / "notebooks" / "05_whatif.ipynb"


def test_stored_without_outputs_parameters_first():
    import papermill as pm
    nb = nbformat.read(NB, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.get("outputs") == [] and c.get("execution_count") is None
    assert "parameters" in nb.cells[0].metadata.get("tags", []) and "papermill" not in nb.metadata
    declared = pm.inspect_notebook(str(NB))
    for p in ("run_dir", "path", "before", "arms", "steps", "seeds", "symptoms", "model"):
        assert p in declared


def _run(tmp_path, **params):
    import papermill as pm
    os.environ["HF_HUB_OFFLINE"] = "1"
    out = tmp_path / "05.ipynb"
    pm.execute_notebook(str(NB), str(out), parameters={**params, "run_dir": str(tmp_path / "run")},
                        kernel_name="python3", cwd=str(tmp_path), progress_bar=False, execution_timeout=900)
    return json.loads((tmp_path / "run" / "summary.json").read_text()), nbformat.read(out, as_version=4)


def test_one_step_runs_headless(tmp_path):
    summary, nb = _run(tmp_path, steps=0, arms=[{"lr": 1e-4}], max_new_tokens=24, eval_max_new_tokens=24)
    assert summary["self_check"] is True and summary["arms"] == ["unchanged", "lr=0.0001"]
    html = [o["data"]["text/html"] for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert any("One step on the recorded rollout" in h for h in html)


@pytest.mark.slow
def test_defaults_run_headless(tmp_path):
    summary, _ = _run(tmp_path)
    assert summary["self_check"] is True and len(summary["arms"]) == 3 and summary["verdicts"]
