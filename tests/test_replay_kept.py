"""The project's own steps keep the weights their replay needs: a run_step trace (first step, after warm-up
updates, in memory or saved) and a TRL capture made with keep_weights=True replay their scoring, gradient and
update phases, not skip them; whether a weightless step's policy moved is read from its provenance, never from its
log-probs; Stockfish rewards are re-run under the recorded search settings."""
from __future__ import annotations

import dataclasses
import os
import warnings

import pytest
import torch

WEIGHT_PHASES = {"scoring", "gradient", "update"}
SMALL = dict(batch_size=2, num_generations=3, max_new_tokens=48, eval_max_new_tokens=8, heldout_n=0)


def _step(**kw):
    from rookworld_debug import StepConfig, run_step
    os.environ["HF_HUB_OFFLINE"] = "1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_step(StepConfig(**{"reward_mode": "dataset", **SMALL, **kw}))


def _phases(rep) -> dict:
    return {p["phase"]: p["status"] for p in rep.phases()}


@pytest.fixture(scope="module")
def kept_step(tmp_path_factory):
    """A step after one earlier update of the same session (its policy has moved), with clipping active."""
    from rookworld_debug import StepConfig, run_step
    first = _step(max_grad_norm=1e-3)
    cfg = StepConfig(**{"reward_mode": "dataset", **SMALL, "max_grad_norm": 1e-3, "seed": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        second = run_step(cfg, session=first.setup)
    folder = tmp_path_factory.mktemp("kept") / "step"
    second.save(folder)
    return second, folder


def test_a_later_step_keeps_its_weights_and_replays_every_phase(kept_step):
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.grpo.trace.state import read_state
    trace, folder = kept_step
    assert trace.setup.provenance["optimizer_steps_before"] == 1       # the policy had moved
    st = read_state(folder)
    assert st.before is not None and st.after is not None and st.gradient is not None
    assert int(next(iter(st.optimizer_state.values()))["step"]) == 1   # AdamW's state before this step's update
    rep = replay_path(folder)
    assert rep.first_disagreement is None, rep.first_disagreement
    assert all(_phases(rep)[p] == "agree" for p in WEIGHT_PHASES), rep.phases()
    assert "kept" in rep.weights


def test_the_kept_gradient_is_the_one_before_clipping(kept_step):
    """Clipping was active (max_grad_norm 1e-3): the kept gradient's norm is the logged pre-clip norm."""
    trace, _ = kept_step
    g = trace.kept.gradient
    norm = float(sum(v.double().pow(2).sum() for v in g.values()) ** 0.5)
    assert trace.update.grad_norm_pre_clip > 1e-2 and trace.update.clip_coef < 1
    assert norm == pytest.approx(trace.update.grad_norm_pre_clip, rel=1e-5)


def test_an_in_memory_step_replays_with_its_kept_weights(kept_step):
    from rookworld_debug.diagnosis.replay import replay_trace
    trace, _ = kept_step
    rep = replay_trace(trace)
    assert "in memory" in rep.weights and all(_phases(rep)[p] == "agree" for p in WEIGHT_PHASES)


def test_a_tampered_kept_step_is_placed_in_its_phase(kept_step, tmp_path):
    """Log-probs shifted on one row (scoring), a doubled gradient, an update scaled: each its own phase."""
    from rookworld_debug.diagnosis.replay import replay_trace
    trace, _ = kept_step
    r = trace.rollout
    shifted = r.per_token_logps.clone()
    shifted[1] += 0.3 * r.completion_mask[1]
    rep = replay_trace(dataclasses.replace(trace, rollout=dataclasses.replace(r, per_token_logps=shifted)))
    assert rep.first_disagreement.phase == "scoring"
    k = trace.kept
    doubled = dataclasses.replace(k, gradient={n: 2 * v for n, v in k.gradient.items()})
    rep = replay_trace(dataclasses.replace(trace, kept=doubled))
    assert rep.first_disagreement.phase == "gradient" and rep.first_disagreement.cause == "gradient_scaled"
    moved = {n: k.before[n] + 3 * (k.after[n] - k.before[n]) for n in k.after}
    rep = replay_trace(dataclasses.replace(trace, kept=dataclasses.replace(k, after=moved)))
    assert rep.first_disagreement.phase == "update"


def test_keep_weights_never_and_a_moved_policy_is_said_from_provenance(kept_step, tmp_path):
    """No weights kept: a step after an update says its policy moved (the optimizer's step count), even when a
    fault makes its log-probs equal the reference's — the log-probs never decide it."""
    from rookworld_debug.diagnosis.replay import replay_trace
    trace, _ = kept_step
    r = trace.rollout
    same = dataclasses.replace(r, per_token_logps=r.ref_per_token_logps.clone())
    bare = dataclasses.replace(trace, kept=None, rollout=same)
    rep = replay_trace(bare)
    scoring = next(c for c in rep.checks if c.phase == "scoring")
    assert scoring.status == "not replayed" and "1 optimizer step(s) before" in scoring.explanation


def test_a_first_step_with_a_scoring_fault_is_replayed_not_skipped(tmp_path):
    """The old circular rule skipped scoring when log-probs differed from the reference's; a first step is
    replayed from its provenance, so shifted log-probs are found, with or without kept weights."""
    from rookworld_debug.diagnosis.replay import replay_trace
    trace = _step(keep_weights="never")
    r = trace.rollout
    rep = replay_trace(dataclasses.replace(trace, rollout=dataclasses.replace(
        r, per_token_logps=r.per_token_logps - 0.5 * r.completion_mask)))
    assert rep.first_disagreement is not None and rep.first_disagreement.phase == "scoring"


def test_a_save_without_weights_removes_an_earlier_steps_state(kept_step, tmp_path):
    trace, _ = kept_step
    trace.save(tmp_path / "s")
    assert (tmp_path / "s" / "state" / "state.json").is_file()
    dataclasses.replace(trace, kept=None).save(tmp_path / "s")
    assert not (tmp_path / "s" / "state").exists()


def test_engine_rewards_are_re_run_under_the_recorded_search(tmp_path):
    from rookworld_debug.diagnosis.replay import replay_trace
    trace = _step(reward_mode="engine", task="P", keep_weights="never", engine_depth=4)
    rep = replay_trace(trace, weights=False)
    rewards = next(c for c in rep.checks if c.phase == "rewards")
    assert rewards.status == "agree" and "Stockfish re-run" in rewards.quantity
    rw = trace.rewards
    bumped = dataclasses.replace(rw, rewards=rw.rewards + torch.arange(rw.rewards.numel()) * 0.01)
    rep = replay_trace(dataclasses.replace(trace, rewards=bumped), weights=False)
    assert rep.first_disagreement.phase == "rewards"
    prov = {**trace.setup.provenance, "engine": {**trace.setup.provenance["engine"], "threads": 4}}
    odd = dataclasses.replace(trace, setup=dataclasses.replace(trace.setup, provenance=prov))
    rewards = next(c for c in replay_trace(odd, weights=False).checks if c.phase == "rewards")
    assert rewards.status == "not replayed" and "one-thread" in rewards.explanation


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("loss_type", [pytest.param("dapo", marks=pytest.mark.slow), "grpo"])  # a TRL run each
def test_a_trl_capture_with_its_weights_replays_every_phase(tmp_path, loss_type):
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.trl.example import run
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    trainer, cap = run(tmp_path, steps=2, capture=(1, 2), keep_weights=True, per_device_train_batch_size=4,
                       gradient_accumulation_steps=2, loss_type=loss_type, max_completion_length=32)
    assert cap.errors == {} and (cap.paths[2] / "state" / "state.json").is_file()
    rep = replay_path(cap.paths[2])
    assert rep.first_disagreement is None, rep.first_disagreement
    assert all(_phases(rep)[p] == "agree" for p in WEIGHT_PHASES), rep.phases()
    if loss_type == "dapo":          # the captures folder: both steps and the pair 1 → 2 replayed, nothing wrong
        from rookworld_debug.diagnosis.registry import folder_diagnosis
        d = folder_diagnosis(tmp_path)
        assert sorted(d.replays) == [1, 2] and len(d.consecutive) == 1
        statuses = {c.phase: c.status for c in d.consecutive[0].checks}
        assert statuses["weights"] == statuses["optimizer"] == statuses["reference"] == "agree", statuses
        errors = [f.code for f in d.findings if f.severity == "error"]
        assert set(errors) <= {"all_truncated"}, errors      # the 32-token budget cuts every completion, on purpose


@pytest.mark.slow                       # a TRL run of its own, about 20 s
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")
def test_a_healthy_trl_run_of_two_steps_per_generation_and_two_passes_gets_no_error(tmp_path):
    """TRL's GRPOTrainer with steps_per_generation = 2 (each generation batch feeds two optimizer steps, each a
    slice of its rows) and num_iterations = 2 (π_old stored at generation, the policy moved on the later pass),
    captured with its weights at three consecutive steps: every step replays clean, every pair carries its weights,
    optimizer and reference over, and no finding is an error."""
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    from rookworld_debug.trl.example import run
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    _, cap = run(tmp_path, steps=3, capture=(1, 2, 3), keep_weights=True, per_device_train_batch_size=4,
                 gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=2, loss_type="dapo",
                 max_completion_length=128)
    assert cap.errors == {} and sorted(cap.paths) == [1, 2, 3]
    d = folder_diagnosis(tmp_path)
    assert sorted(d.replays) == [1, 2, 3] and len(d.consecutive) == 2
    assert all(r.first_disagreement is None for r in d.replays.values()), \
        {k: r.first_disagreement for k, r in d.replays.items()}
    for pair in d.consecutive:
        statuses = {c.phase: c.status for c in pair.checks}
        assert statuses["weights"] == statuses["optimizer"] == statuses["reference"] == "agree", statuses
    assert not [f.code for f in d.findings if f.severity == "error"], [(f.code, f.cause[:200]) for f in d.findings]
