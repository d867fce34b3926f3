"""A recorded bug that is a factor on the advantages or on the whole loss, re-applied by the continuation as the
declared objective with that factor (whatif/recorded_bug.py). The claims it rests on, checked on every loss type of
TRL's family: the copy's advantages are c × the declared ones, and L(sA, sβ, s·c_H) = s·L(A, β, c_H) with its
gradient, for s > 0 (every per-token objective is positively homogeneous in A)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.registry import advantages_from_config, family_of, registered_for_now
from rookworld_debug.whatif.recorded_bug import Factor, bug_settings, factor_of

TRL_LOSS_TYPES = family_of("dapo").loss_types
# knobs a loss type needs beyond the defaults (vespo weighs sequences by their importance ratio)
NEEDS = {"vespo": {"importance_sampling_level": "sequence"}}


def _inputs(seed=0, N=8, T=12):
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(N, T, generator=g, dtype=torch.float64) * 4).requires_grad_()
    old = logps.detach() + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3
    ref = logps.detach() + torch.randn(N, T, generator=g, dtype=torch.float64) * 0.5
    entropy = torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    mask = (torch.arange(T) < torch.randint(1, T + 1, (N, 1), generator=g)).long()
    return logps, old, ref, torch.randn(N, generator=g, dtype=torch.float64), mask, entropy


def _loss(config, adv, data):
    logps, old, ref, _, mask, entropy = data
    logps.grad = None
    rec = compute_loss(logps, old, ref, adv, mask, Objective.from_config(config),
                       LossBatch(entropy=entropy, num_generations=config.num_generations))
    rec.loss.backward()
    return float(rec.loss.detach()), logps.grad.clone()


@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
@pytest.mark.parametrize("s", [0.4903, 2.0])
def test_a_scale_of_the_whole_loss_is_the_objective_with_scaled_advantages_beta_and_entropy(loss_type, s):
    data = _inputs()
    base = StepConfig(loss_type=loss_type, beta=0.04, entropy_coef=0.01, num_generations=4, **NEEDS.get(loss_type, {}))
    with registered_for_now():
        over = bug_settings(base, Factor(s, s, "a scale"))
        bug = base.replace(**over)
        loss, grad = _loss(base, data[3], data)
        rewards = torch.tensor([0.1, 0.5, -0.3, 0.9, 0.0, 0.2, 0.7, -0.1])
        a_bug = advantages_from_config(rewards, bug).advantages
        assert torch.allclose(a_bug, s * advantages_from_config(rewards, base).advantages, rtol=1e-12)
        loss_bug, grad_bug = _loss(bug, s * data[3], data)
    assert over["beta"] == pytest.approx(0.04 * s) and over["entropy_coef"] == pytest.approx(0.01 * s)
    assert loss_bug == pytest.approx(s * loss, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grad_bug, s * grad, rtol=1e-10, atol=1e-12)


def test_an_advantage_sign_keeps_beta_and_the_copy_is_gone_after_the_block():
    base = StepConfig(loss_type="grpo", beta=0.04, num_generations=4)
    with registered_for_now():
        over = bug_settings(base, Factor(-1.0, 1.0, "a sign"))
        assert over == {"loss_type": "grpo_advantages_times_m1"}
        assert family_of(over["loss_type"]).rules[over["loss_type"]] is family_of("grpo").rules["grpo"]
        rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
        flipped = advantages_from_config(rewards, base.replace(**over))
        assert torch.equal(flipped.advantages, -advantages_from_config(rewards, base).advantages)
        assert "the recorded bug" in flipped.normalization
    with pytest.raises(Exception, match="grpo_advantages_times_m1"):
        family_of(over["loss_type"])


@dataclasses.dataclass
class _First:                      # the fields of a replay's first disagreement that factor_of reads
    cause: str
    fit: dict


@pytest.mark.parametrize("first, want", [
    (_First("loss_advantage_sign", {"kind": "terms"}), (-1.0, 1.0)),
    (_First("reward_sign_flipped", {"kind": "negated"}), (-1.0, 1.0)),
    (_First("gradient_scaled", {"kind": "scaled", "params": {"scale": 2.0}}), (2.0, 2.0)),
    (_First("gradient_scaled", {"kind": "terms", "params": {"policy term": {"fitted": 0.5, "declared": 1.0}}}),
     (0.5, 0.5)),
    (_First("advantages_scaled", {"kind": "scaled", "params": {"scale": 4.0}}), (4.0, 1.0)),
    (_First("gradient_scaled", {"kind": "scaled", "params": {"scale": -2.0}}), None),   # no s > 0: not homogeneous
    (_First("advantage_grouping", {"kind": "other"}), None),
])
def test_which_fits_are_a_factor(first, want):
    f = factor_of(first)
    assert (None if f is None else (f.advantages, f.loss)) == want
