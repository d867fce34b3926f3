"""A real TRL GRPOTrainer run (embedded tiny model, the project's reward functions, 3 steps) with
the capture on steps 1 and 3. Oracles: TRL's own logs (Trainer log_history, GRPOTrainer's completion log
buffers snapshotted by a test callback at each step end) and a second run of the same seed WITHOUT the
capture (weights must be bit-identical)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
STEPS, CAPTURED = 3, (1, 3)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                                        "ignore::DeprecationWarning")


def _weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    from transformers import TrainerCallback

    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer

    class TRLLogs(TrainerCallback):
        """The oracle: what GRPOTrainer itself logged for each step's generation batch (generation order)."""
        def __init__(self, trainer):
            self.trainer, self.by_step = trainer, {}

        def on_step_end(self, args, state, control, **kw):
            logs = self.trainer._logs
            self.by_step[state.global_step] = {"advantages": list(logs["advantages"]),
                                               "prompt": list(logs["prompt"]), "completion": list(logs["completion"]),
                                               "rewards": {k: list(v) for k, v in logs["rewards"].items()}}

    out = tmp_path_factory.mktemp("trl")
    trainer = make_trainer(out / "a", max_steps=STEPS, max_completion_length=48)   # short budget: fast
    oracle = TRLLogs(trainer)
    trainer.add_callback(oracle)
    cap = capture_steps(trainer, CAPTURED, out / "captures")
    trainer.train()
    plain = make_trainer(out / "b", max_steps=STEPS, max_completion_length=48)       # same seed, no capture
    plain.train()
    return {"trainer": trainer, "cap": cap, "oracle": oracle.by_step, "out": out,
            "logged": {d["step"]: d for d in trainer.state.log_history if "loss" in d},
            "plain_logged": {d["step"]: d for d in plain.state.log_history if "loss" in d},
            "w": _weights(trainer), "w_plain": _weights(plain)}


@pytest.fixture(scope="module")
def traces(runs):
    from rookworld_debug import StepTrace
    assert runs["cap"].errors == {}
    assert sorted(runs["cap"].paths) == list(CAPTURED)
    return {s: StepTrace.load(p) for s, p in runs["cap"].paths.items()}


# ------------------------------------------------------------------------------- acceptance
def test_captured_loss_equals_trl_logged_loss(runs, traces):
    for s, tr in traces.items():
        logged = runs["logged"][s]["loss"]
        assert abs(float(tr.loss.loss) - logged) <= 1e-5, (s, float(tr.loss.loss), logged)
        assert abs(tr.capture.trl_loss - logged) <= 1e-6          # what compute_loss returned, summed
        assert tr.capture.logged_metrics["loss"] == logged
        assert abs(tr.update.grad_norm_pre_clip - runs["logged"][s]["grad_norm"]) <= 1e-6
    # the record is not trivially zero: a β·KL term at step 3 (policy moved), a non-zero gradient
    assert traces[3].loss.kl > 0 and float(traces[3].loss.kl_loss) > 0
    assert traces[1].update.grad_norm_pre_clip > 0


def test_captured_advantages_and_rewards_equal_trl(runs, traces):
    for s, tr in traces.items():
        trl = runs["oracle"][s]
        assert torch.equal(tr.advantages.advantages, torch.tensor(trl["advantages"], dtype=torch.float32))
        assert list(tr.rollout.prompts) == trl["prompt"] and list(tr.rollout.completions) == trl["completion"]
        for k, name in enumerate(tr.rewards.func_names):
            got = tr.rewards.rewards_per_func[:, k].tolist()
            want = trl["rewards"][name]
            assert all((math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, abs=1e-7)
                       for a, b in zip(got, want))
    # the batch is not degenerate: some group has reward spread, so some advantage is non-zero
    assert any(bool((tr.advantages.advantages != 0).any()) for tr in traces.values())


def test_weights_bit_identical_with_and_without_capture(runs):
    assert runs["w"].shape == runs["w_plain"].shape
    assert torch.equal(runs["w"], runs["w_plain"])
    # and training did move the weights (so equality is not vacuous): TRL logged a non-zero gradient
    assert any(d["grad_norm"] > 0 for d in runs["plain_logged"].values())
    assert runs["logged"][2]["loss"] == runs["plain_logged"][2]["loss"]


def test_capture_cost_reported_and_zero_for_uncaptured_steps(runs, traces):
    table = {row["step"]: row for row in runs["cap"].cost_table()}
    assert sorted(table) == list(range(1, STEPS + 1))
    assert table[2] == {"step": 2, "seconds": 0.0, "bytes": 0, "captured": False}
    for s in CAPTURED:
        assert table[s]["captured"] and table[s]["seconds"] > 0 and table[s]["bytes"] > 0
        assert traces[s].capture.capture_seconds == pytest.approx(table[s]["seconds"])
        assert traces[s].capture.capture_bytes == table[s]["bytes"]


# ------------------------------------------------------------------------------- what the record holds
def test_record_contents(runs, traces):
    import trl
    import transformers
    from trl import GRPOConfig
    tr = traces[3]
    cap, ro = tr.capture, tr.rollout
    n, t = ro.completion_ids.shape
    assert n == 8 and tr.config.num_generations == 4 and tr.config.batch_size == 2
    assert set(ro.tasks) == {"A", "P"} and tr.config.task == "mixed"
    for x in (ro.per_token_logps, ro.ref_per_token_logps, ro.per_token_entropy, ro.completion_mask):
        assert x.shape == (n, t)
    assert cap.old_per_token_logps is None                      # μ = 1: TRL used ℓ.detach()
    assert (cap.trl_version, cap.transformers_version) == (trl.__version__, transformers.__version__)
    assert tr.setup.provenance["weights_sha256"] and tr.setup.provenance["model"].endswith("tiny")
    assert cap.logged_metrics["reward"] == pytest.approx(tr.rewards.metrics["reward"], abs=1e-6)
    assert cap.step_metrics["kl"] and cap.reward_func_names == ("rookworld_p", "rookworld_a")
    # GRPOConfig → StepConfig: mapped fields, the rest verbatim
    assert (tr.config.beta, tr.config.lr, tr.config.max_new_tokens) == (0.1, 1e-5, 48)
    assert cap.unmapped["logging_steps"] == 1 and "beta" not in cap.unmapped
    assert set(cap.grpo_config) == set(GRPOConfig(output_dir="x", use_cpu=True, bf16=False).to_dict())
    # per-component rewards of the project's reward functions, consistent with the values TRL got
    assert {"board", "best"} <= set(tr.rewards.components)
    totals = [b.total for b in tr.rewards.breakdowns]
    assert totals == pytest.approx(tr.rewards.rewards.tolist(), abs=1e-6)
    assert any("no greedy before/after evaluation" in f for f in tr.flags)
    assert tr.before is None and tr.evaluation is None and tr.setup.invariants is None


def test_views_render_a_capture(traces):
    from rookworld_debug import viz
    from rookworld_debug.notebook import summary_record
    from rookworld_debug.steplog import format_step_log
    tr = traces[3]
    assert "optimizer step <b>3</b>" in viz.capture_table_from_trace(tr).html
    assert "not recorded" in format_step_log(tr)
    viz.executive_summary_from_trace(tr)
    for m in ("logp", "ref_logp", "entropy", "kl", "ratio", "pg"):
        viz.token_strips_from_trace(tr, m, rows=[0, 1])
    viz.advantage_table_from_trace(tr).to_html()
    viz.grad_norms_from_trace(tr)
    viz.loss_waterfall_from_trace(tr)
    rec = summary_record(tr)
    assert rec["invariants"] is None and rec["trl_capture"]["global_step"] == 3
    json.dumps(rec, default=str)


def test_panel_recomputes_a_capture_for_a_new_beta(traces):
    from rookworld_debug.grpo.step import loss_for
    from rookworld_debug.widgets import tune_panel_from_trace
    tr = traces[3]
    panel = tune_panel_from_trace(tr)
    assert float(panel.loss.loss) == pytest.approx(tr.capture.logged_metrics["loss"], abs=1e-5)
    assert torch.equal(panel.state.advantages.advantages, tr.advantages.advantages)   # TRL's, kept
    assert panel.w_regen.disabled
    new = panel.set_loss_params(beta=0.5)
    want = loss_for(tr.rollout, tr.advantages, tr.config.replace(beta=0.5))
    assert float(new.loss) == float(want.loss)
    assert float(new.kl_loss) == pytest.approx(5 * float(tr.loss.kl_loss), rel=1e-5)
    assert float(new.loss) != pytest.approx(float(tr.loss.loss), abs=1e-6)


def test_off_policy_capture_micro_batches_and_reused_batch(tmp_path):
    """num_iterations = 2 and 2 micro-batches: step 2 reuses step 1's (shuffled) batch, so TRL stores old
    log-probs and the ratio moves off 1; the record, its recompute and the panel must still match TRL."""
    from rookworld_debug import StepTrace
    from rookworld_debug.trl.example import run
    from rookworld_debug.widgets import tune_panel_from_trace
    trainer, cap = run(tmp_path, steps=2, capture=(2,), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                       num_iterations=2, loss_type="grpo")
    logged = {d["step"]: d for d in trainer.state.log_history if "loss" in d}
    tr = StepTrace.load(cap.paths[2])
    c = tr.capture
    assert c.generation_step == 1 and c.old_per_token_logps is not None and len(c.micro_batch_rows) == 2
    assert sorted(r for rows in c.micro_batch_rows for r in rows) == list(range(8))
    assert abs(float(tr.loss.loss) - logged[2]["loss"]) <= 1e-5 and c.loss_recompute_diff <= 1e-5
    assert not bool((tr.loss.per_token_ratio[tr.rollout.completion_mask.bool()] == 1).all())   # off-policy
    assert tr.loss.metrics["clip_ratio/region_mean"] == pytest.approx(logged[2]["clip_ratio/region_mean"], abs=1e-7)
    # the batch was copied during step 1 but is charged to step 2, the captured step it feeds
    costs = {r["step"]: r for r in cap.cost_table()}
    assert costs[1]["seconds"] == 0.0 and costs[1]["bytes"] == 0 and costs[2]["bytes"] > 0
    panel = tune_panel_from_trace(tr)                          # recompute with the stored old log-probs
    assert float(panel.loss.loss) == pytest.approx(logged[2]["loss"], abs=1e-5)


@pytest.mark.parametrize("spg, ga, loss_type", [(4, 2, "dapo"), (1, 2, "grpo")])
def test_steps_per_generation_other_than_grad_accumulation(tmp_path, spg, ga, loss_type):
    """steps_per_generation ≠ gradient_accumulation_steps. spg > ga: one generation batch feeds spg/ga optimizer
    steps (each trains a shuffled slice); spg < ga: one step reads ga/spg generation batches. Every step of the
    cycle is captured, its loss equals TRL's logged loss, and each row it trained appears exactly once."""
    from rookworld_debug import StepTrace
    from rookworld_debug.trl.example import run
    from rookworld_debug.widgets import tune_panel_from_trace
    trainer, cap = run(tmp_path, steps=2, capture=(1, 2), per_device_train_batch_size=4, num_generations=4,
                       gradient_accumulation_steps=ga, steps_per_generation=spg, loss_type=loss_type,
                       logging_steps=1)
    logged = {d["step"]: d for d in trainer.state.log_history if "loss" in d}
    assert not cap.errors and sorted(cap.paths) == [1, 2]
    rows_seen = []
    for step in (1, 2):
        tr = StepTrace.load(cap.paths[step])
        c = tr.capture
        assert c.steps_per_generation == spg and c.gradient_accumulation_steps == ga
        assert abs(c.trl_loss - logged[step]["loss"]) <= 1e-5 and c.loss_recompute_diff <= 1e-5
        step_rows = sorted(r for rows in c.micro_batch_rows for r in rows)
        assert len(step_rows) == len(set(step_rows)) == 4 * ga                 # ga micro-batches of 4 rows
        n = tr.rollout.completion_ids.shape[0]
        if spg > ga:                                  # the whole generation batch, this step's slice marked
            assert n == 4 * spg and any("trained 8 of the generation batch's 16 rows" in f for f in tr.flags)
            rows_seen += step_rows
            # the headline loss is the step's: its rows only (the rest of the batch is context, mask 0)
            assert abs(float(tr.loss.loss) - logged[step]["loss"]) <= 1e-5
            assert abs(tr.summary()["loss"] - logged[step]["loss"]) <= 1e-5
            trained_rows = tr.loss.completion_mask.sum(1) > 0
            assert sorted(torch.nonzero(trained_rows).flatten().tolist()) == sorted(
                r for r in step_rows if tr.rollout.completion_mask[r].sum() > 0)
            assert float(tr.loss.per_seq_loss.sum()) == pytest.approx(float(tr.loss.loss), abs=1e-6)
            assert float(tr.loss.per_seq_loss[~trained_rows].abs().sum()) == 0.0
        else:                                         # ga/spg generation batches stacked: every row trained
            assert n == 4 * ga and step_rows == list(range(n))
            assert any("read 2 generation batches" in f for f in tr.flags)
        assert c.advantages_recompute_diff <= 1e-5
        panel = tune_panel_from_trace(tr)                              # notebook 02 opens it
        if spg > ga:                                  # the panel recomputes over the whole generation batch, and says so
            from rookworld_debug.grpo.step import loss_for
            whole = loss_for(tr.rollout, tr.advantages, tr.config, old_per_token_logps=c.old_per_token_logps)
            assert float(panel.loss.loss) == pytest.approx(float(whole.loss), abs=1e-6)
        else:
            assert float(panel.loss.loss) == pytest.approx(float(tr.loss.loss), abs=1e-6)
    if spg > ga:                                      # the two steps of one cycle split its batch
        assert sorted(rows_seen) == list(range(16))


# ------------------------------------------------------------------------------- bad input
def test_not_a_capture_and_incompatible_version_are_named_errors(runs, tmp_path):
    import shutil

    from rookworld_debug import StepTrace
    from rookworld_debug.errors import IncompatibleTraceError, TraceError
    with pytest.raises(TraceError, match="not a step trace or TRL capture: no trace.json"):
        StepTrace.load(tmp_path)
    with pytest.raises(TraceError, match=r"holds captured steps \['step-000001', 'step-000003'\]"):
        StepTrace.load(runs["out"] / "captures")
    bad = tmp_path / "garbled"
    bad.mkdir()
    (bad / "trace.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        StepTrace.load(bad)
    old = tmp_path / "old-trl"
    shutil.copytree(runs["cap"].paths[1], old)
    payload = json.loads((old / "trace.json").read_text())
    payload["fields"]["capture"]["fields"]["trl_version"] = "0.19.1"
    (old / "trace.json").write_text(json.dumps(payload))
    with pytest.raises(IncompatibleTraceError, match=r"captured with TRL 0\.19\.1.*TRL 1\.16\.x only"):
        StepTrace.load(old)
    assert not issubclass(IncompatibleTraceError, TypeError) and issubclass(IncompatibleTraceError, TraceError)
    # a trace saved before captures existed (no "capture" field) still loads, as an ordinary step
    legacy = tmp_path / "legacy"
    shutil.copytree(runs["cap"].paths[1], legacy)
    payload = json.loads((legacy / "trace.json").read_text())
    del payload["fields"]["capture"]
    (legacy / "trace.json").write_text(json.dumps(payload))
    assert StepTrace.load(legacy).capture is None


def test_report_cli_refuses_a_non_trace_folder(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rookworld_debug.cli", "report", "--trace", str(tmp_path),
                        "--out", str(tmp_path / "rep")], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "is not a step trace or TRL capture" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "rep").exists()


# ------------------------------------------------------------------------------- as a user runs it
def test_report_cli_renders_a_capture(runs, tmp_path):
    """`rookworld-debug report --trace DIR`: notebook 01 under papermill on the captured step → report.html."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "rookworld_debug.cli", "report", "--trace", str(runs["cap"].paths[3]),
                        "--out", str(tmp_path), "--no-progress"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    (run_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    html = (run_dir / "report.html").read_text()
    assert "Captured from TRL's GRPOTrainer" in html and "No greedy before/after evaluation" in html
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["trl_capture"]["global_step"] == 3
    assert abs(summary["metrics"]["loss"] - runs["logged"][3]["loss"]) <= 1e-5


@pytest.mark.slow     # the in-process fixture above runs the same `run()`; this adds the command line
def test_worked_example_command(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "rookworld_debug.trl.example", "--out", str(tmp_path)],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "captured [1, 3]" in r.stdout
    assert (tmp_path / "step-000001" / "trace.json").is_file() and (tmp_path / "step-000003" / "trace.json").is_file()


@pytest.mark.slow     # test_panel_recomputes_a_capture_for_a_new_beta covers the panel in-process
def test_tune_notebook_on_a_capture(runs, tmp_path):
    import papermill as pm
    os.environ["HF_HUB_OFFLINE"] = "1"
    pm.execute_notebook(str(ROOT / "notebooks" / "02_tune_beta_temperature.ipynb"), str(tmp_path / "nb.ipynb"),
                        parameters={"trace_path": str(runs["cap"].paths[3]), "run_dir": str(tmp_path), "beta": 0.5},
                        kernel_name="python3", progress_bar=False, execution_timeout=600, cwd=str(tmp_path))
    m = json.loads((tmp_path / "summary.json").read_text())["metrics"]
    assert m["beta"] == 0.5 and m["captured_beta"] == 0.1
    assert m["loss"] != pytest.approx(m["captured_loss"], abs=1e-6)


@pytest.mark.parametrize("steps", [3, 1.5, [1.5], [True], ["2"], None, "12"])
def test_step_numbers_that_would_capture_another_step_are_refused(tmp_path, steps):
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer

    trainer = make_trainer(tmp_path / "t", max_steps=1, max_completion_length=48)
    with pytest.raises(ConfigError, match="steps"):
        capture_steps(trainer, steps, tmp_path / "c")


def test_a_wrapped_reward_that_keeps_the_name_rookworld_p_is_captured_with_a_note(tmp_path):
    """A user's wrapper around the P: reward that keeps its name but not its attributes: every step is captured,
    and the trace says the reward's settings were not read (they are assumed, not taken from a look-alike)."""
    from trl import GRPOTrainer

    from rookworld_debug import StepTrace
    from rookworld_debug.models import load_policy_and_reference
    from rookworld_debug.models.loading import TINY_DIR
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import grpo_config, tiny_dataset
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    inner = rookworld_reward_funcs("dataset")

    def rookworld_p(prompts, completions, **kw):        # a wrapper: the name kept, the attributes not
        return inner[0](prompts, completions, **kw)
    trainer = GRPOTrainer(model=str(TINY_DIR), reward_funcs=[rookworld_p, *inner[1:]],
                          args=grpo_config(tmp_path / "t", max_steps=1, max_completion_length=24),
                          train_dataset=tiny_dataset(), processing_class=load_policy_and_reference("tiny").tokenizer)
    cap = capture_steps(trainer, (1,), tmp_path / "captures")
    trainer.train()
    assert cap.errors == {} and sorted(cap.paths) == [1]
    notes = StepTrace.load(cap.paths[1]).capture.mapping_notes
    assert any("named 'rookworld_p'" in n and "not rookworld_debug's PReward" in n for n in notes), notes
