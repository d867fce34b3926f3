"""The loss's parameters as one record: `Objective` (every knob, built once from a StepConfig) and `LossBatch`
(what one call adds besides the five (N, T) tensors: entropy, exact KL, sampling log-probs, the batch's
normalisers, the mini's per-step values).

Adding a loss knob: a field here (with TRL's name and default) and its StepConfig field of the same name;
`Objective.from_config` copies every field by name, and `grpo.objective.loss.compute_loss` reads it from the record.
A family's own knobs come as its settings section (`settings`), read by the family's own loss.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional, Union

import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.registry import families, family_of


@dataclass(frozen=True)
class Objective:
    """Every parameter of the GRPO loss (TRL 1.16 GRPOConfig names; `max_completion_length` is StepConfig's
    `max_new_tokens`). Formulas: grpo/objective/loss.py's module docstring and the loss type's family."""
    loss_type: str                                  # a registered family's loss type (dapo, grpo, ..., rlvr_mini)
    beta: float                                     # β: KL coefficient
    epsilon_low: float                              # ε_low: lower clip 1 − ε_low
    epsilon_high: float                             # ε_high: upper clip 1 + ε_high (cispo: the cap ε_max)
    max_completion_length: int                      # dr_grpo's constant normaliser
    importance_sampling_level: str = "token"        # "token" | "sequence" (GSPO)
    delta: Optional[float] = None                   # δ: two-sided clipping (None = off)
    entropy_coef: float = 0.0                       # c_H: entropy bonus
    kl_estimator: str = "k3"                        # k3 | k1 | k2 | full
    use_bias_correction_kl: bool = True             # KL × r (sampled-token estimators)
    off_policy_mask_threshold: Optional[float] = None  # OPSM τ (None = off)
    top_entropy_quantile: float = 1.0               # ρ: entropy mask (1 = off)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    vllm_importance_sampling_correction: bool = False  # sampling-time IS correction ρ (off by default here)
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_min: Optional[float] = None
    vllm_importance_sampling_clip_max: Optional[float] = 3.0
    settings: Any = None                            # the loss type's family's settings section (None: none)
    # the objective family answering loss_type (grpo.registry.Family), looked up once, here: the phases read it
    family: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.family is None or self.loss_type not in self.family.rules:   # none given, or another loss type's
            object.__setattr__(self, "family", family_of(self.loss_type))   # ConfigError naming the known types

    @classmethod
    def from_config(cls, config, family=None) -> "Objective":
        """The record of a StepConfig (any object with these attribute names; `max_new_tokens` gives
        max_completion_length), with its loss type's family (`family`, when the caller resolved it) and that
        family's settings section. Fields the object lacks keep their defaults."""
        kw = {f.name: getattr(config, f.name) for f in fields(cls)
              if f.name not in ("max_completion_length", "settings", "family") and hasattr(config, f.name)}
        family = family_of(config.loss_type) if family is None else family
        if family.settings is not None and hasattr(config, "section"):
            kw["settings"] = config.section(family.settings.SECTION)
        return cls(max_completion_length=config.max_new_tokens, family=family, **kw)

    def replace(self, **changes) -> "Objective":
        """A copy with some knobs changed (β/ε sliders, an annealed c_H, the mini's controlled kl_coef)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class LossBatch:
    """What one loss call needs besides (ℓ, ℓ_old, ℓ_ref, A, m): optional tensors and the batch's normalisers."""
    entropy: Optional[torch.Tensor] = None                  # (N, T) H_it (needed by c_H ≠ 0 and ρ < 1)
    per_token_full_kl: Optional[torch.Tensor] = None        # (N, T) exact KL (kl_estimator="full")
    sampling_per_token_logps: Optional[torch.Tensor] = None  # (N, T) sampler's log-probs (OPSM, IS correction)
    num_items_in_batch: Union[int, float, torch.Tensor, None] = None  # Σ m over the generation batch (dapo)
    num_generations: Optional[int] = None                   # G: enables per-group values
    gradient_accumulation_steps: int = 1                    # TRL's g
    steps_per_generation: Optional[int] = None              # TRL's (None = g)
    values: Optional[torch.Tensor] = None                   # (N,) the mini's values v (rlvr_values="rewards")
    value_targets: Optional[torch.Tensor] = None            # (N,) its targets v̂
    k1_observation: Optional[float] = None                  # what the mini's KL controller saw this step

    def replace(self, **changes) -> "LossBatch":
        return replace(self, **changes)


def resolve(config) -> Objective:
    """A step's objective, resolved once at its start: the family answering `config.loss_type`, its settings
    section and every loss knob. ConfigError first for what that family cannot run (its `check_config`), for the
    loss type's own knobs (e.g. vespo's IS mode), and for a knob of another family's settings section set away from
    its default: the step would silently ignore it (every family alike)."""
    objective = Objective.from_config(config)
    active = objective.family
    active.check_config(config)
    rule = active.rules[config.loss_type]
    if rule.check is not None:
        rule.check(objective)
    for fam in families():
        names = () if fam is active else fam.knobs_set(config)
        if names:
            raise ConfigError(names[0], f"only {fam.name} reads it (loss_type in {list(fam.loss_types)}); "
                                        f"loss_type={config.loss_type!r} would ignore it")
    return objective
