"""Numerical faults: every one is flagged in its record, in StepTrace.flags and in the banner,
and no NaN ever steps the optimizer.

Decisions documented here (and in grpo/phases/rewards.py, grpo/phases/advantages.py):
- a reward function returning None or NaN → that function's value is "not applicable" (TRL: nansum over
  functions); the row is unscorable (NaN total, advantage 0) only when EVERY function returned None/NaN;
- a reward function returning ±inf → the row is UNSCORABLE (NaN total → advantage 0, excluded from its
  group's mean/std), flagged per row (`reward_fn:<name> returned inf`), in `Rewards.warnings` and in
  StepTrace.flags. TRL would propagate the inf (one inf zeroes its whole group, or with
  scale_rewards="none" gives the other rows advantages of −3.4e38); we refuse to let one value do that;
- a value that is not a number or None → ValueError naming the function and the row;
- NaN/inf logits in a training/scoring forward → flagged records, the update is refused
  (trace.update is None, flag 'update refused: …'), parameters bit-identical;
- NaN/inf logits while SAMPLING → NumericalError (there is no rollout to flag), parameters untouched.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.errors import NumericalError
from rookworld_debug.grpo.families.manual import manual_advantages
from rookworld_debug.grpo.phases.advantages import compute_advantages
from rookworld_debug.grpo.phases.rewards import compute_rewards
from rookworld_debug.grpo.multistep.start import setup
from rookworld_debug.grpo.step import run_step
from rookworld_debug.grpo.phases.update import update
from rookworld_debug.models import load_policy_and_reference
from rookworld_debug.viz.adapters import banner_from_trace, flags_from_trace


def _config(model_dir, **kw) -> StepConfig:
    base = dict(model=str(model_dir), reward_mode="dataset", task="P", batch_size=2, num_generations=4,
                max_new_tokens=12, eval_max_new_tokens=8, heldout_n=0, top_k_alternatives=2, seed=3)
    return StepConfig(**{**base, **kw})


def _session(model_dir, hook=None, **kw):
    """A fresh Setup on the tiny byte model; `hook(hidden_out) -> tensor|None` edits lm_head's logits."""
    loaded = load_policy_and_reference(model_dir)
    if hook is not None:
        loaded.policy.lm_head.register_forward_hook(lambda mod, inp, out: hook(out))
    cfg = _config(model_dir, **kw)
    return cfg, setup(cfg, loaded=loaded)


def _params(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


def _unchanged(before, policy) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def _banner(trace) -> str:
    return banner_from_trace(trace).html


def _eos_bias(value: float, eos_id: int):
    def hook(out):
        out = out.clone()
        out[..., eos_id] = value
        return out
    return hook


# ----------------------------------------------------------------------------------- NaN/inf logits
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_logits_in_training_forward_refuse_the_update(tiny_byte_model_dir, bad):
    """Sampling sees finite logits (one position per call); every multi-position forward (step-0 check,
    scoring, the loss's grad forward) sees NaN/inf."""
    cfg, s = _session(tiny_byte_model_dir, hook=lambda out: torch.full_like(out, bad) if out.shape[1] > 1 else None)
    assert not s.invariants.ok                                             # flagged at setup already
    before = _params(s.policy)
    trace = run_step(cfg, session=s)
    assert trace.update is None and trace.evaluation is None               # the step refused …
    refused = [f for f in trace.flags if f.startswith("update refused")]
    assert refused and "non-finite" in refused[0]                          # … and says why
    assert _unchanged(before, s.policy)                                    # parameters bit-identical
    assert not any(s.optimizer.state.values())                             # no optimizer step was taken
    assert not math.isfinite(float(trace.loss.loss)) and trace.loss.flags  # the loss record is flagged
    assert trace.rollout.logp_diff_flagged                                 # the rollout record is flagged
    codes = {f.code for f in flags_from_trace(trace)}
    assert {"nan", "update_refused", "invariant"} <= codes
    html = _banner(trace)
    assert "update refused" in html and "NaN/inf value(s)" in html and "rw-error" in html
    assert math.isnan(trace.summary()["grad_norm_pre_clip"])


def test_nan_logits_while_sampling_raise_a_named_error(tiny_byte_model_dir):
    cfg, s = _session(tiny_byte_model_dir, hook=lambda out: torch.full_like(out, float("nan")))
    before = _params(s.policy)
    with pytest.raises(NumericalError, match="NaN/inf"):
        run_step(cfg, session=s)
    assert _unchanged(before, s.policy)


def test_nan_advantages_passed_to_update_never_step(tiny_byte_model_dir):
    """Direct use of the update phase: a NaN advantage (hand-built record) makes the loss NaN → refused."""
    cfg, s = _session(tiny_byte_model_dir)
    trace = run_step(cfg, session=s)                                       # a healthy step first
    assert trace.update is not None
    adv = dataclasses.replace(trace.advantages, advantages=torch.full_like(trace.advantages.advantages, math.nan))
    before = _params(s.policy)
    with pytest.raises(NumericalError, match="refused"):
        update(s.policy, s.optimizer, trace.rollout, adv, trace.loss, cfg)
    assert _unchanged(before, s.policy)
    assert all(p.grad is None for p in s.policy.parameters())              # no stale NaN grads left behind


# ----------------------------------------------------------------------------------- NaN/inf/None rewards
def test_user_reward_none_nan_inf_semantics():
    prompts = ["P: x"] * 4 + ["P: y"] * 4
    nan, inf = float("nan"), float("inf")
    values = {"f": [1.0, None, nan, inf, 0.5, 0.25, -inf, 0.0], "g": [None, None, nan, 1.0, 1.0, 1.0, 1.0, 1.0]}
    r = compute_rewards(prompts, ["c"] * 8, ["P"] * 8, use_builtin=False,
                        reward_funcs={k: (lambda v: lambda **kw: v)(v) for k, v in values.items()})
    total = r.rewards.tolist()
    assert total[0] == 1.0 and total[4] == 1.5 and total[5] == 1.25       # nansum over functions (TRL)
    assert math.isnan(total[1]) and math.isnan(total[2])                   # every function None/NaN
    assert math.isnan(total[3]) and math.isnan(total[6])                   # any ±inf → unscorable
    assert torch.isinf(r.rewards_per_func[3, 0]) and torch.isinf(r.rewards_per_func[6, 0])   # raw value kept
    assert r.flags[3] == ("reward_fn:f returned inf",) and r.flags[6] == ("reward_fn:f returned -inf",)
    assert r.warnings and "rows [3, 6]" in r.warnings[0] and "'f'" in r.warnings[0]
    assert all(math.isfinite(v) for k, v in r.metrics.items() if not k.endswith("/std"))
    a = compute_advantages(r.rewards, 4)
    assert torch.isfinite(a.advantages).all()
    assert a.advantages[[1, 2, 3, 6]].tolist() == [0.0] * 4
    assert set(a.nan_reward_indices) == {1, 2, 3, 6}


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_inf_reward_is_unscorable_not_poison(scale):
    """One inf must not zero its whole group/batch, nor produce −3.4e38 advantages (TRL's behaviour)."""
    r = [1.0, float("inf"), 0.0, 0.5, 1.0, 0.0, 0.2, 0.3]
    a = compute_advantages(r, 4, scale_rewards=scale)
    clean = compute_advantages([1.0, float("nan"), 0.0, 0.5, 1.0, 0.0, 0.2, 0.3], 4, scale_rewards=scale)
    assert torch.equal(a.advantages, clean.advantages) and a.advantages[1] == 0.0
    assert a.advantages.abs().max() < 10 and a.advantages[0] != 0.0
    assert any("infinite reward" in f and "[1]" in f for f in a.flags)
    assert math.isinf(float(a.rewards[1]))                                 # the record shows what was returned
    m = manual_advantages([float("-inf"), 1.0, 0.0, 0.5], 4)
    assert m.advantages[0] == 0.0 and torch.isfinite(m.advantages).all() and m.flags


def test_non_numeric_reward_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'oops' returned 'high' for row 1"):
        compute_rewards(["P: x"] * 2, ["a", "b"], ["P"] * 2, use_builtin=False,
                        reward_funcs={"oops": lambda **kw: [0.5, "high"]})


def test_nan_and_inf_rewards_in_a_step_are_flagged_everywhere(tiny_byte_model_dir):
    cfg, s = _session(tiny_byte_model_dir)
    n = cfg.num_completions
    weird = [float("inf"), None, float("nan"), 0.3] + [0.1 * i for i in range(n - 4)]

    def flaky(**kw):
        return weird

    trace = run_step(cfg, session=s, reward_funcs={"flaky": flaky})
    assert math.isnan(float(trace.rewards.rewards[0]))                     # inf → unscorable
    assert trace.advantages.advantages[0] == 0.0 and torch.isfinite(trace.advantages.advantages).all()
    assert 0 in trace.advantages.nan_reward_indices
    assert "reward_fn:flaky returned inf" in trace.rewards.flags[0]
    assert any("infinite reward" in f for f in trace.flags)
    assert math.isfinite(float(trace.loss.loss)) and trace.update is not None   # the finite rows still train
    assert "infinite reward" in _banner(trace)
    back = type(trace).load(trace.save(tiny_byte_model_dir.parent / "nan_inf_trace"))
    assert back.flags == trace.flags and math.isinf(float(back.rewards.rewards_per_func[0, 1]))


# ----------------------------------------------------------------------------------- degenerate rollouts
def test_empty_completions_and_all_zero_std_groups_are_flagged(tiny_byte_model_dir):
    """EOS as the very first token for every row: empty texts, identical rewards → every group zero-std."""
    tok_eos = load_policy_and_reference(tiny_byte_model_dir).tokenizer.eos_token_id
    cfg, s = _session(tiny_byte_model_dir, hook=_eos_bias(1e4, tok_eos))
    trace = run_step(cfg, session=s)
    r = trace.rollout
    assert r.completions == ("",) * cfg.num_completions and r.completion_mask.sum(1).eq(1).all()
    assert any("empty completion" in w for w in r.warnings)               # rollout record
    assert all("empty" in f for f in trace.rewards.flags)                 # rewards record, per row
    assert trace.advantages.zero_std_groups == (0, 1)                      # advantages record
    assert trace.advantages.advantages.eq(0).all()
    assert any("empty completion" in f for f in trace.flags)
    assert any("ALL groups zero-std" in f for f in trace.flags)
    codes = {f.code: f for f in flags_from_trace(trace)}
    assert "empty_completion" in codes and codes["zero_std"].severity == "error"
    html = _banner(trace)
    assert "empty completion" in html and "every group with zero reward std" in html
    assert math.isfinite(float(trace.loss.loss))


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_all_truncated_completions_are_flagged(tiny_byte_model_dir, mask_truncated):
    """EOS never sampled: every row hits max_new_tokens. With mask_truncated_completions every token is
    masked out: the loss must stay finite (0) — never NaN from 0/0 — and the step must not move weights."""
    tok_eos = load_policy_and_reference(tiny_byte_model_dir).tokenizer.eos_token_id
    cfg, s = _session(tiny_byte_model_dir, hook=_eos_bias(-1e4, tok_eos), max_new_tokens=6,
                      mask_truncated_completions=mask_truncated)
    before = _params(s.policy)
    trace = run_step(cfg, session=s)
    assert trace.rollout.is_truncated.all()
    assert any("all 8 completions truncated" in w for w in trace.rollout.warnings)
    assert any("truncated" in f for f in trace.flags)
    assert "all_truncated" in {f.code for f in flags_from_trace(trace)}
    assert "hit max_new_tokens without EOS" in _banner(trace)
    assert math.isfinite(float(trace.loss.loss))
    if mask_truncated:
        assert float(trace.loss.loss) == 0.0
        assert trace.update is not None and trace.update.grad_norm_pre_clip == 0.0
        assert _unchanged(before, s.policy)
