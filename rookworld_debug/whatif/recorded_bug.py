"""A recorded bug that is a factor on the advantages or on the whole loss, as an objective of this package's step.

The continuation re-applies a bug each step where the step can take it. A sign or a scale of the advantages, or a
scale of the whole loss, is not a setting, but it is an objective: the declared family with its advantages
multiplied by a factor c, registered for the continuation only under a loss type of its own. A scale s > 0 of the
whole loss is the same objective exactly, because every per-token objective of the built-in families is positively
homogeneous in A (min(r·sA, clip(r)·sA) = s·min(r·A, clip(r)·A); the gates and masks read A's sign only) and the
other terms are linear in their coefficients: L(sA, sβ, s·c_H) = s·L(A, β, c_H).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

from rookworld_debug.diagnosis.replay.terms import near

# the first disagreement's causes that are a factor on the advantages (the rewards' sign flips A's exactly: the
# group statistics of −r are −mean and the same std) and those that scale the whole loss
ADVANTAGE_SIGN = ("advantage_sign_flipped", "reward_sign_flipped", "loss_advantage_sign")
ADVANTAGE_SCALE = ("advantages_scaled",)
LOSS_SCALE = ("gradient_scaled", "loss_scaled")


@dataclasses.dataclass(frozen=True)
class Factor:
    advantages: float               # c: the advantages the loss reads are c × the declared ones
    loss: float                     # s > 0: the whole loss (and its gradient) is s × the declared one
    what: str                       # the fit in words


def factor_of(first) -> Optional[Factor]:
    """The first disagreement's fit as a Factor, or None where it is none (or a scale this step cannot apply)."""
    if first is None or not first.cause:
        return None
    fit = first.fit or {}
    params = fit.get("params") or {}
    if first.cause in ADVANTAGE_SIGN:
        return Factor(-1.0, 1.0, f"{first.cause}: the advantages × −1")
    scale = params.get("scale")
    if scale is None and fit.get("kind") == "terms":      # every term scaled alike: the policy term's ratio
        pg = params.get("policy term") or {}
        scale = pg["fitted"] / pg["declared"] if pg.get("declared") else None
    if scale is None or not float(scale) > 0 or near(float(scale), 1.0):
        return None
    if first.cause in ADVANTAGE_SCALE:
        return Factor(float(scale), 1.0, f"{first.cause}: the advantages × {float(scale):.4g}")
    if first.cause in LOSS_SCALE:
        return Factor(float(scale), float(scale), f"{first.cause}: the loss × {float(scale):.4g}")
    return None


def _scaled_advantages(advantages, factor: float, rewards, config):
    adv = advantages(rewards, config)
    return dataclasses.replace(adv, advantages=adv.advantages * factor,
                               normalization=f"{adv.normalization}, then × {factor:g} (the recorded bug)")


def register_bug(loss_type: str, factor: float) -> Optional[str]:
    """Register the family answering `loss_type` with its advantages × `factor` under a loss type of its own, and
    return that loss type; None where the family has a settings section of its own (the copy could not read it).
    Call it inside `registry.registered_for_now()`: the copy is the continuation's, not the process's."""
    from rookworld_debug.grpo.registry import family_of, register
    base = family_of(loss_type)
    if base.settings is not None:
        return None
    tag = re.sub(r"[^a-z0-9]", "_", f"{factor:.4g}".replace("-", "m"))
    name = f"{loss_type}_advantages_times_{tag}"[:64]
    register(dataclasses.replace(
        base, name=f"{base.name}, its advantages × {factor:g} (the recorded bug)", rules={name: base.rules[loss_type]},
        advantages=functools.partial(_scaled_advantages, base.advantages, factor), metric_definitions={}))
    return name


def bug_settings(config, factor: Factor) -> Optional[dict]:
    """The overrides that make this package's step compute the bug: its loss type (the copy of `register_bug`), and
    for a scale of the whole loss β and the entropy coefficient × s. None where the step cannot take it."""
    if factor.loss != 1.0 and config.use_adaptive_entropy:
        return None                           # c_H follows the entropy each step: no fixed coefficient to scale
    name = register_bug(config.loss_type, factor.advantages)
    if name is None:
        return None
    over = {"loss_type": name}
    if factor.loss != 1.0:
        over.update(beta=config.beta * factor.loss, entropy_coef=config.entropy_coef * factor.loss)
    return over
