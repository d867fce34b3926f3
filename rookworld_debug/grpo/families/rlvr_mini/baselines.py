"""rookworld-rlvr "mini" advantages and KL control: its baselines, optional GAE, global normalisation, the
adaptive KL controller and its value head — each matching ../shared/fixtures/rlvr_mini_golden.json.

Shape legend: N rewards, K = group size (consecutive blocks; rows after the last complete group keep a raw
advantage of 0), B = ⌊N/K⌋ groups.

    raw_i   = r_i − b_g                     b_g per group:
              group_mean   mean_g(r)
              learned      mean_g(values) when values are given, else mean_g(r)
              adaptive     lower median_g(r) if std_g(r) (unbiased) > 0.1, else mean_g(r)
              ema          b ← mean_g(r) for the first group ever seen, then b ← 0.1·mean_g(r) + 0.9·b (one
                           update per group, in order; b is rounded to float32 before the subtraction)
    GAE     (only with use_gae AND values): raw ← reverse cumulative Σ with λ over the group's members,
            a_j = raw_j + λ·a_{j+1} (the values themselves do not enter)
    A       = (raw − mean(raw)) / (std(raw) + 1e-8) over the WHOLE batch if std(raw) > 1e-8 (unbiased), else raw

A zero-std group therefore stays at ≈ 0 only while every group is centred on its own mean (group_mean,
learned without values, adaptive using means); with ema, learned with values, a median baseline or GAE its
rows get A = −mean(raw)/std ≠ 0: a policy-gradient push with no reward difference behind it.

    AdaptiveKLController.update(x): history ← (history + [x])[−horizon:]; m = mean(last ≤ 100 entries);
    coef ×1.5 if m > 2·target, ×0.8 if m < 0.5·target (strict); clamp to [0.001, 1.0] on every update.
"""
from __future__ import annotations

from typing import Optional

import torch

from rookworld_debug.errors import ConfigError, DataError

BASELINES = ("group_mean", "ema", "learned", "adaptive")
EMA_ALPHA = 0.1                      # hard-coded in the mini
NORM_EPS = 1e-8
BASELINE_FORMULAS = {
    "group_mean": "b_g = mean_g(r)",
    "learned": "b_g = mean_g(values) (group mean without values)",
    "adaptive": "b_g = lower median_g(r) if std_g(r) > 0.1 else mean_g(r)",
    "ema": "b ← mean_g(r) first, then 0.1·mean_g(r) + 0.9·b per group (float32)",
}


def _baseline(group: torch.Tensor, kind: str, values: Optional[torch.Tensor], tracker: dict) -> torch.Tensor:
    if kind == "group_mean" or (kind == "learned" and values is None):
        return group.mean()
    if kind == "learned":
        return values.mean()
    if kind == "adaptive":
        return group.median() if group.std() > 0.1 else group.mean()
    mean = group.mean().item()
    if tracker.get("count", 0) == 0:
        tracker["ema_baseline"] = mean
    else:
        tracker["ema_baseline"] = EMA_ALPHA * mean + (1 - EMA_ALPHA) * tracker["ema_baseline"]
    tracker["count"] = tracker.get("count", 0) + 1
    return torch.tensor(tracker["ema_baseline"])          # the default dtype (float32), as in the mini


def _gae(adv: torch.Tensor, lam: float) -> torch.Tensor:
    out = torch.zeros_like(adv)
    run = 0.0
    for j in range(adv.shape[0] - 1, -1, -1):
        run = adv[j] + lam * run
        out[j] = run
    return out


def _check_inputs(rewards: torch.Tensor, group_size, baseline_type: str, values) -> None:
    """Named errors for what would otherwise divide by zero, return nothing or pair rows with other rows' values."""
    if baseline_type not in BASELINES:
        raise ConfigError("rlvr_baseline", f"unknown value {baseline_type!r}; expected one of {list(BASELINES)}")
    if isinstance(group_size, bool) or not hasattr(group_size, "__index__") or group_size < 1:
        raise ConfigError("group_size", f"must be a whole number ≥ 1, got {group_size!r}")
    if rewards.ndim != 1 or rewards.shape[0] == 0:
        raise DataError(f"rewards must be a non-empty 1-D tensor, got shape {tuple(rewards.shape)}")
    if values is not None and tuple(values.shape) != tuple(rewards.shape):
        raise DataError(f"values must hold one value per reward: shape {tuple(values.shape)} for rewards "
                        f"{tuple(rewards.shape)}")


def raw_advantages(rewards: torch.Tensor, group_size: int, baseline_type: str = "group_mean",
                   baseline_tracker: Optional[dict] = None, values: Optional[torch.Tensor] = None,
                   use_gae: bool = False, gae_lambda: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw advantages (N,), baseline per complete group (B,)) before the global normalisation.
    `baseline_tracker` (ema) is mutated in place; None = a fresh one the caller never sees."""
    _check_inputs(rewards, group_size, baseline_type, values)
    tracker = {} if baseline_tracker is None else baseline_tracker
    adv = torch.zeros_like(rewards)                                                     # (N,)
    k = group_size.__index__()
    n_groups = rewards.shape[0] // k
    base = torch.zeros(n_groups, dtype=rewards.dtype)                                   # (B,)
    for g in range(n_groups):
        sl = slice(g * k, (g + 1) * k)
        v = values[sl] if values is not None else None
        b = _baseline(rewards[sl], baseline_type, v, tracker)
        base[g] = b
        group_adv = rewards[sl] - b
        if use_gae and values is not None:
            group_adv = _gae(group_adv, gae_lambda)
        adv[sl] = group_adv
    return adv, base


def normalise(adv: torch.Tensor) -> torch.Tensor:
    """Global normalisation over the whole batch (unbiased std), skipped when std ≤ 1e-8."""
    std = adv.std() if adv.numel() > 1 else torch.zeros((), dtype=adv.dtype)
    if std > NORM_EPS:
        return (adv - adv.mean()) / (std + NORM_EPS)
    return adv


def compute_advantages(rewards: torch.Tensor, group_size: int, baseline_type: str = "group_mean",
                       baseline_tracker: Optional[dict] = None, values: Optional[torch.Tensor] = None,
                       use_gae: bool = False, gae_lambda: float = 0.95) -> torch.Tensor:
    """The mini's `compute_advantages` with its signature: (N,) advantages in the rewards' dtype."""
    adv, _ = raw_advantages(rewards, group_size, baseline_type, baseline_tracker, values, use_gae, gae_lambda)
    return normalise(adv)


class AdaptiveKLController:
    """The mini's adaptive KL coefficient (see the module docstring for the rule)."""

    def __init__(self, init_kl_coef: float = 0.02, target_kl: float = 0.01, horizon: int = 10000):
        self.kl_coef, self.target_kl, self.horizon = float(init_kl_coef), float(target_kl), int(horizon)
        self.history: list[float] = []

    def window_mean(self) -> float:
        recent = self.history[-100:]
        return sum(recent) / len(recent)

    def update(self, observed_kl: float) -> float:
        self.history.append(float(observed_kl))
        self.history = self.history[-self.horizon:]
        m = self.window_mean()
        if m > 2 * self.target_kl:
            self.kl_coef *= 1.5
        elif m < 0.5 * self.target_kl:
            self.kl_coef *= 0.8
        self.kl_coef = max(0.001, min(1.0, self.kl_coef))
        return self.kl_coef


def k1_observation(p: torch.Tensor, q: torch.Tensor, mask: torch.Tensor) -> float:
    """What the mini feeds its controller, before the loss: mean_i Σ_t m·(p − q) (the sequence k1 estimate)."""
    return float((mask * (p - q)).sum(-1).mean())


class ValueFunction(torch.nn.Module):
    """The mini's value head: Linear(h → h/2), ReLU, Linear(h/2 → 1), last dimension squeezed."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.value_head = torch.nn.Sequential(torch.nn.Linear(hidden_size, hidden_size // 2), torch.nn.ReLU(),
                                              torch.nn.Linear(hidden_size // 2, 1))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.value_head(hidden_states).squeeze(-1)
