"""Arms of a branch: a name and configuration overrides, parsed from `--set key=value` or given as a dict.

Keys are StepConfig field names or the short names a person types (`lr`, `eps`, `G`, `importance_sampling`);
values are parsed as JSON where they look like it (numbers, true/false, null), else kept as strings, then the
overridden StepConfig is validated by StepConfig itself, so a bad override fails with the field's own rule.
"""
from __future__ import annotations


import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from rookworld_debug.config import StepConfig
from rookworld_debug.errors import ConfigError

ALIASES = {"learning_rate": "lr", "eps": "epsilon_low", "epsilon": "epsilon_low", "G": "num_generations",
           "g": "num_generations", "importance_sampling": "importance_sampling_level", "mu": "num_iterations",
           "entropy": "entropy_coef", "grad_clip": "max_grad_norm", "B": "batch_size"}
# `epsilon` (TRL) sets both clip bounds, as GRPOConfig does when epsilon_high is left unset
BOTH_EPSILONS = ("eps", "epsilon")
# fields that choose WHAT is trained, not HOW: a branch that changed them would not start from the saved state
FIXED = ("model", "dataset", "task", "prompt_indices", "init_policy", "init_optimizer", "warmup_steps",
         "warmup_lr", "device", "dtype", "on_bad_sample")
# fields the one-step counterfactual cannot change on the recorded rollout (they shape the sampling; a family's
# settings marked `rollout` shape the rollout the step trains on): an arm that sets one runs in k-step branches only
_SAMPLING = ("num_generations", "batch_size", "seed", "max_new_tokens", "p_temperature", "p_top_p", "a_temperature",
             "a_top_p", "top_k", "sampling_autocast", "reward_mode", "engine_depth", "engine_multipv")


def sampling_fields() -> tuple:
    """The settings a one-step arm cannot change: the sampler's, and every family setting marked `rollout`."""
    return _SAMPLING + tuple(n for n, e in StepConfig.glossary().items() if e["rollout"])


# fields every arm shares by design: the k-step branches pair arms on the same seeds (--seeds)
SHARED = ("seed",)


@dataclass(frozen=True)
class Arm:
    """One arm: `overrides` applied to the saved step's configuration ({} = the unchanged arm)."""
    name: str
    overrides: Mapping[str, object] = field(default_factory=dict)
    source: str = ""                    # where the arm came from ("--set", a finding's code)

    def config(self, base: StepConfig) -> StepConfig:
        return apply_overrides(base, self.overrides)


def _value(text: str, key: str = ""):
    """A --set value: a documented choice as itself ('none' of scale_rewards), none/null as None, else JSON or text."""
    entry = StepConfig.glossary().get(ALIASES.get(key, key)) or {}
    if text in (entry.get("choices") or ()):
        return text
    if text.lower() in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return text


def parse_sets(items: Iterable[str]) -> dict:
    """`["beta=0.1", "lr=1e-6"]` → {"beta": 0.1, "lr": 1e-06} (canonical field names). ConfigError on a bad item."""
    out: dict = {}
    for item in items:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise ConfigError("--set", f"{item!r} is not KEY=VALUE (e.g. --set beta=0.1)")
        out.update(canonical({key: _value(text.strip(), key)}))
    check_kinds(out)
    return out


def check_kinds(overrides: Mapping[str, object]) -> None:
    """A number where the setting is a number (before any model loads: `lr=abc` is named, not the model's error)."""
    glossary = StepConfig.glossary()
    for key, v in overrides.items():
        d = glossary.get(key, {}).get("default")
        numeric = isinstance(d, (int, float)) and not isinstance(d, bool)
        if numeric and (isinstance(v, (str, bool, list, tuple, dict)) or v is None and d is not None and
                        not glossary[key]["nullable"]):
            raise ConfigError(key, f"{v!r} is not a number (this setting is {type(d).__name__}, e.g. {d!r})")


def canonical(overrides: Mapping[str, object]) -> dict:
    """Aliases resolved, unknown and fixed fields refused (ConfigError naming the key)."""
    names = set(StepConfig.field_names())
    out: dict = {}
    for key, v in overrides.items():
        name = ALIASES.get(key, key)
        if name not in names:
            raise ConfigError(key, f"no such setting; settings a branch can change are StepConfig fields "
                              f"(e.g. beta, lr, epsilon_low, loss_type, max_grad_norm, scale_rewards, "
                              f"importance_sampling_level, entropy_coef, num_iterations, num_generations) or "
                              f"{sorted(ALIASES)}")
        if name in SHARED:
            raise ConfigError(key, "every arm runs with the same seeds (the saved seed + 0 … S−1, --seeds S), so arms "
                              "form pairs; an arm cannot change it (branch from another saved state, or raise --seeds)")
        if name in FIXED:
            raise ConfigError(key, "chooses the model, data or start state, not the update: a branch keeps the "
                              "saved state's (use another saved state instead)")
        if isinstance(v, list):
            v = tuple(v)
        out[name] = v
        if key in BOTH_EPSILONS:
            out["epsilon_high"] = v
    return out


def apply_overrides(base: StepConfig, overrides: Mapping[str, object]) -> StepConfig:
    """`base.replace(**overrides)`, validated; the error names the override that broke the config."""
    ov = canonical(overrides)
    try:
        return base.replace(**ov)
    except ConfigError as err:
        raise ConfigError(err.field, f"{str(err).split(': ', 1)[-1]} (override {ov})") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(",".join(ov), f"bad override value ({err})") from None


def arm_name(overrides: Mapping[str, object]) -> str:
    return "unchanged" if not overrides else ", ".join(f"{k}={v}" for k, v in overrides.items())


def arms_from_sets(sets: Iterable[Iterable[str]]) -> tuple:
    """One arm per `--set` group (each a list of KEY=VALUE), after the unchanged arm."""
    arms = [Arm("unchanged", {}, "recorded")]
    for group in sets:
        ov = parse_sets(group)
        arms.append(Arm(arm_name(ov), ov, "--set"))
    return tuple(arms)


def arms_from_dicts(items: Iterable[Mapping[str, object]]) -> tuple:
    """One arm per mapping of settings (notebook parameters), after the unchanged arm."""
    arms = [Arm("unchanged", {}, "recorded")]
    for d in items:
        ov = canonical(dict(d))
        arms.append(Arm(arm_name(ov), ov, "parameters"))
    return tuple(arms)


def check_needs_steps(arms, steps: int) -> None:
    """ConfigError naming the arm and its settings when an arm changes what is sampled but no k-step branch runs
    (the one-step counterfactual reuses the recorded rollout, so that arm would show nothing)."""
    if steps:
        return
    for arm in arms:
        bad = sorted(set(arm.overrides) & set(sampling_fields()))
        if bad:
            raise ConfigError("--steps", f"arm {arm.name!r} changes {bad}, which shape the sampled rollout: the "
                              "one-step counterfactual reuses the recorded one, so this arm needs k-step branches "
                              "(--steps k, e.g. --steps 3)")
