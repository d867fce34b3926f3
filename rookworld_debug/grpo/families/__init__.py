"""Objective families: each trainer whose step this package opens, behind one interface, found by `loss_type`.

A family says what differs between trainers around the shared phases: how it turns rewards into advantages
and how a micro-batch's loss is weighted into the full batch's (the update accumulates micro-batches, so the
summed gradient equals the full-batch one only with the family's own weighting). The step asks
`family_of(config.loss_type)` instead of testing loss-type names.

Built in: TRL's GRPOTrainer losses (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo), rookworld-trl's
manual debug loop ("manual") and rookworld-rlvr's mini ("rlvr_mini"). `register` adds another.

Micro-batch weightings, w = the share of the full-batch loss one micro-batch's loss stands for:
  "rows"   means over sequences: w = n_mb / n
  "tokens" a token mean over the batch: w = Σ m[mb] / Σ m
  "global" the normaliser is already the batch's (e.g. num_items_in_batch): w = 1
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch

from rookworld_debug.errors import ConfigError

WEIGHTINGS = ("rows", "tokens", "global")


@dataclass(frozen=True)
class Family:
    """One trainer's objective: its loss types, advantages and micro-batch weighting."""
    name: str
    loss_types: tuple                               # the `loss_type` values this family answers
    advantages: Callable                            # (rewards (N,), StepConfig) -> Advantages
    pg_weighting: Mapping[str, str]                 # loss_type -> one of WEIGHTINGS (the pg and KL terms)
    entropy_weighting: Optional[str] = None         # the entropy bonus's; None = as the pg term
    # (ℓ, ℓ_old, ℓ_ref, A, m, Objective, LossBatch) -> LossBreakdown, or its fields as a dict (normalizer as
    # (name, value, description)); None = the loss table (grpo/objective/loss.py)
    loss: Optional[Callable] = None
    # (rollout, Advantages, Objective, m) -> (Objective, LossBatch fields): once per step, before the loss record
    prepare: Optional[Callable] = None
    # (StepConfig, the step's LossBreakdown) -> the StepConfig the update runs with (the mini: its controlled β)
    update_config: Optional[Callable] = None
    needs_reference: bool = False                   # the loss reads ℓ_ref whatever β (the mini's ratio)

    def mb_weight(self, loss_type: str, rows: slice, n: int, mask: torch.Tensor, *, entropy: bool = False) -> float:
        """Weight that turns a micro-batch loss (rows of the n-row batch, mask (n, T)) into its share of the
        full-batch loss."""
        kind = (entropy and self.entropy_weighting) or self.pg_weighting[loss_type]
        if kind == "rows":
            return (rows.stop - rows.start) / n
        if kind == "tokens":
            return float(mask[rows].sum().clamp(min=1)) / float(mask.sum().clamp(min=1))
        return 1.0


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make `family` answer its loss types (replacing whatever answered them)."""
    bad = {k: v for k, v in family.pg_weighting.items() if v not in WEIGHTINGS}
    if family.entropy_weighting not in (None, *WEIGHTINGS) or bad or set(family.pg_weighting) != set(family.loss_types):
        raise ValueError(f"family {family.name}: a weighting for each loss type, each one of {WEIGHTINGS}")
    from rookworld_debug.config import allow_loss_type
    for lt in family.loss_types:
        _FAMILIES[lt] = family
        allow_loss_type(lt)
    return family


def family_of(loss_type: str) -> Family:
    """The family that answers `loss_type`; ConfigError naming the known ones otherwise."""
    _builtin()
    if loss_type not in _FAMILIES:
        raise ConfigError("loss_type", f"{loss_type!r} is no registered objective family's loss type "
                                       f"(known: {sorted(_FAMILIES)})")
    return _FAMILIES[loss_type]


def advantages_from_config(rewards, config):
    """The Advantages record of the config's objective family: compute_advantages for TRL's losses,
    manual_advantages for 'manual', the rookworld-rlvr mini's baselines for 'rlvr_mini'."""
    return family_of(config.loss_type).advantages(rewards, config)


def _builtin() -> None:
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE.append(True)
    from rookworld_debug.grpo.phases import advantages as adv

    def trl_advantages(rewards, config):
        return adv.compute_advantages(rewards, config.num_generations, scale_rewards=config.scale_rewards,
                                      eps=config.adv_eps, std_ddof=config.std_ddof, clip=config.adv_clip)

    def manual_advantages(rewards, config):
        return adv.manual_advantages(rewards, config.num_generations, std_clamp=config.manual_std_clamp,
                                     clip=config.manual_adv_clip, std_ddof=config.std_ddof)

    # TRL's entropy bonus is a token mean of the micro-batch for every loss type → weight by token share
    register(Family("TRL GRPOTrainer", ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"),
                    trl_advantages, {**dict.fromkeys(("grpo", "dr_grpo", "sapo", "luspo"), "rows"), "bnpo": "tokens",
                                     **dict.fromkeys(("dapo", "cispo", "vespo"), "global")},
                    entropy_weighting="tokens"))
    register(Family("rookworld-trl manual loop", ("manual",), manual_advantages, {"manual": "rows"}))
    register(Family("rookworld-rlvr mini", ("rlvr_mini",), adv.rlvr_advantages_from_config, {"rlvr_mini": "rows"},
                    loss=_rlvr_loss, prepare=_rlvr_prepare, update_config=_rlvr_update_config, needs_reference=True))


def _rlvr_update_config(config, loss):
    return config.replace(beta=loss.beta) if config.rlvr_adaptive_kl else config   # the controller's kl_coef


def _rlvr_loss(logps, old, ref, advantages, mask, objective, batch):
    from rookworld_debug.grpo.families.rlvr_mini.loss import compute_rlvr_loss
    return compute_rlvr_loss(logps, ref, advantages, mask, objective, batch)


def _rlvr_prepare(rollout, advantages, objective, mask):
    from rookworld_debug.grpo.families.rlvr_mini.loss import rlvr_step       # the mini's KL controller and values
    return rlvr_step(rollout, advantages, objective, mask)


_BUILTIN_DONE: list = []
