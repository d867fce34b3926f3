"""The objective-family interface: `LossRule` (one loss type's row of the loss table), `Family` (one trainer's
objective) and `register`. Families import this module; the phases find them through `grpo.families.family_of`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch

WEIGHTINGS = ("rows", "tokens", "global")


def _no_text(objective, params: dict, ratio: str) -> str:
    return "PG (the family's own objective)"


@dataclass(frozen=True)
class LossRule:
    """One loss type's row of the loss table: what `compute_loss` composes for it (grpo/objective/loss.py)."""
    weighting: str                                  # micro-batch weighting of the pg and KL terms (WEIGHTINGS)
    objective: Optional[Callable] = None            # ObjectiveInputs -> PolicyTerm; None: the family's own `loss`
    aggregation: Optional[Callable] = None          # AggregationInputs -> Aggregation
    params: tuple = ()                              # the Objective fields the objective reads (loss_params)
    kl_bias_correction: bool = True                 # KL × r when use_bias_correction_kl (sampled-token estimators)
    entropy: str = "tokens"                         # H̄: "tokens" (micro-batch token mean) | "sequences" (row means)
    global_normaliser: bool = False                 # the policy_loss metric is not × g (dapo, cispo, vespo)
    sampling_ratio_inside: bool = False             # ρ enters the objective (vespo), not PG × ρ afterwards
    metrics: Optional[Callable] = None              # (PolicyTerm, mask (N, T)) -> the loss type's own metrics
    check: Optional[Callable] = None                # Objective -> None, ConfigError for a knob this row refuses
    text: Callable = _no_text                       # (Objective, params, "r = …") -> the definition's PG part

    @property
    def entropy_weighting(self) -> str:
        return "tokens" if self.entropy == "tokens" else "rows"


@dataclass(frozen=True)
class Family:
    """One trainer's objective: its loss types (rules), advantages and what it adds to the shared phases."""
    name: str
    rules: Mapping[str, LossRule]                   # loss_type -> its row of the loss table
    advantages: Callable                            # (rewards (N,), StepConfig) -> Advantages
    # (ℓ, ℓ_old, ℓ_ref, A, m, Objective, LossBatch) -> LossBreakdown, or its fields as a dict (normalizer as
    # (name, value, description)); None = the loss table (grpo/objective/loss.py)
    loss: Optional[Callable] = None
    # (rollout, Advantages, Objective, m) -> (Objective, LossBatch fields): once per step, before the loss record
    prepare: Optional[Callable] = None
    # (StepConfig, the step's LossBreakdown) -> the StepConfig the update runs with (the mini: its controlled β)
    update_config: Optional[Callable] = None
    needs_reference: bool = False                   # the loss reads ℓ_ref whatever β (the mini's ratio)
    kl_knob: str = "kl_estimator"                   # the StepConfig field naming its KL estimator
    sampler_options: Callable = lambda config: {}   # StepConfig -> the decode loop's options (generation)
    # (rollout, StepConfig, policy, reference, tokenizer) -> the rollout the step trains on; None = as sampled
    rollout_transform: Optional[Callable] = None
    own_settings: Callable = lambda config: ()      # StepConfig -> the fields set that only this family reads
    check_config: Callable = lambda config: None    # StepConfig -> None; ConfigError for what it cannot run

    @property
    def loss_types(self) -> tuple:
        return tuple(self.rules)

    def exact_sampler(self, config) -> bool:
        """Whether the step trains what an exact sampler drew (no family sampler option or transform active)."""
        return not any(self.sampler_options(config).values()) and not self.own_settings(config)

    def mb_weight(self, loss_type: str, rows: slice, n: int, mask: torch.Tensor, *, entropy: bool = False) -> float:
        """Weight that turns a micro-batch loss (rows of the n-row batch, mask (n, T)) into its share of the
        full-batch loss."""
        rule = self.rules[loss_type]
        kind = rule.entropy_weighting if entropy else rule.weighting
        if kind == "rows":
            return (rows.stop - rows.start) / n
        if kind == "tokens":
            return float(mask[rows].sum().clamp(min=1)) / float(mask.sum().clamp(min=1))
        return 1.0


FAMILIES: dict[str, Family] = {}     # loss_type -> its family


def register(family: Family) -> Family:
    """Make `family` answer its loss types (replacing whatever answered them)."""
    bad = [lt for lt, r in family.rules.items() if r.weighting not in WEIGHTINGS or r.entropy not in
           ("tokens", "sequences")]
    if bad or not family.rules:
        raise ValueError(f"family {family.name}: a rule for each loss type, its weighting one of {WEIGHTINGS} "
                         f"and its entropy 'tokens' or 'sequences' (bad: {bad})")
    from rookworld_debug.config import allow_loss_type
    for lt in family.rules:
        FAMILIES[lt] = family
        allow_loss_type(lt)
    return family
