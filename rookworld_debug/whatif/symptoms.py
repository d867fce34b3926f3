"""The symptoms a branch judges, each one number per trajectory, with thresholds from the record before the branch.

Thresholds come from the flight recorder's built-in triggers. Where a trigger has an absolute rule (KL above
1 nat/token, clipped-token fraction above 0.3) that rule says whether a trajectory shows the symptom: it marks
a broken state whatever the run's history. The other metrics use the relative rule on the steps recorded
before the branch point: beyond the history's median by 8 robust σ (1.4826·MAD, floored). The relative rule is
a detector of sudden change; over a k-step branch a healthy run drifts, so it is not used where an absolute
rule exists. Without a history and an absolute rule a symptom is judged on the paired difference alone.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from rookworld_debug.errors import ConfigError
from rookworld_debug.whatif.stats import Symptom, robust_threshold

# name: (metric, agg, direction, history floor, absolute threshold without history, words)
SYMPTOMS = {
    "kl_spike": ("kl", "max", +1, 0.01, 1.0, "largest KL(π‖π_ref) (nats/token, sampled rollout) over the branch"),
    "entropy_collapse": ("entropy", "min", -1, 0.02, None, "smallest mean token entropy (sampled rollout) over the "
                         "branch"),
    "reward_drop": ("rollout_reward", "min", -1, 0.05, None, "smallest mean sampled reward over the branch"),
    "grad_norm_spike": ("grad_norm_pre_clip", "max", +1, 0.1, None, "largest pre-clip grad norm over the branch"),
    "clip_ratio": ("clip_ratio/region_mean", "max", +1, 0.02, 0.3, "largest clipped-token fraction over the branch"),
    "heldout_reward": ("heldout_reward_after", "last", -1, 0.05, None, "greedy held-out reward after the last "
                       "step"),
    "reward_noise": ("rollout_reward", "step_var", +1, 0.0, None, "variance over the branch of the step-to-step "
                     "change of the mean sampled reward"),
}
# evidence names a finding may carry → the symptom that watches them
EVIDENCE_TO_SYMPTOM = {"kl": "kl_spike", "entropy": "entropy_collapse", "reward": "reward_drop",
                       "rollout_reward": "reward_drop", "grad_norm": "grad_norm_spike",
                       "grad_norm_pre_clip": "grad_norm_spike", "clip_ratio/region_mean": "clip_ratio",
                       "heldout_reward_after": "heldout_reward", "reward_std": "reward_noise"}


def symptom(name: str, history: Optional[Mapping[str, Sequence[float]]] = None) -> Symptom:
    if name not in SYMPTOMS:
        raise ConfigError("--symptom", f"unknown symptom {name!r}; known: {sorted(SYMPTOMS)}")
    metric, agg, direction, floor, absolute, words = SYMPTOMS[name]
    hist = (history or {}).get(metric) or []
    if absolute is not None:
        thr = absolute
        how = f"the flight recorder's absolute rule ({'above' if direction > 0 else 'below'} {absolute:g})"
    else:
        thr = robust_threshold(hist, direction, floor=floor) if agg != "step_var" else math.nan
        how = f"recorded history ({len(hist)} steps): median {'+' if direction > 0 else '−'} 8 robust σ"
        if not math.isfinite(thr):
            thr, how = None, "no threshold (no recorded history)"
    return Symptom(name, metric, agg, direction, thr,
                   f"{words}; {'higher' if direction > 0 else 'lower'} is worse; threshold: {how}")


def default_symptoms(history=None) -> tuple:
    return tuple(symptom(n, history) for n in SYMPTOMS if n != "reward_noise")


def choose(symptoms: Sequence[Symptom], unchanged_values: Mapping[str, Sequence[float]]) -> tuple:
    """The symptoms the unchanged arm shows (beyond its threshold in some seed); if it shows none, all with data."""
    shown = [s for s in symptoms if any(s.present(x) for x in unchanged_values.get(s.name, ()))]
    if shown:
        return tuple(shown)
    return tuple(s for s in symptoms if any(math.isfinite(x) for x in unchanged_values.get(s.name, ())))
