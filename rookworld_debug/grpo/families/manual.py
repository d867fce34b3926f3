"""rookworld-trl's manual debug loop (jorahn/rookworld-trl manual_grpo_debug.py) as an objective family.

Sequence-level REINFORCE, no ratio and no clip:

    A    = clamp((r − mean_g) / max(std_g(ddof=1), std_clamp), −clip, clip)
    loss = (1/N) Σ_i [ −A_i · mean_t ℓ_it + β · mean_t KL_it − c_H · mean_t H_it ] / g

with mean_t the masked mean over the completion's tokens; KL uses `kl_estimator` (that run used "full") without
bias correction, and the entropy bonus is the mean of per-sequence means.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.registry import Family, LossRule, register
from rookworld_debug.grpo.objective.aggregation import sequence_mean
from rookworld_debug.grpo.objective.terms import reinforce
from rookworld_debug.grpo.phases.advantages import (Advantages, as_rewards, check_knobs, finish_advantages,
                                                    nanstd, unscorable_inf)
from rookworld_debug.settings import Rule, optional, section, setting


@section("manual")
class ManualSettings:
    """The manual loop's advantage knobs."""
    manual_std_clamp: float = setting(0.05, "loss_type='manual' only: advantage denominator is max(std_g, this) "
                                      "(rookworld-trl's manual debug run used 0.05 at step 1, 1e-6 later).")
    manual_adv_clip: Optional[float] = setting(2.0, "loss_type='manual' only: advantages clipped to ±this "
                                               "(rookworld-trl's manual debug run: 2.0). None = no clip.")

    RULES = (Rule("manual_std_clamp", lambda c: c.manual_std_clamp >= 0, "must be ≥ 0"),
             Rule("manual_adv_clip", optional("manual_adv_clip", lambda v: v > 0), "must be > 0 or None"))


def manual_advantages(rewards: Union[torch.Tensor, Sequence[float]], num_generations: int, *,
                      std_clamp: float = 0.05, clip: Optional[float] = 2.0, std_ddof: int = 1) -> Advantages:
    """rookworld-trl's manual debug run's advantages: A = clamp((r − mean_g) / max(std_g(ddof=1), std_clamp), −clip, clip).

    (rookworld-trl's manual debug run used std_clamp 0.05 at step 1 and 1e-6 afterwards; clip 2.) NaN rewards are excluded from
    mean/std and get advantage 0 (that run had no NaN handling; flagged)."""
    check_knobs(std_ddof, ("manual_std_clamp", std_clamp), ("manual_adv_clip", clip))
    G = num_generations
    raw = as_rewards(rewards, G)                                           # (N,)
    r = unscorable_inf(raw)                                                # (N,)
    if G < 2:
        raise ConfigError("num_generations", "manual advantages need G ≥ 2 (group std)")
    grouped = r.view(-1, G)                                                 # (B, G)
    group_mean = torch.nanmean(grouped, dim=1)                              # (B,)
    group_std = nanstd(grouped, dim=1, ddof=std_ddof)                       # (B,)
    denom = group_std.clamp(min=std_clamp).repeat_interleave(G, dim=0)      # (N,)
    adv = (r - group_mean.repeat_interleave(G, dim=0)) / denom              # (N,)
    formula = f"A=(r-mean_g)/max(std_g(ddof={std_ddof}),{std_clamp:g})"
    if clip is not None:
        formula = f"A=clip((r-mean_g)/max(std_g(ddof={std_ddof}),{std_clamp:g}),±{clip:g})"
    formula += " [rookworld-trl's manual variant], NaN→0"
    is_std_zero = torch.isclose(group_std, torch.zeros_like(group_std)).repeat_interleave(G)  # (N,)
    return finish_advantages(r, G, adv, group_mean, group_std, denom, is_std_zero, normalization=formula, method="manual",
                   scale="group", eps=std_clamp, ddof=std_ddof, clip=clip, raw=raw)


def _advantages(rewards, config):
    return manual_advantages(rewards, config.num_generations, std_clamp=config.manual_std_clamp,
                             clip=config.manual_adv_clip, std_ddof=config.std_ddof)


def _text(ob, params, ratio):
    return "PG_it = −A_i·logπ_it (no ratio, no clip)"


RULE = LossRule("rows", reinforce, sequence_mean, kl_bias_correction=False, entropy="sequences", text=_text,
                help="rookworld-trl's manual sequence-level REINFORCE mean_i(−A_i·mean_t logπ + β·mean_t KL − "
                     "c_H·mean_t H), no ratio, no clip (its knobs: the manual section).")


def _check_config(config) -> None:
    if config.num_generations < 2:
        raise ConfigError("num_generations", f"G={config.num_generations} < 2: rookworld-trl's manual advantages "
                                             "divide by the group std, which needs at least two samples; use G ≥ 2")


FAMILY = register(Family("rookworld-trl manual loop", {"manual": RULE}, _advantages, check_config=_check_config,
                         settings=ManualSettings))
