"""A branch that changes G: the measured change in step-to-step reward variance next to what the G′ curve of
the first step predicted.

Measured: for each arm and seed, v = variance over the branch of the step-to-step change of the mean sampled
reward (the `reward_noise` symptom); the ratio mean_s v(G_new) / mean_s v(G_old), with a 95 % percentile
bootstrap over seeds (seed indices resampled jointly for both arms, which share their seeds).

Predicted, from ONE step at G_new taken from the start state with the diagnostics' G′ sweep
(`grpo.signal.group_size`: ‖g_{G′}‖ / ‖g_G‖ for subsampled groups):

- gradient: fit ρ²(G′) = ‖g_{G′}‖² / ‖g_G‖² = 1 + b·(1/G′ − 1/G) (noise energy ∝ 1/G′, least squares over the
  sweep's draws); predicted E‖g_{G_new}‖² / E‖g_{G_old}‖² = 1 / (1 + b·(1/G_old − 1/G_new));
- sampling: the mean sampled reward of a step with fixed prompts varies by σ²_within / (B·G): ratio G_old / G_new;
- direction: 1 − cos²(g_{G_old}, g_G) from the sweep, the share of a G_old-sized gradient that is not along the
  G-sized one (how much of a small-group update is noise).
"""
from __future__ import annotations

import math

import torch

from rookworld_debug.whatif.state import restore
from rookworld_debug.whatif.stats import B_BOOT, Symptom, _num


def g_prime_curve(state, config_new) -> dict:
    """The G′ sweep of one step at G_new from the start state."""
    from rookworld_debug.grpo.signal.noise import signal_noise
    from rookworld_debug.grpo.phases.shared import sample_and_score
    restore(state)
    rollout, rewards, adv, loss = sample_and_score(state.session, config_new)
    diag = signal_noise(state.session.policy, rollout, adv, loss, config_new)
    restore(state)
    sw = diag.group_size
    if sw is None:
        return {}
    g = sw.full_g
    x = torch.tensor([1 / s - 1 / g for s in sw.sizes], dtype=torch.float64)[:, None].expand_as(sw.norm_ratio)
    y = sw.norm_ratio.double() ** 2 - 1                                       # (S, D)
    ok = torch.isfinite(y)
    b = float((x[ok] * y[ok]).sum() / (x[ok] ** 2).sum()) if ok.any() else math.nan
    grp = rewards.rewards.reshape(-1, g)                                        # (B, G)
    return {"sizes": list(sw.sizes), "cos_mean": [_num(c) for c in sw.cos_mean],
            "norm_ratio_mean": [_num(float(r[torch.isfinite(r)].mean())) if torch.isfinite(r).any() else None
                                for r in sw.norm_ratio], "b": _num(b), "G": g,
            "within_group_var": _num(float(grp.var(1, unbiased=True).nanmean()))}


def group_size_report(state, arms, runs) -> dict:
    base = arms[0]
    arm = next(a for a in arms[1:] if "num_generations" in a.overrides)
    g_old, g_new = state.config.num_generations, int(arm.overrides["num_generations"])
    curve = g_prime_curve(state, arm.config(state.config)) if g_new >= 3 else {}
    sym = Symptom("reward_noise", "rollout_reward", "step_var", +1)
    v_old = [sym.reduce(r.series("rollout_reward")) for r in runs if r.arm == base.name]
    v_new = [sym.reduce(r.series("rollout_reward")) for r in runs if r.arm == arm.name]
    ratio, ci = _ratio_ci(v_new, v_old)
    b = curve.get("b")
    fits = b is not None and math.isfinite(b) and b > 0
    pred_grad = 1 / (1 + b * (1 / g_old - 1 / g_new)) if fits else math.nan
    notes = [] if fits or not curve else [_no_fit_note(b)]
    cos_old = dict(zip(curve.get("sizes", []), curve.get("cos_mean", []))).get(g_old)
    return {"arm": arm.name, "G_old": g_old, "G_new": g_new,
            "measured_var_old": [_num(v) for v in v_old], "measured_var_new": [_num(v) for v in v_new],
            "measured_ratio": _num(ratio), "measured_ratio_ci95": [_num(ci[0]), _num(ci[1])],
            "predicted_ratio_sampling": g_old / g_new, "predicted_ratio_gradient": _num(pred_grad),
            "noise_share_at_G_old": _num(1 - cos_old ** 2) if cos_old is not None else None,
            "g_prime_curve": curve, "notes": notes, "definition": __doc__.split("\n\n", 1)[1].strip()}


def _no_fit_note(b) -> str:
    """Why the G′ sweep gives no gradient-noise ratio: b ≤ 0, or no fit at all (every subsampled gradient zero or
    undefined, e.g. completions too short for the rewards to differ)."""
    if b is None or not math.isfinite(b):
        return ("the G′ sweep has no fit (no subsampled group gave a finite, non-zero gradient energy), so it gives no "
                "gradient-noise ratio")
    return (f"the G′ sweep does not show gradient energy falling with G′ (fitted b = {b:.3g} ≤ 0: the subsampled "
            "groups' re-normalized advantages change the gradient's size, not only its noise), so it gives no "
            "gradient-noise ratio")


def _ratio_ci(new, old, n_boot: int = B_BOOT) -> tuple:
    pairs = [(a, b) for a, b in zip(new, old) if math.isfinite(a) and math.isfinite(b)]
    if not pairs:
        return math.nan, (math.nan, math.nan)
    t = torch.tensor(pairs, dtype=torch.float64)                                 # (S, 2)
    ratio = float(t[:, 0].mean() / t[:, 1].mean()) if float(t[:, 1].mean()) > 0 else math.nan
    if len(pairs) < 2:
        return ratio, (ratio, ratio)
    idx = torch.randint(0, len(pairs), (n_boot, len(pairs)), generator=torch.Generator().manual_seed(0))
    s = t[idx]                                                                   # (n_boot, S, 2)
    r = s[..., 0].mean(1) / s[..., 1].mean(1)
    r = r[torch.isfinite(r)]
    return ratio, (float(torch.quantile(r, 0.025)), float(torch.quantile(r, 0.975))) if r.numel() else (math.nan,) * 2
