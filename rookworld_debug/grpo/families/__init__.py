"""Objective families: each trainer whose step this package opens, behind one interface, found by `loss_type`.

A family says everything that differs between trainers around the shared phases: how it turns rewards into
advantages, its rows of the loss table (`LossRule`: per-token objective, aggregation, metrics, definition), how a
micro-batch's loss is weighted into the full batch's (the update accumulates micro-batches, so the summed
gradient equals the full-batch one only with the family's own weighting), and any sampler options or rollout
transform it needs. The phases ask `family_of(config.loss_type)`; they test no loss-type name and import no
family module.

Built in (`_load_builtin`, one import line each): TRL's GRPOTrainer losses (`trl`: grpo, bnpo, dr_grpo, dapo,
cispo, sapo, luspo, vespo), rookworld-trl's manual debug loop (`manual`) and rookworld-rlvr's mini (`rlvr_mini`).
`register` adds another; docs/DEVELOPING.md has the recipe.

Micro-batch weightings, w = the share of the full-batch loss one micro-batch's loss stands for:
  "rows"   means over sequences: w = n_mb / n
  "tokens" a token mean over the batch: w = Σ m[mb] / Σ m
  "global" the normaliser is already the batch's (e.g. num_items_in_batch): w = 1
"""
from __future__ import annotations

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.families import base
from rookworld_debug.grpo.families.base import FAMILIES, WEIGHTINGS, Family, LossRule, checked

__all__ = ["WEIGHTINGS", "Family", "LossRule", "register", "checked", "family_of", "rule_of", "families",
           "advantages_from_config", "check_settings"]


def register(family: Family, *, replace: bool = False) -> Family:
    """Make `family` answer its loss types (docs/DEVELOPING.md has the recipe). The built-in families load first,
    so a loss type they answer is refused whatever the import order, unless `replace=True`; ConfigError names the
    family and what is wrong with it (a loss type that is not a name, a rule without an objective, a hook that is
    not callable)."""
    _load_builtin()
    return base.register(family, replace=replace)


def family_of(loss_type: str) -> Family:
    """The family that answers `loss_type`; ConfigError naming the known ones otherwise."""
    _load_builtin()
    if loss_type not in FAMILIES:
        raise ConfigError("loss_type", f"{loss_type!r} is no registered objective family's loss type "
                                       f"(known: {sorted(FAMILIES)})")
    return FAMILIES[loss_type]


def rule_of(loss_type: str) -> LossRule:
    """`loss_type`'s row of the loss table."""
    return family_of(loss_type).rules[loss_type]


def families() -> tuple:
    """Every registered family, once each."""
    _load_builtin()
    return tuple({id(f): f for f in FAMILIES.values()}.values())


def advantages_from_config(rewards, config):
    """The Advantages record of the config's objective family (ConfigError naming the family when its hook returns
    anything else; the record is named, not imported: the registry sits below the phases)."""
    fam = family_of(config.loss_type)
    out = fam.advantages(rewards, config)
    if type(out).__name__ != "Advantages":
        checked(fam, "advantages", out, (), "an Advantages record")
    return out


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
        names = () if fam is active else checked(fam, "own_settings", fam.own_settings(config), (tuple, list),
                                                 "a sequence of setting names")
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
