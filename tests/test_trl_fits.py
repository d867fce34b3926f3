"""A TRL capture's loss is fitted like a hand-written loop's: where the declared loss over the capture's micro-batches
reproduces the capture's own recomputation, each known mistake (another aggregation, a sign, a missing KL, an input
wired in another's place) is that same computation with one thing changed, and the one that reproduces TRL's
recorded loss is named. A real GRPOTrainer whose loss aggregates as another loss_type than its config declares is
named by that loss_type."""
from __future__ import annotations

import types

import pytest

from rookworld_debug.diagnosis.replay.loss_phase import _capture_variants, loss_check
from rookworld_debug.grpo.step import StepTrace


def test_a_healthy_capture_agrees_and_carries_the_loss_variants(trl_checkpointed_run):
    t = StepTrace.load(trl_checkpointed_run / "captures" / "step-000002")
    assert loss_check(t).status == "agree"
    variants = _capture_variants(t)
    assert {"loss_advantage_sign", "loss_wiring/adv=rewards"} <= set(variants)
    assert any(k.startswith("loss_aggregation/") for k in variants)
    # each variant is a number, and none of them is the declared loss itself on this step
    assert all(v is None or isinstance(v, float) for v in (fn() for fn, _ in variants.values()))


def _aggregates_as_grpo(trainer):
    trainer.loss_type = "grpo"              # the attribute _compute_loss reads, set apart from GRPOConfig.loss_type


@pytest.mark.slow
def test_a_trainer_whose_loss_aggregates_as_another_loss_type_is_named(tmp_path):
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.lab.faults_trl import TRLFault, run_trl
    fault = TRLFault("aggregates_as_grpo", frozenset({"loss_aggregation"}), "", patch=_aggregates_as_grpo)
    _, paths, errors = run_trl(tmp_path, 0, fault)
    assert errors == {} and paths
    r = replay_path(paths[max(paths)])
    loss = next(c for c in r.checks if c.phase == "loss" and c.status != "agree")
    assert loss.cause == "loss_aggregation", loss.explanation
    assert "loss_type='grpo'" in loss.explanation and "'dapo'" in loss.explanation


def _normalised_per_micro_batch(trainer):
    import types
    loss = trainer._compute_loss

    def own_tokens(self, model, inputs):     # each micro-batch's loss ÷ its own tokens, not the window's
        return loss(model, {**inputs, "num_items_in_batch": inputs["completion_mask"].sum()})
    trainer._compute_loss = types.MethodType(own_tokens, trainer)


@pytest.mark.slow
def test_a_loss_divided_by_each_micro_batch_s_own_tokens_is_named_with_the_counts(tmp_path):
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.lab.faults_trl import TRLFault, run_trl
    fault = TRLFault("own_tokens", frozenset(), "", patch=_normalised_per_micro_batch,
                     base={"gradient_accumulation_steps": 2})
    _, paths, errors = run_trl(tmp_path, 0, fault)
    assert errors == {} and len(paths) >= 2
    for step in sorted(paths)[:2]:      # the first step's micro-batches hold unequal token counts
        r = replay_path(paths[step])
        first = r.first_disagreement
        assert first.phase == "loss" and first.cause == "loss_normalised_per_micro_batch", (step, first)
        assert "k = 2" in first.explanation and "tokens" in first.explanation
