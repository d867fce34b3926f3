"""Between two recorded steps, the optimizer: its class, its settings (the learning rate aside: the scheduler's),
its step count, and the moments step k's update left, re-run from step k's recorded state; where they differ, what
they are (a reset, another parameter's, a second step).

    optimizer_check(pair) -> PhaseCheck   (phase "optimizer"; `pair`: consecutive._Pair)
"""
from __future__ import annotations

import math

from .compare import skipped
from .consecutive_rerun import MOMENTS, clip_of, has_moments, moments_after, relative_moments, step_count, zero_state
from .records import AGREE, DISAGREE, PhaseCheck

def optimizer_check(p) -> PhaseCheck:
    """The optimizer's class, its step count, then its moments (k's step re-run from k's recorded state)."""
    q = "optimizer: its state at k+1 is what step k's update left (step count + 1, moments carried)"
    sk, sk1 = p.sk, p.sk1
    if sk is None or sk1 is None or sk.optimizer_state is None or sk1.optimizer_state is None:
        return skipped("optimizer", q, "the optimizer's state was not recorded at both steps")
    if sk.optimizer != sk1.optimizer:
        return PhaseCheck("optimizer", q, DISAGREE, math.inf, 0.0, "the optimizer's class", sk1.optimizer or "—",
                          sk.optimizer or "—", "optimizer_state_reset", f"the optimizer at k+1 is another "
                          f"({sk1.optimizer or 'not recorded'}) than at k ({sk.optimizer or 'not recorded'}): it was "
                          "re-created", measure="the optimizer's class")
    changed = _settings_changed(sk.optimizer_settings or {}, sk1.optimizer_settings or {})
    if changed:
        said = "; ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items())
        return PhaseCheck("optimizer", q, DISAGREE, float(len(changed)), 0.0, "the optimizer's settings", said,
                          "the same settings", "optimizer_settings_changed",
                          f"the optimizer's settings changed between the steps ({said}): the moments carried over "
                          "were made under the old settings, and the run goes on under others (a config applied over "
                          "a loaded optimizer at a resume, or a group's settings written by hand); the learning "
                          "rate is the scheduler's and not compared here", measure="settings that changed")
    n0, n1 = step_count(sk.optimizer_state, sk.optimizer), step_count(sk1.optimizer_state, sk1.optimizer)
    if n0 is not None and n1 is not None and n1 != n0 + p.gap:
        reset, twice = n1 <= n0, n1 - n0 == 2 * p.gap
        return PhaseCheck("optimizer", q, DISAGREE, abs(n1 - n0 - p.gap), 0.0, "the step count", f"{n1}",
                          f"{n0} + {p.gap}", "optimizer_state_reset" if reset else "update_applied_twice" if twice
                          else "",
                          f"the optimizer's step count went from {n0} at step k to {n1} at step k+1, not "
                          f"{n0 + p.gap}" + (": its state was re-created (or restored from an earlier one) between "
                                             "the steps" if reset else ": it stepped twice for each step the loop "
                                             "took (optimizer.step() called again)" if twice else ""),
                          measure="|step count(k+1) − step count(k) − steps between|")
    rate = _rate_not_scheduled(p, q)
    if rate is not None:
        return rate
    moving = sk.gradient is not None and any(bool(v.abs().sum() > 0) for v in sk.gradient.values())
    if has_moments(sk.optimizer, sk.optimizer_settings) and zero_state(sk1.optimizer_state) and moving:
        return PhaseCheck("optimizer", q, DISAGREE, 1.0, p.tol, "every parameter", "moments all 0",
                          "step k's moments", "optimizer_state_reset", "the optimizer's moments at k+1 are all 0 "
                          "after a step on a non-zero gradient: its state was reset between the steps",
                          measure="‖m_recorded − m‖ / ‖m‖")
    return _moments_check(p, q, f"step count {n0} → {n1}" if n1 is not None else "no step count kept")


def _rate_not_scheduled(p, q: str):
    """A disagreement when the optimizer's learning rate at k+1 is not the rate its scheduler last set (the single
    step's own check) while the scheduler's count carried over: the optimizer's param_groups were not restored with
    the scheduler; else None."""
    from .schedule import schedule_check
    c = schedule_check(p.trace_k1)
    if c is None or c.status != DISAGREE:
        return None
    lr_k = (p.sk.optimizer_settings or {}).get("lr")
    held = lr_k is not None and c.recorded == f"lr = {float(lr_k):.6g}"
    why = (c.explanation + ". Between the steps the scheduler's count carried over but the optimizer's rate did not "
           "follow it" + (f": the optimizer still holds step k's rate {float(lr_k):.6g} (a resume that restores the "
                          "scheduler and leaves param_groups at the config's rate, or a rate written back by hand)"
                          if held else ""))
    return PhaseCheck("optimizer", q, DISAGREE, c.max_abs_diff, c.tolerance, "the learning rate at k+1", c.recorded,
                      c.recomputed, "lr_not_from_scheduler", why, measure=c.measure, fit=c.fit)


# what a scheduler moves from step to step: not a change of the optimizer's settings
SCHEDULED = ("lr", "initial_lr")


def _settings_changed(a: dict, b: dict) -> dict:
    """{setting: (at k, at k+1)} of the first parameter group's settings that differ (the learning rate aside)."""
    def same(x, y) -> bool:
        return (list(x) == list(y)) if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) else x == y
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in SCHEDULED and k in a and k in b and not same(a[k], b[k])}


def _moments_check(p, q: str, count: str) -> PhaseCheck:
    if p.gap != 1 or not has_moments(p.sk.optimizer, p.sk.optimizer_settings):
        return PhaseCheck("optimizer", q, AGREE, 0.0, 0.0, count, measure="the step count, exact",
                          explanation="" if p.gap == 1 else f"{p.gap} steps apart: the moments were not re-run")
    after, why = moments_after(p.sk, clip_of(p.trace_k), p.names, p.bound)
    if after is None:
        return PhaseCheck("optimizer", q, AGREE, 0.0, 0.0, count, explanation=why, measure="the step count, exact")
    err, worst = relative_moments(p.sk1.optimizer_state, after, p.names)
    measure = "‖m_recorded − m‖ / ‖m‖ (the worst moment, over every parameter)"
    if err <= p.tol:
        return PhaseCheck("optimizer", q, AGREE, err, p.tol, count, measure=measure)
    kept = any(k in MOMENTS for st in p.sk.optimizer_state.values() for k in st)     # an empty state matches anything
    before_k = relative_moments(p.sk1.optimizer_state, p.sk.optimizer_state, p.names)[0] if kept else math.inf
    if before_k <= p.tol:
        cause, why = ("optimizer_state_reset", "the optimizer's moments at k+1 are the ones before step k: its "
                      "state was restored from before step k's update")
    else:
        cause, why = _rounded_moments(p.sk1.optimizer_state, after, p.names, p.tol, err)
        cause, why = (cause, why) if cause else _permuted_moments(p.sk1.optimizer_state, after, p.names, p.tol)
    return PhaseCheck("optimizer", q, DISAGREE, err, p.tol, f"{count}; worst moment {worst}", "", "", cause, why,
                      measure=measure)


def _rounded_moments(got: dict, due: dict, names, tol: float, err: float) -> tuple[str, str]:
    """("optimizer_state_rounded", sentence) when the moments at k+1 are the due ones rounded to bf16 or fp16 (a state
    saved or loaded in a 16-bit type), far closer than to the due ones themselves; else ("", "")."""
    import torch
    for dt in (torch.bfloat16, torch.float16):
        rounded = {n: {k: (v.to(dt).to(v.dtype) if k in MOMENTS and v.is_floating_point() else v)
                       for k, v in (due.get(n) or {}).items()} for n in names}
        left, where = relative_moments(got, rounded, names)
        if left <= tol and left <= 0.1 * err:
            name = str(dt).removeprefix("torch.")
            return "optimizer_state_rounded", (
                f"the optimizer's moments at k+1 are the ones step k left, rounded to {name}: ‖m − m_{name}‖ / ‖m‖ = "
                f"{left:.2g} against {err:.2g} for the moments themselves (worst: {where or 'none'}); the state was "
                f"saved or loaded in {name} (a checkpoint written in the model's dtype, or a cast at a resume), so "
                "every moment lost its low bits and the smallest second moments became 0 or denormal")
    return "", ""


def _permuted_moments(got: dict, due: dict, names, tol: float) -> tuple[str, str]:
    """("optimizer_state_permuted", sentence) when every parameter whose moments at k+1 are not its own due ones
    holds another parameter's (of the same shape), each within `tol`; else ("", "")."""

    def holds(n, m) -> bool:
        g, d = got.get(n) or {}, due.get(m) or {}
        return bool(d) and all(k in g and tuple(g[k].shape) == tuple(v.shape) for k, v in d.items()) and \
            relative_moments({n: g}, {n: d}, [n])[0] <= tol
    off = [n for n in names if due.get(n) and not holds(n, n)]
    pairs = {}
    for n in off:
        m = next((m for m in names if m != n and m not in pairs.values() and holds(n, m)), None)
        if m is None:
            return "", ""
        pairs[n] = m
    if not pairs:
        return "", ""
    shown = "; ".join(f"{n} holds {m}'s" for n, m in list(pairs.items())[:3])
    return "optimizer_state_permuted", (
        f"the optimizer's moments at k+1 are the ones step k left, but on other parameters: {len(pairs)} of "
        f"{len(names)} parameters hold another's of the same shape ({shown}{'; …' if len(pairs) > 3 else ''}): a "
        "state loaded by position into parameters listed in another order (a resume whose model lists its modules "
        "otherwise)")
