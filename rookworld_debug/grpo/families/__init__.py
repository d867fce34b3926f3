"""The objective families built in: each trainer whose step this package opens, one module each, registered with
the family registry (`grpo.registry`) when imported. The package's root module imports this one the first time a
config or the registry is read.

Built in (one import line each): TRL's GRPOTrainer losses (`trl`: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo,
vespo), rookworld-trl's manual debug loop (`manual`) and rookworld-rlvr's mini (`rlvr_mini`). `register` adds
another; docs/DEVELOPING.md has the recipe.
"""
from __future__ import annotations

from rookworld_debug.grpo.registry import (WEIGHTINGS, Family, LossRule, advantages_from_config, checked, families,
                                           family_of, register, rule_of)
from rookworld_debug.grpo.families import trl  # noqa: F401,E402
from rookworld_debug.grpo.families import manual  # noqa: F401,E402
from rookworld_debug.grpo.families.rlvr_mini import family  # noqa: F401,E402

__all__ = ["WEIGHTINGS", "Family", "LossRule", "register", "checked", "family_of", "rule_of", "families",
           "advantages_from_config", "check_settings"]


def __getattr__(name: str):
    if name == "check_settings":          # the phases' check, served lazily: loading the families loads no model code
        from rookworld_debug.grpo.phases.setup import check_settings
        return check_settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
