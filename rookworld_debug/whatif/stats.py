"""Paired differences over shared seeds, bootstrap intervals, and a verdict per symptom.

Every arm of a k-step branch runs with the same S seeds (same prompts and sampling seeds per step), so arm a
and the unchanged arm form S pairs. A symptom reduces an arm's trajectory to one number per seed (e.g. the
largest KL over the branch's steps); its verdict compares the fix arm with the unchanged arm on those pairs:

- d_s = x_fix,s − x_unchanged,s; the improvement is −direction·d_s (direction +1: higher is the symptom, e.g.
  KL; −1: lower is the symptom, e.g. entropy or reward);
- the 95 % interval of the mean improvement is a percentile bootstrap over the S pairs (`B_BOOT` resamples,
  seeded: the same pairs give the same interval);
- "removed": the interval excludes 0 on the improving side AND, when the symptom has a threshold, no seed of
  the fix arm is beyond it; "not removed": every seed of the fix arm is still beyond the threshold, or the
  interval lies at or below 0 (no improvement); otherwise "cannot tell at this S", with the S a two-sided
  5 % test at 80 % power would need to see the improvement that removes the symptom (δ = how far the
  unchanged arm is beyond the threshold; no threshold: the observed mean improvement): the smallest S with
  (t_0.975,S−1 + t_0.8,S−1) · sd(d) / √S ≤ δ;
- "absent in both": the symptom has a threshold and no seed of either arm is beyond it (nothing to remove).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

B_BOOT = 2000
Z_975, Z_80 = 1.959964, 0.841621
VERDICTS = ("removed", "not removed", "cannot tell at this S", "absent in both")


@dataclass(frozen=True)
class Symptom:
    """What is wrong, as one number per trajectory (`agg` over the branch's steps of `metric`)."""
    name: str
    metric: str                         # a trajectory column ("kl", "entropy", "rollout_reward", ...)
    agg: str                            # "max" | "min" | "mean" | "last" | "step_var" (variance of step-to-step change)
    direction: int                      # +1: high values are the symptom; −1: low values are
    threshold: Optional[float] = None   # beyond it (in `direction`) the symptom is present; None: compare only
    definition: str = ""

    def reduce(self, values: Sequence[float]) -> float:
        v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
        if not v:
            return math.nan
        if self.agg == "max":
            return max(v)
        if self.agg == "min":
            return min(v)
        if self.agg == "last":
            return v[-1]
        if self.agg == "step_var":
            d = [b - a for a, b in zip(v, v[1:])]
            return _var(d)
        return sum(v) / len(v)

    def present(self, x: float) -> Optional[bool]:
        if self.threshold is None or not math.isfinite(x):
            return None
        return self.direction * (x - self.threshold) > 0


@dataclass(frozen=True)
class Verdict:
    symptom: str
    arm: str
    verdict: str                        # one of VERDICTS
    mean_improvement: float             # mean over seeds of −direction·(x_fix − x_unchanged)
    ci95: tuple                         # (low, high) percentile bootstrap of the mean improvement
    fix_values: tuple                   # x_fix per seed
    unchanged_values: tuple             # x_unchanged per seed
    present_in_fix: tuple               # per seed: beyond the threshold (None: no threshold)
    seeds: int
    seeds_needed: float                 # S for 80 % power at δ (NaN: not estimable); = seeds when decided
    reason: str

    def to_dict(self) -> dict:
        return {"symptom": self.symptom, "arm": self.arm, "verdict": self.verdict,
                "mean_improvement": _num(self.mean_improvement), "ci95": [_num(x) for x in self.ci95],
                "fix_values": [_num(x) for x in self.fix_values],
                "unchanged_values": [_num(x) for x in self.unchanged_values],
                "present_in_fix": list(self.present_in_fix), "seeds": self.seeds,
                "seeds_needed": _num(self.seeds_needed), "reason": self.reason}


def _num(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _var(v: Sequence[float]) -> float:
    if len(v) < 2:
        return math.nan
    m = sum(v) / len(v)
    return sum((x - m) ** 2 for x in v) / (len(v) - 1)


def bootstrap_mean_ci(values: Sequence[float], *, n_boot: int = B_BOOT, seed: int = 0) -> tuple:
    """95 % percentile bootstrap interval of the mean (one vectorized draw of n_boot resamples)."""
    x = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if x.numel() == 0:
        return (math.nan, math.nan)
    if x.numel() == 1:
        return (float(x[0]), float(x[0]))
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, x.numel(), (n_boot, x.numel()), generator=gen)   # (n_boot, S)
    means = x[idx].mean(1)                                                   # (n_boot,)
    return (float(torch.quantile(means, 0.025)), float(torch.quantile(means, 0.975)))


def _t(z: float, nu: int) -> float:
    """Student-t quantile from the normal quantile z (Cornish–Fisher; within 3 % of the exact value for ν ≥ 2)."""
    return (z + (z ** 3 + z) / (4 * nu) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * nu ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * nu ** 3))


def seeds_needed(diffs: Sequence[float], delta: float, max_seeds: int = 10_000) -> float:
    """The smallest S with (t_0.975,S−1 + t_0.8,S−1)·sd(d)/√S ≤ δ (paired t-test, two-sided 5 %, 80 % power, with
    the observed sd); NaN when not estimable."""
    sd = math.sqrt(_var(diffs)) if len(diffs) > 1 else math.nan
    if not (math.isfinite(sd) and math.isfinite(delta)) or delta <= 0:
        return math.nan
    if sd == 0:
        return 2.0
    n = max(2, math.ceil(((Z_975 + Z_80) * sd / delta) ** 2))      # the normal approximation: a lower bound
    while n < max_seeds and (_t(Z_975, n - 1) + _t(Z_80, n - 1)) * sd / math.sqrt(n) > delta:
        n += 1
    return float(n)


def verdict(symptom: Symptom, arm: str, fix: Sequence[float], unchanged: Sequence[float]) -> Verdict:
    """The verdict of one fix arm on one symptom (module doc): `fix`/`unchanged` = the reduced value per seed."""
    pairs = [(f, u) for f, u in zip(fix, unchanged) if math.isfinite(f) and math.isfinite(u)]
    s = len(pairs)
    imp = [-symptom.direction * (f - u) for f, u in pairs]
    mean = sum(imp) / s if s else math.nan
    ci = bootstrap_mean_ci(imp)
    present = tuple(symptom.present(f) for f, _ in pairs)
    delta = (symptom.direction * (sum(u for _, u in pairs) / s - symptom.threshold)) \
        if (s and symptom.threshold is not None) else abs(mean)
    need = seeds_needed(imp, delta)
    if s == 0:
        return Verdict(symptom.name, arm, VERDICTS[2], mean, ci, tuple(fix), tuple(unchanged), (), 0, math.nan,
                       "no seed has a finite value in both arms")
    if symptom.threshold is not None and not any(present) and not any(symptom.present(u) for _, u in pairs):
        return Verdict(symptom.name, arm, VERDICTS[3], mean, ci, tuple(f for f, _ in pairs),
                       tuple(u for _, u in pairs), present, s, float(s),
                       f"no seed of either arm is beyond the threshold {symptom.threshold:.3g}: nothing to remove")
    still = symptom.threshold is not None and all(present)
    gone = symptom.threshold is None or not any(present)
    if s >= 2 and ci[0] > 0 and gone:
        v, why = VERDICTS[0], f"the improvement's 95 % interval [{ci[0]:.3g}, {ci[1]:.3g}] excludes 0"
        if symptom.threshold is not None:
            why += f" and no seed of the arm is beyond the threshold {symptom.threshold:.3g}"
    elif still:
        v, why = VERDICTS[1], (f"every seed of the arm is still beyond the threshold {symptom.threshold:.3g}"
                               + (" (reduced, not removed)" if s >= 2 and ci[0] > 0 else ""))
    elif s >= 2 and ci[1] <= 0:
        v, why = VERDICTS[1], f"the improvement's 95 % interval [{ci[0]:.3g}, {ci[1]:.3g}] lies at or below 0"
    else:
        v = VERDICTS[2]
        why = (f"{s} seed(s): the interval [{ci[0]:.3g}, {ci[1]:.3g}] does not decide; about "
               f"{need:.0f} seeds would" if math.isfinite(need) else
               f"{s} seed(s): the interval does not decide and the variance gives no estimate of how many seeds would decide")
    return Verdict(symptom.name, arm, v, mean, ci, tuple(f for f, _ in pairs), tuple(u for _, u in pairs), present,
                   s, float(s) if v != VERDICTS[2] else need, why)


def robust_threshold(history: Sequence[float], direction: int, *, jump: float = 8.0, floor: float = 0.01) -> float:
    """The flight recorder's relative rule on a metric's history before the branch: median + direction·jump·
    max(1.4826·MAD, floor). NaN without at least 3 finite values."""
    v = sorted(float(x) for x in history if x is not None and math.isfinite(float(x)))
    if len(v) < 3:
        return math.nan
    med = _median(v)
    mad = _median(sorted(abs(x - med) for x in v))
    return med + direction * jump * max(1.4826 * mad, floor)


def _median(v: Sequence[float]) -> float:
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
