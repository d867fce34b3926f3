"""The β and learning-rate schedules of a multi-step run (`grpo.multistep.loop.run_steps` applies them).

β_k = `BetaController.beta_for(k)` is computed BEFORE step k's loss from steps < k only (constant, warm-up, or
adaptive on the RAW KL, never β·KL); lr_k = `LRSchedule.lr_at(k)` is written into the optimizer BEFORE step k's
optimizer step. Both are pure functions of (config, k) plus the controller's state, which a checkpoint keeps.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Optional

from rookworld_debug.config import StepConfig
from rookworld_debug.errors import ConfigError

BETA_KINDS = ("constant", "warmup", "adaptive")
LR_KINDS = ("constant", "linear", "cosine", "warmup_cosine")


@dataclass(frozen=True)
class BetaSchedule:
    """β per step (0-based step k; β_k is fixed BEFORE step k's loss is computed).

    - 'constant': β_k = target for every k.
    - 'warmup':   β_k = 0 for k < warmup_steps, β_k = target for k ≥ warmup_steps. With
                  warmup_steps = 3, steps 0, 1, 2 have β = 0 and step 3 is the first KL-penalised step.
    - 'adaptive': TRL/PPO `AdaptiveKLController` on the RAW KL (nats/token, `trace.loss.kl`), after an
                  optional warmup as above (β = 0, controller idle). β_K = target, then after each step
                  k ≥ K:  e = clip(KL_k / target_kl − 1, −clip, +clip);  β_{k+1} = β_k · (1 + e / horizon).
                  (TRL multiplies e by n_steps/horizon with n_steps = samples seen; here n_steps = 1
                  optimizer step, so `horizon` is in steps: with clip 0.2 and horizon 10, β moves at most
                  ±2 % per step.) KL > target → β rises; KL < target → β falls. A step without a
                  finite KL (update refused, no reference) leaves β unchanged.
    `target=None` takes `config.beta`.
    """
    kind: str = "constant"
    target: Optional[float] = None
    warmup_steps: int = 0
    target_kl: float = 0.1
    horizon: float = 10.0
    clip: float = 0.2

    def __post_init__(self):
        if self.kind not in BETA_KINDS:
            raise ConfigError("beta_schedule", f"unknown kind {self.kind!r}; expected one of {list(BETA_KINDS)}")
        if self.target is not None and not (math.isfinite(self.target) and self.target >= 0):
            raise ConfigError("beta_schedule.target", f"must be ≥ 0, got {self.target!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError("beta_schedule.warmup_steps", f"must be an integer ≥ 0, got {self.warmup_steps!r}")
        if not self.target_kl > 0:
            raise ConfigError("beta_schedule.target_kl", f"must be > 0, got {self.target_kl!r}")
        if not self.horizon > 0:
            raise ConfigError("beta_schedule.horizon", f"must be > 0, got {self.horizon!r}")
        if not 0 < self.clip < 1:
            raise ConfigError("beta_schedule.clip", f"must be in (0, 1), got {self.clip!r}")

    def resolved(self, config: StepConfig) -> "BetaSchedule":
        out = self if self.target is not None else dataclasses.replace(self, target=float(config.beta))
        if out.kind == "adaptive" and out.target <= 0:
            raise ConfigError("beta_schedule.target", "the adaptive controller is multiplicative: its initial β "
                              "(target, default config.beta) must be > 0")
        return out


class BetaController:
    """Holds the schedule's state (the adaptive controller's current value) and answers β_k."""

    def __init__(self, schedule: BetaSchedule):
        if schedule.target is None:
            raise ConfigError("beta_schedule.target", "resolve the schedule first (BetaSchedule.resolved(config))")
        self.schedule = schedule
        self.value = float(schedule.target)       # adaptive: β for the next step ≥ warmup
        self.history: list[dict] = []             # one entry per observe(): step, kl, error, β before/after

    def beta_for(self, step: int) -> float:
        s = self.schedule
        if s.kind in ("warmup", "adaptive") and step < s.warmup_steps:
            return 0.0
        return float(s.target) if s.kind in ("constant", "warmup") else self.value

    def observe(self, step: int, kl: float) -> None:
        """Feed step `step`'s RAW KL (not β·KL). Only the adaptive kind, after warmup, changes β."""
        s = self.schedule
        if s.kind != "adaptive" or step < s.warmup_steps or kl is None or not math.isfinite(kl):
            return
        error = min(max(kl / s.target_kl - 1.0, -s.clip), s.clip)
        before = self.value
        self.value = before * (1.0 + error / s.horizon)
        self.history.append({"step": step, "kl": kl, "error": error, "beta_before": before, "beta_after": self.value})

    def state_dict(self) -> dict:
        return {"value": self.value, "history": list(self.history)}

    def load_state_dict(self, d: dict) -> None:
        self.value = float(d["value"])
        self.history = list(d.get("history", []))


@dataclass(frozen=True)
class LRSchedule:
    """Learning rate per step; `lr_at(k)` is written into the optimizer BEFORE step k's optimizer step
    (step 0 uses lr_at(0)). With w = warmup_steps, n = total_steps, base = `base` (None → config.lr):

    - k < w (every kind):  lr = base·(k+1)/w           (linear warmup; step 0 is not a zero-lr step)
    - k ≥ w, p = (k − w)/(n − w) ∈ [0, 1):
        'constant':      lr = base
        'linear':        lr = min_lr + (base − min_lr)·(1 − p)
        'cosine':        lr = min_lr + (base − min_lr)·½(1 + cos πp)
        'warmup_cosine': 'cosine' with w defaulting to max(1, n // 10) when warmup_steps = 0.
    The decay reaches min_lr at k = n, one past the last step, so the last step still trains (as HF's
    schedulers). `total_steps=None` takes the run's `steps`.
    """
    kind: str = "constant"
    base: Optional[float] = None
    warmup_steps: int = 0
    min_lr: float = 0.0
    total_steps: Optional[int] = None

    def __post_init__(self):
        if self.kind not in LR_KINDS:
            raise ConfigError("lr_schedule", f"unknown kind {self.kind!r}; expected one of {list(LR_KINDS)}")
        if self.base is not None and not (math.isfinite(self.base) and self.base >= 0):
            raise ConfigError("lr_schedule.base", f"must be ≥ 0, got {self.base!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError("lr_schedule.warmup_steps", f"must be an integer ≥ 0, got {self.warmup_steps!r}")
        if not self.min_lr >= 0:
            raise ConfigError("lr_schedule.min_lr", f"must be ≥ 0, got {self.min_lr!r}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ConfigError("lr_schedule.total_steps", f"must be ≥ 1, got {self.total_steps!r}")

    def resolved(self, config: StepConfig, steps: int) -> "LRSchedule":
        out = dataclasses.replace(self, base=float(config.lr) if self.base is None else self.base,
                                  total_steps=steps if self.total_steps is None else self.total_steps)
        if out.kind == "warmup_cosine" and out.warmup_steps == 0:
            out = dataclasses.replace(out, warmup_steps=max(1, out.total_steps // 10))
        if out.warmup_steps >= out.total_steps and out.kind != "constant":
            raise ConfigError("lr_schedule.warmup_steps", f"{out.warmup_steps} warmup steps leave no decay phase in "
                              f"{out.total_steps} steps")
        return out

    def lr_at(self, step: int) -> float:
        if self.base is None or self.total_steps is None:
            raise ConfigError("lr_schedule", "resolve the schedule first (LRSchedule.resolved(config, steps))")
        base, w, n = self.base, self.warmup_steps, self.total_steps
        if step < w:
            return base * (step + 1) / w
        if self.kind == "constant":
            return base
        p = (step - w) / max(1, n - w)
        if self.kind == "linear":
            return self.min_lr + (base - self.min_lr) * (1.0 - p)
        return self.min_lr + (base - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def _as_beta(x, config) -> BetaSchedule:
    x = BetaSchedule() if x is None else BetaSchedule(kind=x) if isinstance(x, str) else \
        BetaSchedule(**x) if isinstance(x, Mapping) else x
    return x.resolved(config)


def _as_lr(x, config, steps) -> LRSchedule:
    x = LRSchedule() if x is None else LRSchedule(kind=x) if isinstance(x, str) else \
        LRSchedule(**x) if isinstance(x, Mapping) else x
    return x.resolved(config, steps)
