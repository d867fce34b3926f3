"""The shipped notebooks: committed without outputs, a papermill `parameters` cell first, and each runs
headless via papermill on the embedded tiny model with small parameters; their summary.json is checked."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = ["01_grpo_step.ipynb", "02_tune_beta_temperature.ipynb"]
SMALL = dict(max_new_tokens=32, heldout_n=2, engine_depth=6, batch_size=2, num_generations=4)


def _read(name: str):
    return nbformat.read(NB_DIR / name, as_version=4)


# ------------------------------------------------------------------------- static checks (fast)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = _read(name)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.get("outputs") == [], f"{name} cell {i} has outputs (strip them before committing)"
            assert cell.get("execution_count") is None, f"{name} cell {i} has an execution count"
    assert "papermill" not in nb.metadata, f"{name} carries papermill metadata (an executed copy?)"
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_first_cell_is_the_parameters_cell(name):
    import papermill as pm
    nb = _read(name)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
    declared = pm.inspect_notebook(str(NB_DIR / name))
    for p in ("model", "seed", "batch_size", "num_generations", "beta", "temperature", "p_temperature",
              "a_temperature", "loss_type", "kl_estimator", "max_new_tokens", "engine_depth", "run_dir"):
        assert p in declared, f"{name}: parameter {p} not declared"
    assert declared["run_dir"]["default"] == "None"


def test_report_notebook_declares_every_sweep_parameter():
    import papermill as pm
    declared = pm.inspect_notebook(str(NB_DIR / "01_grpo_step.ipynb"))
    for p in ("dataset", "task", "top_p", "lr", "eval_max_new_tokens", "heldout_n", "reward_mode", "epsilon_low",
              "epsilon_high", "scale_rewards", "entropy_coef"):
        assert p in declared
    from rookworld_debug.config import StepConfig
    from rookworld_debug.notebook import config_from_params
    names = {k: None for k in declared}
    cfg = config_from_params(names)
    assert cfg == StepConfig()            # None everywhere = the defaults
    cfg = config_from_params({**names, "temperature": 0.7, "a_temperature": 0.9, "top_p": 0.8})
    assert (cfg.p_temperature, cfg.a_temperature, cfg.p_top_p, cfg.a_top_p) == (0.7, 0.9, 0.8, 0.8)


def test_every_shipped_notebook_validates_without_warnings():
    """Each cell has its own id (nbformat 4.5): papermill, nbconvert and `main` print no MissingIDFieldWarning."""
    import warnings
    for path in sorted(NB_DIR.glob("*.ipynb")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
        ids = [c.get("id") for c in nb.cells]
        assert all(ids) and len(set(ids)) == len(ids), (path.name, ids)


# ------------------------------------------------------------------------- papermill runs
def _execute(name: str, tmp: Path, **params) -> tuple[Path, dict, object]:
    import papermill as pm
    run_dir = tmp / "run"
    out = tmp / name
    env_before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        pm.execute_notebook(str(NB_DIR / name), str(out), parameters={**params, "run_dir": str(run_dir)},
                            kernel_name="python3", cwd=str(tmp), progress_bar=False, execution_timeout=900)
    finally:
        if env_before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
    summary = json.loads((run_dir / "summary.json").read_text())
    return run_dir, summary, nbformat.read(out, as_version=4)


def _outputs(nb, mime: str) -> list[str]:
    found = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            data = o.get("data", {})
            if mime in data:
                v = data[mime]
                found.append(v if isinstance(v, str) else json.dumps(v))
    return found


@pytest.fixture(scope="module")
def step_notebook(tmp_path_factory):
    # step 0 explicitly (the notebook's default debugs a drifted step: warm-up steps + μ = 2)
    return _execute("01_grpo_step.ipynb", tmp_path_factory.mktemp("nb01"), eval_max_new_tokens=32, warmup_steps=0,
                    num_iterations=1, **SMALL)


@pytest.fixture(scope="module")
def tune_notebook(tmp_path_factory):
    # 64 tokens: the trained tiny model's P: completions open with ~27 near-certain padding spaces (KL ≈ 0 there)
    # a drifted step: 1 warm-up step (entropy bonus on, so it moves even if every group had σ = 0), μ = 2
    return _execute("02_tune_beta_temperature.ipynb", tmp_path_factory.mktemp("nb02"),
                    warmup_steps=1, warmup_lr=1e-3, entropy_coef=0.005, num_iterations=2,
                    **{**SMALL, "max_new_tokens": 64})


def test_step_notebook_summary(step_notebook):
    run_dir, summary, nb = step_notebook
    for key in ("config", "provenance", "timings", "metrics", "invariants", "trace_path", "flags", "counts"):
        assert key in summary, key
    assert summary["config"]["max_new_tokens"] == 32 and summary["config"]["batch_size"] == 2
    for phase in ("baseline_eval", "generation", "rewards", "advantages", "loss", "update", "evaluation"):
        assert summary["timings"][phase] >= 0, phase
    m = summary["metrics"]
    for k in ("reward_before", "reward_after", "delta_reward", "rollout_reward", "loss", "pg_loss", "kl_loss", "kl",
              "grad_norm_pre_clip", "grad_norm_post_clip", "frac_reward_zero_std",
              "completions/mean_length", "format_valid", "clip_ratio/low_mean", "clip_ratio/high_mean"):
        assert isinstance(m[k], (int, float)) and math.isfinite(m[k]), (k, m.get(k))
    # the step-0 invariants: π = π_ref, on-policy ratio = 1 → KL 0, nothing clipped
    assert m["step0_invariants_ok"] is True and summary["invariants"]["ok"] is True
    assert summary["invariants"]["max_abs_logp_diff"] == 0.0 and summary["invariants"]["max_k3_kl"] == 0.0
    assert m["kl"] == 0.0 and m["clip_ratio/low_mean"] == 0.0 and m["clip_ratio/high_mean"] == 0.0
    # never a ~100% KL share where the PG value is structurally 0 (metrics.term_balance; NaN is written as 'NaN')
    assert m["kl_share"] == "NaN" or (abs(m["pg_loss"]) > 1e-9 and 0.0 <= m["kl_share"] <= 1.0)
    assert m["kl_grad_share"] == "NaN" or 0.0 <= m["kl_grad_share"] <= 1.0
    from rookworld_debug import StepTrace
    trace = StepTrace.load(summary["trace_path"])
    assert trace.summary()["loss"] == pytest.approx(m["loss"])


def test_step_notebook_rendered_the_views(step_notebook):
    _, _, nb = step_notebook
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    html = "\n".join(_outputs(nb, "text/html"))
    assert len(_outputs(nb, "application/vnd.plotly.v1+json")) >= 5
    for cls in ("rw-strips", "rw-board", "rw-banner"):
        assert cls in html, cls
    assert "Step-0 invariants" in html and "kl_estimator" in "\n".join(_outputs(nb, "text/markdown"))
    assert "rwd-iterations" in html and "rwd-loss-types" in html  # Phase 5b: passes + loss-type comparison


def test_tune_notebook_summary(tune_notebook):
    _, summary, nb = tune_notebook
    m = summary["metrics"]
    assert m["step0_invariants_ok"] is True
    for k in ("loss", "kl", "recompute_ms", "loss_for_ms"):
        assert isinstance(m[k], (int, float)) and math.isfinite(m[k]), k
    # pass 2 is off-policy (r ≠ 1): there the loss-value share means something; at sampling time it is NaN, not 100%
    assert m["on_policy"] is False and 0.0 <= m["kl_share"] < 1.0
    assert summary["drift"]["moved"] and m["kl"] > 0               # a real drifted start: β matters
    assert m["passes"] == 2 and m["iteration"] == 1                 # the panel shows pass 2 (r ≠ 1)
    assert m["recompute_ms"] < 1000, "a loss-knob recompute must take well under a second"
    assert "application/vnd.jupyter.widget-view+json" in json.dumps([c.get("outputs") for c in nb.cells])


# ------------------------------------------------------------------------- every notebook on its defaults
ALL_NOTEBOOKS = [pytest.param("01_grpo_step.ipynb", marks=pytest.mark.slow),   # ~80 s: the main job's step
                 "02_tune_beta_temperature.ipynb", "03_multi_step.ipynb", "04_run_triage.ipynb",
                 pytest.param("05_whatif.ipynb", marks=pytest.mark.slow)]     # k-step arms: minutes


def test_the_defaults_test_covers_every_shipped_notebook():
    names = {p.values[0] if hasattr(p, "values") else p for p in ALL_NOTEBOOKS}
    assert names == {p.name for p in NB_DIR.glob("*.ipynb")}


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_every_notebook_runs_all_on_its_defaults(name, tmp_path, monkeypatch, request):
    """What a new user does: open the notebook and "Run all", no parameter changed (papermill injects none)."""
    import papermill as pm
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ROOKWORLD_DEBUG_CACHE", str(tmp_path / "cache"))   # 04 triages the demo run it finds here
    if name.startswith("04"):        # the demo run `trl-demo` made for this session (built once, a copy of its own)
        shutil.copytree(request.getfixturevalue("trl_demo_run"), tmp_path / "cache" / "trl-demo")
    out = tmp_path / name
    pm.execute_notebook(str(NB_DIR / name), str(out), kernel_name="python3", cwd=str(tmp_path), progress_bar=False,
                        execution_timeout=900)
    nb = nbformat.read(out, as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if name.startswith("04"):
        text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
        assert "triaging the TRL demo run" in text and "firings" in text
        assert _outputs(nb, "application/vnd.plotly.v1+json") and "rw-flagged" in "\n".join(_outputs(nb, "text/html"))
