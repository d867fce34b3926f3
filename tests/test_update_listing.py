"""Checks of the optimizer a step recorded, read from its records alone (diagnosis/replay/update.py, gradient_phase.py,
checks_invariants.py): a tensor listed twice in the optimizer, Adam's coupled weight decay where AdamW's is meant, a
clip coefficient never capped at 1, CISPO's importance-weight cap below 1, and truncated rows whose mask an unguarded
EOS index cut to one token."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from rookworld_debug.diagnosis.replay.update import coupled_decay_check, duplicated_check


def test_a_tensor_listed_twice_in_the_optimizer_is_named_with_its_count():
    c = duplicated_check(SimpleNamespace(trainable=["wte", "h.0", "wte", "h.1"]))
    assert c.status == "disagree" and c.cause == "tied_weight_stepped_twice" and "wte ×2" in c.explanation
    assert duplicated_check(SimpleNamespace(trainable=["wte", "h.0", "h.1"])) is None


def test_adam_with_weight_decay_is_an_error_where_adamw_is_declared_and_a_suspicion_in_a_loop():
    adam = SimpleNamespace(optimizer="Adam", optimizer_settings={"weight_decay": 0.1})
    assert coupled_decay_check(adam, True).status == "disagree"
    assert coupled_decay_check(adam, False).status == "suspect"
    assert coupled_decay_check(SimpleNamespace(optimizer="AdamW", optimizer_settings={"weight_decay": 0.1}), True) \
        is None
    assert coupled_decay_check(SimpleNamespace(optimizer="Adam", optimizer_settings={"weight_decay": 0.0}), True) \
        is None


def test_a_gradient_scaled_up_to_the_clip_norm_is_named_and_one_clipped_down_agrees():
    from rookworld_debug.diagnosis.replay.gradient_phase import gradient_check
    torch.manual_seed(0)
    raw = {"a": torch.randn(50), "b": torch.randn(30)}
    norm = float(torch.cat(list(raw.values())).norm())
    ours = {k: v / norm for k, v in raw.items()}                                   # ‖g‖ = 1
    up = {k: v * 5.0 for k, v in ours.items()}                                     # scaled UP to max_grad_norm = 5
    c = gradient_check(up, ours, "float32", 1, max_grad_norm=5.0)
    assert c.cause == "grad_clip_scales_up" and "max_grad_norm = 5" in c.explanation, (c.cause, c.explanation)
    down = {k: v * 0.5 / (1 + 1e-6) for k, v in ours.items()}                      # clip_grad_norm_ to 0.5
    assert gradient_check(down, ours, "float32", 1, max_grad_norm=0.5).status == "agree"
    assert gradient_check(up, ours, "float32", 1, max_grad_norm=None).cause == "gradient_scaled"


def test_cispo_with_its_cap_below_one_is_an_error(trl_checkpointed_run):
    from rookworld_debug.diagnosis.checks_invariants import check_cispo_cap
    from rookworld_debug.grpo.step import StepTrace
    t = StepTrace.load(trl_checkpointed_run / "captures" / "step-000002")
    capped = dataclasses.replace(t, config=t.config.replace(loss_type="cispo", epsilon_high=0.2))
    found, = check_cispo_cap(capped)
    assert found.code == "cispo_cap_below_one" and found.severity == "error" and "0.2" in found.cause
    assert check_cispo_cap(dataclasses.replace(t, config=t.config.replace(loss_type="cispo", epsilon_high=5.0))) == []
    assert check_cispo_cap(t) == []


def test_truncated_rows_cut_to_their_first_token_are_named(trl_checkpointed_run):
    from rookworld_debug.diagnosis.replay.data_phases import mask_checks
    from rookworld_debug.grpo.step import StepTrace
    t = StepTrace.load(trl_checkpointed_run / "captures" / "step-000002")
    r, eos = t.rollout, 256
    trunc = r.is_truncated.bool()
    assert 0 < int(trunc.sum()) < trunc.numel() or bool(trunc.all())
    mask = r.completion_mask.clone()
    ids = r.completion_ids.clone()
    mask[trunc] = 0
    mask[trunc, 0] = 1                                    # argmax(ids == EOS) = 0 on a row without EOS
    ids[trunc, 1:] = eos                                  # and the rest of the row padded
    cut = dataclasses.replace(t, rollout=dataclasses.replace(r, completion_mask=mask, completion_ids=ids))
    check, = mask_checks(cut, eos)
    assert check.status == "disagree" and check.cause == "truncated_rows_masked_to_first_token", check.explanation
    assert mask_checks(t, eos)[0].status == "agree"
