"""The objective-family interface: `LossRule` (one loss type's row of the loss table), `Family` (one trainer's
objective) and `register`. Families import this module; the phases find them through `grpo.families.family_of`.
"""
from __future__ import annotations

import re

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


LOSS_TYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
HOOKS = ("loss", "prepare", "update_config", "rollout_transform")          # optional: None or callable
CALLABLES = ("advantages", "sampler_options", "own_settings", "check_config")


def _refuse(family, why: str):
    from rookworld_debug.errors import ConfigError
    name = getattr(family, "name", family)
    raise ConfigError("register", f"family {name!r}: {why}")


def _check_family(family) -> None:
    if not isinstance(family, Family):
        _refuse(family, f"a grpo.families.Family is registered, not a {type(family).__name__}")
    if not isinstance(family.name, str) or not family.name.strip():
        _refuse(family, "its name must be a non-empty string")
    if not isinstance(family.rules, Mapping) or not family.rules:
        _refuse(family, "rules must map at least one loss type to its LossRule")
    for lt, rule in family.rules.items():
        if not isinstance(lt, str) or not LOSS_TYPE_NAME.fullmatch(lt):
            _refuse(family, f"loss type {lt!r} is not a name (lower-case letters, digits, _; a letter first)")
        if not isinstance(rule, LossRule):
            _refuse(family, f"the rule of {lt!r} is a {type(rule).__name__}, not a LossRule")
        if rule.weighting not in WEIGHTINGS or rule.entropy not in ("tokens", "sequences"):
            _refuse(family, f"the rule of {lt!r}: its weighting one of {WEIGHTINGS} and its entropy 'tokens' or "
                            f"'sequences' (got {rule.weighting!r}, {rule.entropy!r})")
        if rule.objective is None and family.loss is None:
            _refuse(family, f"the rule of {lt!r} has no objective and the family no loss of its own")
        if rule.objective is not None and not (callable(rule.objective) and callable(rule.aggregation)):
            _refuse(family, f"the rule of {lt!r}: objective and aggregation must both be callables")
    for hook in CALLABLES:
        if not callable(getattr(family, hook)):
            _refuse(family, f"its {hook} must be callable")
    for hook in HOOKS:
        if getattr(family, hook) is not None and not callable(getattr(family, hook)):
            _refuse(family, f"its {hook} must be None or callable")


def _same(a: Family, b: Family) -> bool:
    """The same family registered again (its module imported twice): same name, advantages from the same module."""
    return a is b or (a.name == b.name and getattr(a.advantages, "__module__", None) ==
                      getattr(b.advantages, "__module__", None))


def register(family: Family, *, replace: bool = False) -> Family:
    """Make `family` answer its loss types. A loss type another family answers is refused unless `replace=True`;
    ConfigError names the family and what is wrong. (`grpo.families.register`, the public one, loads the built-in
    families first, so a built-in is never shadowed by import order.)"""
    _check_family(family)
    taken = {lt: FAMILIES[lt].name for lt in family.rules if lt in FAMILIES and not _same(FAMILIES[lt], family)}
    if taken and not replace:
        _refuse(family, f"loss type(s) {taken} already answered by another family; pass replace=True to replace")
    from rookworld_debug.config import allow_loss_type
    for lt in family.rules:
        FAMILIES[lt] = family
        allow_loss_type(lt)
    return family


def checked(family: Family, hook: str, result, kind, what: str):
    """`result` of `family`'s `hook` when it is a `kind`; ConfigError naming the family and the hook otherwise."""
    if not isinstance(result, kind):
        _refuse(family, f"its {hook} returned a {type(result).__name__}, not {what}")
    return result
