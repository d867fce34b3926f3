"""A TRL capture is fitted like a hand-written loop: where the declared loss over the capture's micro-batches
reproduces the capture's own recomputation, each known mistake (another aggregation, a sign, a missing KL, an input
wired in another's place, a micro-batch normaliser) is that same computation with one thing changed, and the one that
reproduces TRL's recorded loss is named; a trainer whose attribute was set apart from its GRPOConfig (loss_type,
scale_rewards, mask_truncated_completions, epsilon_high) is named with both values. Real GRPOTrainer runs."""
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


def _set(**attributes):
    def patch(trainer):                 # the attributes _compute_loss and the scoring read, set apart from GRPOConfig
        for k, v in attributes.items():
            setattr(trainer, k, v)
    return patch


@pytest.mark.slow
@pytest.mark.parametrize("attributes, base, phase", [
    (dict(loss_type="grpo"), {}, "loss"),
    (dict(scale_rewards="batch"), {}, "advantages"),
    (dict(mask_truncated_completions=True), {"max_completion_length": 64}, "generation"),
    (dict(epsilon_high=0.2), {"num_iterations": 2, "epsilon_high": 0.28, "learning_rate": 3e-5}, "loss"),
], ids=["loss_type", "scale_rewards", "mask_truncated_completions", "epsilon_high"])
def test_a_trainer_attribute_set_apart_from_its_grpo_config_is_named_with_both_values(tmp_path, attributes, base,
                                                                                        phase):
    from rookworld_debug.diagnosis.replay import replay_findings, replay_path
    from rookworld_debug.lab.faults_trl import TRLFault, run_trl
    (keyword, value), = attributes.items()
    _, paths, errors = run_trl(tmp_path, 0, TRLFault("set_apart", frozenset(), "", patch=_set(**attributes),
                                                     base=base))
    assert errors == {} and paths
    # a later pass (num_iterations = 2: step 2) shows a clip bound; any step shows the others
    r = replay_path(paths[2])
    fit, = r.declarations
    assert (fit.keyword, fit.fitted, fit.phase) == (keyword, value, phase)
    top = replay_findings(r)[0]
    assert top.code == "declaration_mismatch" and top.severity == "error"
    assert f"trainer.{keyword}" in top.cause and "GRPOConfig" in top.cause, top.cause


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


def test_a_masked_truncated_row_is_still_the_text_its_reward_read(trl_checkpointed_run):
    """mask_truncated_completions leaves a truncated row's loss mask all 0: its text and its reward are still the
    generated ids' (no misaligned text, no 'identical' empty completions with different rewards)."""
    import dataclasses

    from rookworld_debug.diagnosis.evidence import identical_rows_rewards
    from rookworld_debug.diagnosis.replay.data_phases import _texts_check
    from rookworld_debug.models import load_policy_and_reference
    t = StepTrace.load(trl_checkpointed_run / "captures" / "step-000002")
    tok = load_policy_and_reference("tiny").tokenizer
    r = t.rollout
    truncated = r.is_truncated.bool()
    assert 2 <= int(truncated.sum()) and len(set(r.completions[i] for i in truncated.nonzero().flatten().tolist())) > 1
    masked = dataclasses.replace(r, completion_mask=r.completion_mask * (~truncated)[:, None].to(r.completion_mask.dtype))
    assert _texts_check(masked, tok, tok.eos_token_id).status == "agree"
    assert _texts_check(masked, tok).status == "disagree"        # the loss mask alone would read them as empty
    pairs, differ = identical_rows_rewards(dataclasses.replace(t, rollout=masked))
    assert (pairs, differ) == identical_rows_rewards(t)
