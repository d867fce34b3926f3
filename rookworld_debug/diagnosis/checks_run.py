"""Run-level checks: from a run's log alone (one dict of TRL-named metrics per logged step).

Each check reads the curves the way people debugging RookWorld runs read them by hand, with a stated test:
* a jump is `value − median(previous W) > K · 1.4826·MAD` (the flight recorder's robust rule), floored;
* a trend is the OLS slope × span with a t-interval; "no net trend" = that interval covers 0 AND the up/down
  step counts are consistent with a fair coin (two-sided sign test);
* a share of steps is over the steps that logged the metric.
"""
from __future__ import annotations

import math
import statistics

from rookworld_debug.diagnosis.evidence import LOG, ev
from rookworld_debug.diagnosis.findings import Finding, Fix

WINDOW, K, MIN_HISTORY = 10, 8.0, 3


def series(rows, key: str) -> list[tuple]:
    return [(r["step"], float(r[key])) for r in rows if r.get(key) is not None and math.isfinite(float(r[key]))]


def _jumps(pts, floor: float, direction: int = 1) -> list[tuple]:
    """(step, value, median before) where the value jumps over its running median (module doc). Each point is
    compared with the ≤ WINDOW values before it (from the MIN_HISTORY-th point on), all windows at once."""
    import numpy as np
    if len(pts) <= MIN_HISTORY:
        return []
    steps = [s for s, _ in pts]
    v = np.asarray([x for _, x in pts], dtype=np.float64)                                 # (n,)
    with np.errstate(over="ignore", invalid="ignore"):    # a log's extreme values (1e308): ±inf compares, no warning
        med, mad = _window_medians(v)
        scale = np.maximum(1.4826 * mad, floor)
        idx = np.arange(MIN_HISTORY, len(v))
        hit = np.flatnonzero(direction * (v[idx] - med) > K * scale)
    return [(steps[idx[j]], float(v[idx[j]]), float(med[j])) for j in hit]


def _window_medians(v):
    """(median, median absolute deviation) of the ≤ WINDOW values before each point from the MIN_HISTORY-th on."""
    import numpy as np
    idx = np.arange(MIN_HISTORY, len(v))
    lo = np.maximum(idx - WINDOW, 0)
    full = idx >= WINDOW                       # a full window: the WINDOW values before the point
    med, mad = np.empty(len(idx)), np.empty(len(idx))
    if full.any():
        win = np.lib.stride_tricks.sliding_window_view(v[:-1], WINDOW)[idx[full] - WINDOW]   # (m, WINDOW)
        med[full] = np.median(win, axis=1)
        mad[full] = np.median(np.abs(win - med[full, None]), axis=1)
    for j in np.flatnonzero(~full):            # the first few points: shorter windows
        w = v[lo[j]:idx[j]]
        med[j] = np.median(w)
        mad[j] = np.median(np.abs(w - med[j]))
    return med, mad


def _lr_rise(rows, step: int):
    """(lr before, lr at/after) when the learning rate rose ≥ 3× within the two steps before `step`."""
    lrs = series(rows, "learning_rate")
    before = [v for s, v in lrs if s < step - 2 and v > 0]
    near = [v for s, v in lrs if step - 2 <= s <= step]
    if not before or not near:
        return None
    base = statistics.median(before[-WINDOW:])
    top = max(near)
    return (base, top) if top >= 3 * base else None


def check_update_jump(rows) -> list[Finding]:
    kl = series(rows, "kl")
    jumps = _jumps(kl, floor=0.01)
    out = []
    for step, v, med in jumps[:1]:
        rise = _lr_rise(rows, step)
        evs = [ev("kl", v, "TRL `kl` at the step (raw token-mean KL to the reference)", LOG, "triage: kl curve"),
               ev("kl_median_before", med, f"median `kl` over the previous ≤ {WINDOW} logged steps", LOG)]
        if rise is not None:
            evs += [ev("learning_rate_before", rise[0], "median logged learning rate before the jump", LOG,
                       "triage: learning_rate curve"),
                    ev("learning_rate_at_jump", rise[1], "largest logged learning rate in the two steps before it", LOG)]
            out.append(Finding(
                code="lr_too_large", severity="error",
                cause=f"Update too large: learning rate. The learning rate rose {rise[1] / rise[0]:.3g}× just before "
                      f"step {step}, and the update it drove moved the policy so far that the KL to the reference "
                      f"jumped from {med:.3g} to {v:.3g}.",
                evidence=tuple(evs), fix=Fix(f"Keep the learning rate at {rise[0]:.3g} (fix the schedule or the unit).",
                                             step_config={"lr": rise[0]}, grpo_config={"learning_rate": rise[0]}),
                alternatives=("a gradient spike with clipping off reads the same (check grad_norm)",),
                score=9.0, step=step))
        else:
            out.append(Finding(
                code="update_too_large", severity="warning",
                cause=f"Update too large at step {step}: the KL to the reference jumped from {med:.3g} to {v:.3g} "
                      "with no learning-rate change in the log.",
                evidence=tuple(evs), fix=Fix("Lower the learning rate or clip gradients harder.",
                                             step_config={"max_grad_norm": 1.0}, grpo_config={"max_grad_norm": 1.0}),
                alternatives=("grad_norm_spikes", "a reward/batch outlier"), score=6.0, step=step))
    return out


def _fmean(values) -> float:
    """The mean, computed on values / max|value| (a log's extreme values, e.g. 1e308, overflow no sum)."""
    vs = list(values)
    scale = max((abs(v) for v in vs), default=0.0) or 1.0
    return statistics.fmean(v / scale for v in vs) * scale


def _ols(pts):
    """(slope × span, half-width of its 95 % t-interval) of y on step; None for < 3 points. Computed on y scaled
    by max|y| (no square or sum overflows; a result beyond the float range is ±inf, not an error)."""
    n = len(pts)
    if n < 3:
        return None
    scale = max(abs(p[1]) for p in pts) or 1.0
    xs, ys = [p[0] for p in pts], [p[1] / scale for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) * (x - mx) for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = sum((y - my - slope * (x - mx)) * (y - my - slope * (x - mx)) for x, y in zip(xs, ys))
    se = math.sqrt(resid / (n - 2) / sxx)
    span = xs[-1] - xs[0]
    return slope * span * scale, _t975(n - 2) * se * span * scale


def _t975(df: int) -> float:
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 8: 2.31, 10: 2.23, 15: 2.13, 20: 2.09, 30: 2.04}
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.96


def _sign_test_p(up: int, down: int) -> float:
    """Two-sided exact binomial p-value of `up` successes in up + down fair-coin trials: 2 · P(X ≤ min), capped at 1.

    Summed in log space (log-binomials from lgamma, terms relative to the largest), from the tail's largest term
    outwards until a term no longer changes the sum: linear at worst, about √n terms on a long log, where
    exact big-integer binomials grow about as n^2.7."""
    n = up + down
    k = min(up, down)
    if n == 0 or 2 * k >= n - 1:
        return 1.0                          # the tail holds half the mass or more: p = 1 after the cap
    log_top = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0)
    total, term = 1.0, 1.0                  # Σ_{i ≤ k} C(n, i) / C(n, k), from i = k downwards
    for i in range(k, 0, -1):
        term *= i / (n - i + 1)             # C(n, i−1) / C(n, i)
        total += term
        if term < 1e-17 * total:
            break
    return min(1.0, 2.0 * math.exp(log_top + math.log(total)))


def check_no_net_trend(rows) -> list[Finding]:
    pts = series(rows, "reward")
    if len(pts) < 20:
        return []
    fit = _ols(pts)
    if fit is None:
        return []
    change, half = fit
    ys = [p[1] for p in pts]
    diffs = [b - a for a, b in zip(ys, ys[1:])]
    up, down = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    p = _sign_test_p(up, down)
    if abs(change) > half or p < 0.05:
        return []
    return [Finding(
        code="no_net_trend", severity="warning",
        cause=f"No net trend: the updates are mostly noise. Over {len(pts)} logged steps the reward went up "
              f"{up} times and down {down} times, and its trend ({change:+.3g}, 95 % interval ±{half:.3g}) cannot "
              "be told from 0.",
        evidence=(ev("trend_change", change, "OLS slope of reward on step × (last − first step)", LOG, "triage: trend"),
                  ev("trend_ci95_half_width", half, "half-width of its 95 % t-interval (residuals assumed independent)",
                     LOG),
                  ev("up_steps", up, "steps whose reward rose over the previous logged step", LOG),
                  ev("down_steps", down, "steps whose reward fell", LOG),
                  ev("sign_test_p", p, "two-sided exact binomial test of up vs down steps (fair coin)", LOG)),
        fix=Fix("Reduce the gradient noise per step: more groups per step (batch) and completions per group, or a "
                "smaller learning rate; measure SNR on a step (diagnostics=True).",
                step_config={"diagnostics": True}),
        alternatives=("a learning rate too small to move anything", "an evaluation too small to see a change"),
        score=6.0, step=pts[0][0])]


def _fifths(pts) -> tuple:
    """k (a fifth of the points, ≥ 3), the medians of the first and last k values, and the OLS trend fit."""
    k = max(3, len(pts) // 5)
    return (k, statistics.median(v for _, v in pts[:k]), statistics.median(v for _, v in pts[-k:]), _ols(pts))


def check_kl_runaway(rows) -> list[Finding]:
    pts = series(rows, "kl")
    if len(pts) < 6:
        return []
    k, first, last, fit = _fifths(pts)
    if fit is None or not (last > 0.1 and last > 10 * max(first, 1e-3) and fit[0] - fit[1] > 0):
        return []
    return [Finding(
        code="kl_runaway", severity="warning",
        cause=f"KL runaway: the KL to the reference grew from {first:.3g} to {last:.3g} over the run and keeps rising.",
        evidence=(ev("kl_first", first, f"median `kl` over the first {k} logged steps", LOG, "triage: kl curve"),
                  ev("kl_last", last, f"median `kl` over the last {k} logged steps", LOG),
                  ev("kl_trend_low", fit[0] - fit[1], "lower end of the 95 % interval of the KL trend", LOG)),
        fix=Fix("Raise β or lower the learning rate.", step_config={"beta": 0.1}, grpo_config={"beta": 0.1}),
        alternatives=("lr_too_large",), score=5.0, step=pts[-k][0])]


def check_entropy_collapse(rows) -> list[Finding]:
    pts = series(rows, "entropy")
    if len(pts) < 6:
        return []
    k, first, last, fit = _fifths(pts)
    if fit is None or not (first > 0 and last < 0.2 * first and fit[0] + fit[1] < 0):
        return []
    return [Finding(
        code="entropy_collapse", severity="warning",
        cause=f"Entropy collapse: the policy's token entropy fell from {first:.3g} to {last:.3g} nats; the groups' "
              "completions become identical and the learning signal disappears.",
        evidence=(ev("entropy_first", first, f"median `entropy` over the first {k} logged steps", LOG,
                     "triage: entropy curve"),
                  ev("entropy_last", last, f"median over the last {k}", LOG)),
        fix=Fix("Lower the learning rate, or clip higher (ε_high > ε_low) to let low-probability tokens rise.",
                step_config={"epsilon_high": 0.28}, grpo_config={"epsilon_high": 0.28}),
        alternatives=("lr_too_large", "a reward that favours one answer (a solved task)"), score=5.0,
        step=pts[-k][0])]


def check_grad_spikes(rows) -> list[Finding]:
    pts = series(rows, "grad_norm")
    spikes = [(s, v, m) for s, v, m in _jumps(pts, floor=0.1) if v > 3 * m]
    if not spikes:
        return []
    s, v, m = spikes[0]
    return [Finding(
        code="grad_norm_spikes", severity="warning",
        cause=f"{len(spikes)} gradient-norm spike(s), first at step {s} ({v:.3g} vs a running median {m:.3g}): "
              "single batches dominate those updates.",
        evidence=(ev("grad_norm_spikes", len(spikes), f"steps whose grad_norm exceeds its running median by > {K:g} "
                     "robust σ and 3×", LOG, "triage: grad_norm curve"),
                  ev("grad_norm", v, "the first spike's pre-clip gradient norm", LOG)),
        fix=Fix("Keep gradient clipping on at about the typical norm.", step_config={"max_grad_norm": 1.0},
                grpo_config={"max_grad_norm": 1.0}),
        score=4.0, step=s)]


def check_truncated_run(rows) -> list[Finding]:
    pts = series(rows, "completions/clipped_ratio")
    if not pts:
        return []
    bad = [s for s, v in pts if v >= 0.9]
    if len(bad) < max(1, 0.9 * len(pts)):
        return []
    zero = series(rows, "frac_reward_zero_std")
    length = series(rows, "completions/mean_length")
    evs = [ev("steps_truncated", len(bad), "logged steps with completions/clipped_ratio ≥ 0.9", LOG,
              "triage: completions/clipped_ratio curve"),
           ev("steps_logged", len(pts), "logged steps with the metric", LOG)]
    if length:
        evs.append(ev("completions/mean_length", _fmean(v for _, v in length), "mean over steps", LOG))
    if zero:
        evs.append(ev("frac_reward_zero_std", _fmean(v for _, v in zero), "mean over steps", LOG))
    return [Finding(
        code="all_truncated", severity="error",
        cause="No learning signal: on nearly every step every completion is cut at the completion budget before it "
              "ends, so rewards score unfinished answers and most groups are flat.",
        evidence=tuple(evs), fix=_truncation_fix(rows), alternatives=("a policy that never emits EOS",), score=9.5,
        step=bad[0])]


def _truncation_fix(rows) -> Fix:
    """The step finding's rule (checks_signal.budget_that_fits) on the log: the budget is the longest completion
    logged (cut completions are budget-long), the longest ended one TRL's max_terminated_length."""
    from rookworld_debug.diagnosis.checks_signal import budget_that_fits, truncation_fix
    budget = max((v for _, v in series(rows, "completions/max_length")), default=0.0)
    if budget <= 0:
        return Fix("Raise the completion budget so completions can end.")
    ended = max((v for _, v in series(rows, "completions/max_terminated_length")), default=0.0)
    return truncation_fix(budget_that_fits(budget, ended))


def check_reward_vs_format(rows) -> list[Finding]:
    keys = sorted({k for r in rows for k in r if ("format" in k or "legal" in k) and k != "reward"})
    rw = series(rows, "reward")
    fit_r = _ols(rw) if len(rw) >= 10 else None
    if fit_r is None or fit_r[0] - fit_r[1] <= 0:
        return []
    for key in keys:
        pts = series(rows, key)
        fit = _ols(pts) if len(pts) >= 10 else None
        if fit is not None and fit[0] + fit[1] < 0:
            return [Finding(
                code="reward_up_validity_down", severity="warning",
                cause=f"The reward rises while `{key}` falls: the policy is learning to score without producing "
                      "valid answers (reward hacking or a reward that pays for invalid output).",
                evidence=(ev("reward_trend", fit_r[0], "OLS reward change over the run", LOG, "triage: reward curve"),
                          ev(f"{key}_trend", fit[0], f"OLS change of {key} over the run", LOG)),
                fix=Fix("Penalise invalid answers in the reward (format/legality gate).",
                        code_change="make an invalid completion score below every valid one"),
                score=6.0, step=pts[0][0])]
    return []


def check_little_signal(rows) -> list[Finding]:
    pts = series(rows, "frac_reward_zero_std")
    if len(pts) < 3 or check_truncated_run(rows):
        return []
    mean = _fmean(v for _, v in pts)
    if mean < 0.75:
        return []
    return [Finding(
        code="little_signal", severity="warning",
        cause=f"Little learning signal: on average {mean:.0%} of the rows sit in groups with equal rewards "
              "(advantage 0).",
        evidence=(ev("frac_reward_zero_std", mean, "mean over logged steps of TRL `frac_reward_zero_std`", LOG,
                     "triage: frac_reward_zero_std curve"),),
        fix=Fix("Open a captured step: the step checks tell why (temperature, deterministic prompts, a reward that "
                "ignores the completion, truncation)."),
        alternatives=("temperature_too_low", "no_signal_deterministic", "reward_ignores_completion"),
        score=4.0 + mean, step=pts[0][0])]


def check_kl_dominates_run(rows) -> list[Finding]:
    pts = series(rows, "kl_grad_share")
    if len(pts) < 3:
        return []
    share = sum(v > 0.5 for _, v in pts) / len(pts)
    if share < 0.5:
        return []
    return [Finding(
        code="kl_dominates", severity="warning",
        cause=f"The KL penalty dominates the gradient on {share:.0%} of the steps.",
        evidence=(ev("kl_dominated_share", share, "share of steps whose kl_grad_share (‖∇β·KL‖ share of the "
                     "gradient) > 0.5", LOG),),
        fix=Fix("Lower β.", step_config={"beta": 0.01}, grpo_config={"beta": 0.01}), score=6.0,
        step=next(s for s, v in pts if v > 0.5))]
