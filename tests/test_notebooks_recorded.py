"""Notebooks 01, 02 and 05 opened on a step that another writer recorded: the step of each example trainer
(examples/manual_loop.py, mini_loop.py, ppo_epochs_loop.py: the user's own loop, through StepRecorder) and a TRL
capture kept with its weights run through every cell; where the writer recorded less than run_step (no step-0
invariants, no greedy evaluation, no inner iterations) the cell says so in place instead of a traceback. On a
recorded faulty step, notebook 01 shows the findings `rookworld-debug diagnose` prints for that folder and the
"What the fix changes" card with the verdict `whatif --fix` prints; notebook 05 shows the same card."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from cli import run_cli

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
WRITER = "the training loop 'manual loop example' (recorded through StepRecorder)"
EXAMPLES = {"manual_loop": [], "mini_loop": [], "ppo_epochs_loop": []}
NOTEBOOKS = ("01_grpo_step.ipynb", "02_tune_beta_temperature.ipynb", "05_whatif.ipynb")


def _example_step(name: str, folder: Path) -> Path:
    out = folder / name / "step"
    r = subprocess.run([sys.executable, str(REPO / "examples" / f"{name}.py"), "--out", str(out),
                        *EXAMPLES[name]], cwd=folder, env=ENV, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def _trl_capture(folder: Path) -> Path:
    """Step 2 of a 2-step TRL GRPOTrainer run of the tiny model, captured with its weights."""
    import torch
    torch.set_num_threads(1)
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer
    trainer = make_trainer(folder / "run", max_steps=2, max_completion_length=48)
    cap = capture_steps(trainer, steps=[2], out_dir=folder / "captures", keep_weights=True)
    trainer.train()
    assert cap.errors == {} and sorted(cap.paths) == [2]
    return Path(cap.paths[2])


def _faulty_step(folder: Path) -> Path:
    """A step of the hand-written loop whose KL term enters with −β (a sign bug in its loss)."""
    from rookworld_debug.lab.handloop import LoopConfig, run
    out = folder / "kl_sign" / "step"
    run(LoopConfig(max_new_tokens=64), out=str(out), fault="loss_kl_sign")
    return out


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict:
    """{writer: its recorded step folder}, each made once for the module."""
    made: dict = {}

    def get(writer: str) -> Path:
        if writer not in made:
            base = tmp_path_factory.mktemp(writer)
            made[writer] = _trl_capture(base) if writer == "trl_capture" else _faulty_step(base) \
                if writer == "faulty" else _example_step(writer, base)
        return made[writer]
    return get


def _run(name: str, step: Path, tmp_path: Path) -> list[str]:
    """The notebook executed on `step`; every text and HTML it showed, by code cell."""
    import papermill as pm
    out = tmp_path / name
    key = "path" if name.startswith("05") else "trace_path"
    pm.execute_notebook(str(REPO / "notebooks" / name), str(out), parameters={key: str(step),
                        "run_dir": str(tmp_path)}, kernel_name="python3", progress_bar=False, execution_timeout=900,
                        cwd=str(tmp_path))
    nb = nbformat.read(out, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, [(e.get("ename"), e.get("evalue")) for e in errors]
    return ["".join(o.get("text", "") + (o.get("data") or {}).get("text/html", "") +
                    (o.get("data") or {}).get("text/plain", "") for o in c.get("outputs", []))
            for c in nb.cells if c.cell_type == "code"]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("writer", [*EXAMPLES, "trl_capture"])
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_every_notebook_runs_on_a_step_of_each_writer(writer, notebook, steps, tmp_path):
    printed = "\n".join(_run(notebook, steps(writer), tmp_path))
    if notebook.startswith("01"):             # what the writer did not record is said, not faked
        assert "no greedy before/after evaluation and no step-0 invariants" in printed
    if notebook.startswith("02"):
        assert "step-0 invariants: not recorded" in printed or "TRL capture" in printed
    if notebook.startswith("05"):             # no branches of another writer's loop: the fix comparison instead
        assert "a step recorded by another writer has none" in printed
        assert "What the fix changes" in printed
    if writer == "manual_loop" and notebook.startswith("01"):
        assert f"no inner iterations recorded: {WRITER} records none" in printed


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_notebook_01_on_a_faulty_step_shows_diagnose_s_findings_and_what_the_fix_changes(steps, tmp_path):
    step = steps("faulty")
    r = run_cli("diagnose", step, "--json", timeout=900)
    assert r.returncode == 1, r.stderr[-2000:]
    want = [f["code"] for f in json.loads(r.stdout)["findings"] if f.get("code") != "phase_note"][:5]
    cells = _run("01_grpo_step.ipynb", step, tmp_path)
    card = next(t for t in cells if 'class="rw-diagnosis"' in t)
    assert re.findall(r'data-code="([a-z_0-9]+)"', card) == want
    fix = json.loads(run_cli("whatif", step, "--fix", "--json", timeout=900).stdout)
    shown = next(t for t in cells if 'class="rw-fix"' in t)
    assert fix["verdict"].split(";")[0] in shown.replace("&#x27;", "'")
    (tmp_path / "05").mkdir()
    five = "\n".join(_run("05_whatif.ipynb", step, tmp_path / "05"))
    assert 'class="rw-fix"' in five and fix["verdict"].split(";")[0] in five.replace("&#x27;", "'")
