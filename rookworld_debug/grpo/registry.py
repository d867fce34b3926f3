"""The objective-family interface and its registry: `LossRule` (one loss type's row of the loss table), `Family`
(one trainer's objective), `register` and `family_of`.

A family says everything that differs between trainers around the shared phases: how it turns rewards into
advantages, its rows of the loss table (per-token objective, aggregation, metrics, definition), how a micro-batch's
loss is weighted into the full batch's (the update accumulates micro-batches, so the summed gradient equals the
full-batch one only with the family's own weighting), its own settings (a section of StepConfig), and any sampler
options or rollout transform it needs. The phases and the objective ask `family_of(config.loss_type)`: they test no
loss-type name and import no family module. This module sits below them; the concrete families
(`grpo.families`) above, and they register themselves here.

Micro-batch weightings, w = the share of the full-batch loss one micro-batch's loss stands for:
  "rows"   means over sequences: w = n_mb / n
  "tokens" a token mean over the batch: w = Σ m[mb] / Σ m
  "global" the normaliser is already the batch's (e.g. num_items_in_batch): w = 1
"""
from __future__ import annotations

import contextlib
import dataclasses
import re

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch

from rookworld_debug import metrics
from rookworld_debug import settings as config_settings
from rookworld_debug.errors import ConfigError

__all__ = ["WEIGHTINGS", "Family", "LossRule", "register", "registered_for_now", "checked", "family_of", "rule_of",
           "families", "advantages_from_config"]

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
    help: str = ""                                  # the loss type's definition in StepConfig's loss_type help

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
    # StepConfig -> its settings set that make the step train other than what the sampler drew (exact_sampler)
    own_settings: Callable = lambda config: ()
    check_config: Callable = lambda config: None    # StepConfig -> None; ConfigError for what it cannot run
    settings: Optional[type] = None                 # its knobs: a @settings.section class (StepConfig, flat)
    metric_definitions: Mapping[str, str] = field(default_factory=dict)   # its own metrics' keys → definitions

    @property
    def loss_types(self) -> tuple:
        return tuple(self.rules)

    def exact_sampler(self, config) -> bool:
        """Whether the step trains what an exact sampler drew (no family sampler option or transform active)."""
        return not any(self.sampler_options(config).values()) and not self.own_settings(config)

    def knobs_set(self, config) -> tuple:
        """The fields of its settings section that `config` sets away from their defaults."""
        if self.settings is None:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.settings)
                     if getattr(config, f.name) != (f.default_factory() if f.default is dataclasses.MISSING
                                                    else f.default))

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
        if not isinstance(rule.help, str):
            _refuse(family, f"the rule of {lt!r}: its help is the loss type's definition, a string")
        if rule.objective is None and family.loss is None:
            _refuse(family, f"the rule of {lt!r} has no objective and the family no loss of its own")
        if rule.objective is not None and not (callable(rule.objective) and callable(rule.aggregation)):
            _refuse(family, f"the rule of {lt!r}: objective and aggregation must both be callables")
    for hook in CALLABLES:
        if not callable(getattr(family, hook)):
            _refuse(family, f"its {hook} must be callable")
    defs = family.metric_definitions
    if not isinstance(defs, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in defs.items()):
        _refuse(family, "its metric_definitions must map metric keys to their definitions (strings)")
    for hook in HOOKS:
        if getattr(family, hook) is not None and not callable(getattr(family, hook)):
            _refuse(family, f"its {hook} must be None or callable")


def _same(a: Family, b: Family) -> bool:
    """The same family registered again (its module imported twice): same name, advantages from the same module,
    the same rules (objective and aggregation by module and name) and the same settings section. A copy with one
    rule changed is another family."""
    return a is b or _fingerprint(a) == _fingerprint(b)


def _fn(fn) -> tuple:
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) if fn is not None else ()


def _fingerprint(f: Family) -> tuple:
    rules = tuple(sorted((lt, _fn(r.objective), _fn(r.aggregation), r.weighting, r.entropy, r.help)
                         for lt, r in f.rules.items()))
    return (f.name, _fn(f.advantages), _fn(f.loss), rules, getattr(f.settings, "SECTION", None),
            getattr(f.settings, "__module__", None))


def register(family: Family, *, replace: bool = False) -> Family:
    """Make `family` answer its loss types and StepConfig accept them and its settings (docs/DEVELOPING.md has the
    recipe). The built-in families load first, so a loss type they answer is refused whatever the import order,
    unless `replace=True`; ConfigError names the family and what is wrong with it (a loss type that is not a name,
    a rule without an objective, a hook that is not callable, a setting another section declares)."""
    config_settings.load_builtin()
    _check_family(family)
    taken = {lt: FAMILIES[lt].name for lt in family.rules if lt in FAMILIES and not _same(FAMILIES[lt], family)}
    if taken and not replace:
        _refuse(family, f"loss type(s) {taken} already answered by another family; pass replace=True to replace")
    section = getattr(family.settings, "SECTION", None)
    owners = {f.name for f in FAMILIES.values() if section is not None and not _same(f, family)
              and getattr(f.settings, "SECTION", None) == section}
    if owners and not replace:
        _refuse(family, f"settings section {section!r} is already declared by {sorted(owners)}; pass replace=True "
                        "to replace it")
    try:
        config_settings.register(family.settings, {lt: rule.help for lt, rule in family.rules.items()})
    except ConfigError as err:
        _refuse(family, str(err).split(": ", 1)[-1])
    metrics.define(dict(family.metric_definitions))
    for lt in family.rules:
        FAMILIES[lt] = family
    return family


@contextlib.contextmanager
def registered_for_now():
    """Registrations made inside the block are undone after it: the registry, the loss types and settings sections
    StepConfig accepts and the metric definitions come back as they were (they are process-wide)."""
    config_settings.load_builtin()
    tables = (FAMILIES, config_settings._LOSS_TYPES, config_settings._SECTIONS, config_settings._OWNER,
              metrics.FAMILY_DEFINITIONS)
    saved = [dict(t) for t in tables]
    try:
        yield
    finally:
        for table, old in zip(tables, saved):
            table.clear()
            table.update(old)


def checked(family: Family, hook: str, result, kind, what: str):
    """`result` of `family`'s `hook` when it is a `kind`; ConfigError naming the family and the hook otherwise."""
    if not isinstance(result, kind):
        _refuse(family, f"its {hook} returned a {type(result).__name__}, not {what}")
    return result


def family_of(loss_type: str) -> Family:
    """The family that answers `loss_type`; ConfigError naming the known ones otherwise."""
    config_settings.load_builtin()
    if loss_type not in FAMILIES:
        raise ConfigError("loss_type", f"{loss_type!r} is no registered objective family's loss type "
                                       f"(known: {sorted(FAMILIES)})")
    return FAMILIES[loss_type]


def rule_of(loss_type: str) -> LossRule:
    """`loss_type`'s row of the loss table."""
    return family_of(loss_type).rules[loss_type]


def families() -> tuple:
    """Every registered family, once each."""
    config_settings.load_builtin()
    return tuple({id(f): f for f in FAMILIES.values()}.values())


def advantages_from_config(rewards, config):
    """The Advantages record of the config's objective family (see `family_advantages`)."""
    return family_advantages(family_of(config.loss_type), rewards, config)


def family_advantages(fam: Family, rewards, config):
    """`fam`'s Advantages record of `rewards` under `config` (ConfigError naming the family when its hook returns
    anything else; the record is named, not imported: the registry sits below the phases)."""
    out = fam.advantages(rewards, config)
    if type(out).__name__ != "Advantages":
        checked(fam, "advantages", out, (), "an Advantages record")
    return out
