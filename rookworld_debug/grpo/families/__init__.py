"""Objective families: each trainer whose step this package opens, behind one interface, found by `loss_type`.

A family says everything that differs between trainers around the shared phases: how it turns rewards into
advantages, its rows of the loss table (`LossRule`: per-token objective, aggregation, metrics, definition), how a
micro-batch's loss is weighted into the full batch's (the update accumulates micro-batches, so the summed
gradient equals the full-batch one only with the family's own weighting), and any sampler options or rollout
transform it needs. The phases ask `family_of(config.loss_type)`; they test no loss-type name and import no
family module.

Built in (`_load_builtin`, one import line each): TRL's GRPOTrainer losses (`trl`: grpo, bnpo, dr_grpo, dapo, cispo, sapo,
luspo, vespo), rookworld-trl's manual debug loop (`manual`) and rookworld-rlvr's mini (`rlvr_mini`).
`register` adds another; docs/DEVELOPING.md has the recipe.

Micro-batch weightings, w = the share of the full-batch loss one micro-batch's loss stands for:
  "rows"   means over sequences: w = n_mb / n
  "tokens" a token mean over the batch: w = Σ m[mb] / Σ m
  "global" the normaliser is already the batch's (e.g. num_items_in_batch): w = 1
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch

from rookworld_debug.errors import ConfigError

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
    label: str = ""                                 # the name in the normaliser's text ("" = the loss type)
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
    extra: dict = field(default_factory=dict)       # anything else a family's own views read

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


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make `family` answer its loss types (replacing whatever answered them)."""
    bad = [lt for lt, r in family.rules.items() if r.weighting not in WEIGHTINGS or r.entropy not in
           ("tokens", "sequences")]
    if bad or not family.rules:
        raise ValueError(f"family {family.name}: a rule for each loss type, its weighting one of {WEIGHTINGS} "
                         f"and its entropy 'tokens' or 'sequences' (bad: {bad})")
    from rookworld_debug.config import allow_loss_type
    for lt in family.rules:
        _FAMILIES[lt] = family
        allow_loss_type(lt)
    return family


def family_of(loss_type: str) -> Family:
    """The family that answers `loss_type`; ConfigError naming the known ones otherwise."""
    _load_builtin()
    if loss_type not in _FAMILIES:
        raise ConfigError("loss_type", f"{loss_type!r} is no registered objective family's loss type "
                                       f"(known: {sorted(_FAMILIES)})")
    return _FAMILIES[loss_type]


def rule_of(loss_type: str) -> LossRule:
    """`loss_type`'s row of the loss table."""
    return family_of(loss_type).rules[loss_type]


def families() -> tuple:
    """Every registered family, once each."""
    _load_builtin()
    return tuple({id(f): f for f in _FAMILIES.values()}.values())


def advantages_from_config(rewards, config):
    """The Advantages record of the config's objective family."""
    return family_of(config.loss_type).advantages(rewards, config)


def check_settings(config) -> None:
    """ConfigError for what the config's family cannot run (its `check_config`), and for a field only another
    family reads, set while `config.loss_type` is not one of its (e.g. rookworld-rlvr's pipeline faults under
    TRL's grpo): it would be silently ignored."""
    from rookworld_debug.grpo.objective.params import Objective
    active = family_of(config.loss_type)
    active.check_config(config)
    rule = active.rules[config.loss_type]
    if rule.check is not None:
        rule.check(Objective.from_config(config))       # the loss type's own knobs (e.g. vespo's IS mode)
    for fam in families():
        names = () if fam is active else fam.own_settings(config)
        if names:
            raise ConfigError(names[0], f"only {fam.name} reads it (loss_type in {list(fam.loss_types)}); "
                                        f"loss_type={config.loss_type!r} would ignore it")


def _load_builtin() -> None:
    """The built-in families, imported on first use (each module registers itself)."""
    if not _LOADED:
        _LOADED.append(True)
        from rookworld_debug.grpo.families import trl  # noqa: F401
        from rookworld_debug.grpo.families import manual  # noqa: F401
        from rookworld_debug.grpo.families.rlvr_mini import family  # noqa: F401


_LOADED: list = []
