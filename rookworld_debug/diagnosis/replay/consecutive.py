"""Consecutive steps replayed: what a run must carry from its recorded step k to step k+1, which one step alone
cannot show (each step can be right on its own while the state between them is lost or changed).

    weights     θ_before(k+1) = θ_after(k)                                   policy_reset
    optimizer   its step count advanced by the steps between; its moments the ones k's step leaves
                (k's optimizer step re-run from k's recorded state)          optimizer_state_reset
    scheduler   its count advanced by the optimizer steps between           scheduler_reset, _stepped_extra,
                                                                             _not_stepped
    sampler     the weights that sampled k+1 = θ_after(k) (on a later pass over k's rollout: the weights that
                sampled k)                                                   sampler_weights_stale
                or fitted as a·θ_start + c·(θ − θ_start) (consecutive_affine.py)   sampler_weights_extrapolated,
                                                                             _base_weights_discarded, _update_scaled
                and its random numbers not step k's: k+1's tokens match k's at the same position no more often
                than independent draws give (consecutive_draws.py)          sampling_seed_repeated
    reference   its weights at k+1 = at k                                    reference_tracks_policy
    gradient    g_recorded(k+1) = ∇ of k+1's declared loss; else fitted as that + c·g_recorded(k)
                                                                             gradient_not_zeroed
    rewards     the same (prompt, completion, label) gets the same reward in both steps   reward_has_memory;
                step k+1's rewards are not step k's row for row on other completions     rewards_other_batch
    rollout     step k+1's prompts and completion ids are not step k's row for row, unless declared a later pass
                over one rollout (consecutive_reuse.py; checked before the sampler)   rollout_reused
    batch       step k+1's prompts are not step k's again, in order, with new completions (a warning: a dataset
                of one batch repeats it by design)                          batch_repeated

Weights (policy, sampler, reference) are compared in units of step k's update, ‖θ_after(k) − θ_before(k)‖: what is
carried differs from what is due by at most the recorded precision's relative tolerance of that unit (REL_TOL: 1e-3
fp32, 5e-2 bf16) plus the rounding of the weights in their dtype; a copy differs by 0. The optimizer's moments are
held to REL_TOL relative to their norm, its step count exactly, rewards to 1e-5 × max(1, |r|).

    replay_consecutive(folder_k, folder_k1)  -> ConsecutiveReplay   (the two recorded step folders, either order)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from .compare import REL_TOL, VALUE_TOL, parameter_samples, skipped, tol_for
from .consecutive_affine import AFFINE_CODES, AffineFit
from .consecutive_draws import draws_check
from .consecutive_optimizer import optimizer_check
from .consecutive_rerun import clip_of
from .consecutive_reuse import rollout_reuse_check
from .records import AGREE, DISAGREE, SKIPPED, SUSPECT, PhaseCheck, fmt
from .terms import distance as _dist, dot

# the carried quantities, in the order checked; a check whose upstream one disagrees may only follow from it
CARRIED = ("weights", "optimizer", "scheduler", "sampler", "reference", "gradient", "rewards", "batch")
DEPENDS = {"sampler": "weights"}
WEIGHTS_MEASURE = "‖recorded − due‖ / ‖θ_after(k) − θ_before(k)‖"


@dataclass(frozen=True)
class ConsecutiveReplay:
    """The carry-over checks between two recorded steps of one run."""
    steps: tuple                # (k, k+1): the loop's step numbers (None: the trace did not say)
    folders: tuple              # (folder of k, folder of k+1), as text
    checks: tuple               # PhaseCheck per CARRIED quantity (its `phase` names the quantity)
    seconds: float
    note: str = ""              # why the two steps cannot be compared (not of one run, unreadable), else ""
    note_code: str = ""         # the finding code of `note`

    @property
    def later(self) -> Optional[int]:
        return self.steps[1]

    @property
    def first_disagreement(self) -> Optional[PhaseCheck]:
        return next((c for c in self.checks if c.status == DISAGREE), None)

    def to_dict(self) -> dict:
        """Plain JSON: what `diagnose --json` lists under "consecutive"."""
        return {"steps": list(self.steps), "folders": list(self.folders), "note": self.note,
                "checks": [c.to_dict() for c in self.checks], "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class _Pair:
    """The two steps as read: traces, recorded states and the scale the weights are compared in."""
    trace_k: object
    trace_k1: object
    sk: object                  # RecordedState of step k (None: no state/)
    sk1: object
    steps: tuple
    gap: int                    # optimizer steps from k to k+1 (1 when the traces do not say)
    dtype: str
    names: tuple                # the trainable parameters both steps hold
    unit: float                 # ‖θ_after(k) − θ_before(k)‖ (floored by the weights' rounding)
    noise: float                # the rounding of the weights in their dtype (half an ulp, as an L2 norm)

    @property
    def tol(self) -> float:
        return tol_for(REL_TOL, self.dtype)

    @property
    def bound(self) -> float:
        return self.tol * self.unit + self.noise


def replay_consecutive(folder_k, folder_k1, *, traces: tuple = (), replay_k1=None) -> ConsecutiveReplay:
    """The carry-over checks of the module doc between the recorded steps in `folder_k` and `folder_k1` (ordered
    by their step numbers when both have one). `traces`: the two StepTraces when already loaded (k+1's under its
    fitted declaration, if its replay found one); `replay_k1`: k+1's Replay, whose gradient check, when it agrees,
    is reused instead of recomputing the gradient."""
    from rookworld_debug.diagnosis.evidence import first_step
    from rookworld_debug.grpo.step import StepTrace
    t0 = time.perf_counter()
    folders = (Path(folder_k), Path(folder_k1))
    tk, tk1 = traces if traces else tuple(StepTrace.load(f) for f in folders)
    steps = (first_step(tk), first_step(tk1))
    if None not in steps and steps[1] < steps[0]:
        folders, (tk, tk1), steps = folders[::-1], (tk1, tk), steps[::-1]
        replay_k1 = None                        # it was the other step's
    pair, note, code = _read(tk, tk1, folders, steps)
    if note:
        checks = tuple(skipped(q, q, note) for q in CARRIED)
        return ConsecutiveReplay(steps, tuple(map(str, folders)), checks, time.perf_counter() - t0, note, code)
    reused = rollout_reuse_check(tk, tk1)                  # before the sampler: a reused rollout makes it look stale
    checks = [weights_check(pair)]
    checks += [optimizer_check(pair), _scheduler_check(pair)] + ([reused] if reused is not None else [])
    checks += [sampler_check(pair, checks[0].status == DISAGREE, reused is not None),
               draws_check(pair), reference_check(pair), gradient_check(pair, replay_k1), rewards_check(tk, tk1)]
    checks += [batch_check(tk, tk1)] if reused is None else []
    return ConsecutiveReplay(steps, tuple(map(str, folders)), tuple(checks), time.perf_counter() - t0)


def _read(tk, tk1, folders, steps) -> tuple[Optional[_Pair], str, str]:
    """(the pair, "", "") or (None, why they cannot be compared, its finding code)."""
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.trace.state import read_state
    if None not in steps and steps[0] == steps[1]:
        return None, f"both folders hold step {steps[0]}: not two consecutive steps", "steps_not_one_run"
    try:
        sk, sk1 = read_state(folders[0]), read_state(folders[1])
    except TraceError as err:
        return None, f"a step's recorded weights cannot be read: {err}", "steps_not_comparable"
    why = not_one_run(sk, sk1)
    if why:
        return None, f"steps {steps[0]} and {steps[1]} are not of one run: {why}", "steps_not_one_run"
    gap = steps[1] - steps[0] if None not in steps else 1
    dtype = getattr(tk1.recorded, "dtype", None) or str(tk1.config.dtype)
    names = tuple(n for n in (sk.trainable if sk is not None else ()) if n in (sk.before or {}))
    unit, noise = _scale(sk, names)
    return _Pair(tk, tk1, sk, sk1, steps, gap, dtype, names, unit, noise), "", ""


def not_one_run(sk, sk1) -> str:
    """Why two recorded states cannot be of one run ("" when they can): another architecture, other trainable
    parameters, other shapes."""
    if sk is None or sk1 is None:
        return ""
    if sk.model_type != sk1.model_type:
        return f"model_type {sk.model_type!r} against {sk1.model_type!r}"
    if set(sk.trainable) != set(sk1.trainable):
        only = sorted(set(sk.trainable) ^ set(sk1.trainable))
        return f"the trainable parameters differ ({len(only)} named in one only, e.g. {only[:2]})"
    for part in ("before", "after", "reference", "sampler"):
        a, b = getattr(sk, part) or {}, getattr(sk1, part) or {}
        for n in set(a) & set(b):
            if tuple(a[n].shape) != tuple(b[n].shape) or a[n].dtype != b[n].dtype:
                return (f"{n} is {tuple(a[n].shape)} {a[n].dtype} in one and {tuple(b[n].shape)} {b[n].dtype} in "
                        "the other")
    return ""


def _scale(sk, names) -> tuple[float, float]:
    """(‖θ_after(k) − θ_before(k)‖ floored by the rounding, the rounding of θ_after(k) in its dtype)."""
    if sk is None or sk.after is None or sk.before is None or not names:
        return math.nan, 0.0
    unit = _dist(sk.after, sk.before, names)
    eps = torch.finfo(sk.after[names[0]].dtype).eps
    noise = math.sqrt(sum(float((sk.after[n].double().abs() * eps / 2).pow(2).sum()) for n in names))
    return max(unit, noise, 1e-30), noise


def _has(d, names) -> bool:
    return d is not None and all(n in d for n in names)


def _weights_disagree(p: _Pair, phase: str, q: str, got: dict, due: dict, fits: list) -> PhaseCheck:
    """A weights comparison in units of step k's update; on a disagreement, the first of `fits` ((code, weights,
    sentence); code "" for a fit that names no cause) that `got` equals names it. Weights kept in another dtype
    (a bf16 sampler copy) are compared with what is due rounded to it, the bound widened by that rounding."""
    due, bound = _in_dtype_of(got, due, p)
    d = _dist(got, due, p.names)
    if d <= bound:
        return PhaseCheck(phase, q, AGREE, d / p.unit, bound / p.unit, measure=WEIGHTS_MEASURE)
    worst = max(p.names, key=lambda n: float((got[n].double() - due[n].double()).norm()))
    cause, why = "", ""
    for code, other, sentence in fits:
        other = other() if callable(other) else other           # a fit that costs a re-run: made when reached
        if isinstance(other, tuple):                            # (weights, the sentence the fit itself wrote)
            other, sentence = other
        if other is not None and _has(other, p.names) and _dist(got, _in_dtype_of(got, other, p)[0],
                                                                 p.names) <= bound:
            cause, why = code, sentence
            break
    if not why:
        why = _along_update(p, got, due)
    return PhaseCheck(phase, q, DISAGREE, d / p.unit, bound / p.unit, f"worst parameter {worst}",
                      f"‖recorded − due‖ = {fmt(d)}", f"‖θ_after(k) − θ_before(k)‖ = {fmt(p.unit)}", cause, why,
                      measure=WEIGHTS_MEASURE, samples=parameter_samples(got, due, worst, p.tol))


def _in_dtype_of(got: dict, due: dict, p: _Pair) -> tuple[dict, float]:
    """(`due` rounded to `got`'s dtypes, the pair's bound plus that rounding where a dtype differs)."""
    other = [n for n in p.names if got[n].dtype != due[n].dtype]
    if not other:
        return due, p.bound
    eps = max(torch.finfo(got[n].dtype).eps for n in other)
    rounding = math.sqrt(sum(float((due[n].double().abs() * eps / 2).pow(2).sum()) for n in other))
    return {n: due[n].to(got[n].dtype) for n in p.names}, p.bound + rounding


def _along_update(p: _Pair, got: dict, due: dict) -> str:
    """What the difference is, when no recorded set of weights is it: its part along step k's update."""
    step = {n: p.sk.after[n].double() - p.sk.before[n].double() for n in p.names}
    diff = {n: got[n].double() - due[n].double() for n in p.names}
    a = dot(diff, step, p.names) / max(dot(step, step, p.names), 1e-300)
    rest = math.sqrt(max(dot(diff, diff, p.names) - a * a * dot(step, step, p.names), 0.0)) / p.unit
    return (f"no recorded set of weights is it: the difference is {a:.4g} × step k's update plus a rest of "
            f"{rest:.4g} × its size")


def weights_check(p: _Pair) -> PhaseCheck:
    from .consecutive_rerun import stepped_twice
    q = "weights: θ_before(k+1) = θ_after(k) (the policy step k+1 starts from is what step k's update left)"
    sk, sk1 = p.sk, p.sk1
    if sk is None or sk1 is None or sk.after is None or sk1.before is None or not _has(sk1.before, p.names) \
            or math.isnan(p.unit):
        return skipped("weights", q, "the weights after step k or before step k+1 were not recorded")
    if p.gap != 1:
        return skipped("weights", q, f"steps {p.steps[0]} and {p.steps[1]} are {p.gap} optimizer steps apart")
    fits = [("policy_reset", sk.reference, "the policy at step k+1 holds the reference's weights (its start): it "
                                           "was reset or reloaded from its start weights between the steps"),
            ("policy_reset", sk.before, "the policy at step k+1 holds step k's weights before its update: step k's "
                                        "update was lost (the model reloaded, or the update applied to a copy)")]
    fits += [("weights_rounded", _Rounded(sk.after, dt), f"the policy at step k+1 holds step k's updated weights "
              f"rounded to {name}: they went through a {name} copy between the steps (a checkpoint saved in "
              f"{name} and loaded back, or a cast there and back), so each step loses what rounding removes")
             for name, dt in SIXTEEN_BIT.items()]
    lr_k, lr_k1 = ((st.optimizer_settings or {}).get("lr") for st in (sk, sk1))
    factors = dict.fromkeys([1.0] + ([lr_k1 / lr_k] if isinstance(lr_k, float) and isinstance(lr_k1, float) and lr_k
                                     else []))         # the second step at k's rate, or at k+1's (scheduler between)
    twice = ("the policy at step k+1 holds two optimizer steps from step k's weights on step k's gradient: "
             "optimizer.step() ran again on the same gradients after the step (a second step call, or an accumulation "
             "boundary counted twice), so every update is applied twice")
    fits += [("update_applied_twice", lambda f=f: stepped_twice(sk, clip_of(p.trace_k), p.names, f), twice)
             for f in factors]
    return _weights_disagree(p, "weights", q, sk1.before, sk.after, fits)


# the 16-bit types a copy of the weights may be kept in (the names StepRecorder's sampler_precision takes)
SIXTEEN_BIT = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class _Rounded(dict):
    """Weights rounded to `dtype` and back, each computed when read (a 124M model's copy is not made up front)."""

    def __init__(self, weights: dict, dtype):
        super().__init__()
        self.w, self.dtype = weights, dtype

    def __contains__(self, name) -> bool:
        return name in self.w

    def __getitem__(self, name):
        return self.w[name].to(self.dtype).to(self.w[name].dtype)


def sampler_check(p: _Pair, weights_disagree: bool, reused: bool = False) -> PhaseCheck:
    """`reused`: step k+1 trains step k's rollout again (the batch check says so): its sampler is due to hold the
    weights that sampled k, as on a later pass."""
    later_pass = getattr(p.trace_k1.recorded, "iteration", 0) > 0 or reused
    due_name = "the weights that sampled k (one rollout)" if later_pass else "θ_after(k)"
    q = f"sampler: the weights that sampled k+1 = {due_name}"
    sk, sk1 = p.sk, p.sk1
    if sk1 is None or sk1.sampler is None:
        return skipped("sampler", q, "no sampler weights were recorded at k+1: the policy itself sampled, and its "
                                     "weights are the weights check")
    due = (sk.sampler if sk.sampler is not None else sk.before) if later_pass and sk is not None else \
        sk.after if sk is not None else None
    if due is None or not _has(due, p.names) or not _has(sk1.sampler, p.names) or math.isnan(p.unit):
        return skipped("sampler", q, "the weights step k+1's sampler is due to hold were not recorded at step k")
    if p.gap != 1:
        return skipped("sampler", q, f"steps {p.steps[0]} and {p.steps[1]} are {p.gap} optimizer steps apart")
    synced = "" if not weights_disagree else (
        "the sampler holds the policy's weights before step k+1 (it was synced): the policy's own weights did not "
        "carry over (the weights check)")
    stale = sk.sampler if sk.sampler is not None else sk.before
    affine = AffineFit(sk1.sampler, due, sk.reference, p.names, _in_dtype_of(sk1.sampler, due, p)[1], p.unit)
    fits = [("", sk1.before if weights_disagree else None, synced),
            ("sampler_weights_partly_synced", lambda: _partly(p, sk1.sampler, due, stale), ""),
            ("sampler_weights_stale", sk.sampler, "the sampler still holds the weights that sampled step k: it was "
                                                  "not synced after step k's update"),
            ("sampler_weights_stale", sk.before, "the sampler holds step k's weights before its update: it was not "
                                                 "synced after the update"),
            ("sampler_weights_stale", sk.reference, "the sampler holds the reference's (start) weights: it was never "
                                                    "synced"),
            *((code, lambda code=code: affine.named(code), "") for code in AFFINE_CODES),
            ("sampler_weights_permuted", lambda: _reordered(p, sk1.sampler, due), "")]
    declared = SIXTEEN_BIT.get(getattr(p.trace_k1.recorded, "sampler_dtype", "") or "")
    if declared is not None:                 # a sampler declared in 16 bits holds the synced weights rounded
        due = _Rounded(due, declared)
    fits += [("sampler_precision", _Rounded(due, dt), f"the sampler holds the synced weights rounded to {name}: its "
              f"copy keeps them in {name} (an engine loaded in {name}, or the sync cast them), so it samples from "
              f"another distribution than the {str(next(iter(due.values())).dtype).removeprefix('torch.')} policy "
              f"it is due to hold; declare sampler_precision='{name}' if that is meant")
             for name, dt in SIXTEEN_BIT.items() if declared is None]
    c = _weights_disagree(p, "sampler", q, sk1.sampler, due, fits)
    return replace(c, fit=affine.fit) if c.cause in AFFINE_CODES and affine.fit else c


def _reordered(p: _Pair, got: dict, due: dict) -> Optional[tuple]:
    """(`got`, the sentence) when every parameter that differs from what is due holds exactly the due values in
    another order (a layout conversion: fused q/k/v columns, a transpose), else None."""
    moved = [n for n in p.names if not torch.equal(got[n], due[n].to(got[n].dtype))]
    if not moved or any(got[n].shape != due[n].shape or not torch.equal(
            got[n].flatten().sort().values, due[n].to(got[n].dtype).flatten().sort().values) for n in moved):
        return None
    return got, (f"{len(moved)} of the sampler's tensors (e.g. {moved[0]}) hold exactly the values due to them in "
                 "another order: the sync converted their layout (fused q/k/v columns interleaved per head, a "
                 "transpose) where the engine reads another one")


def _partly(p: _Pair, got: dict, synced: dict, stale) -> Optional[tuple]:
    """(`got`, the sentence) when each parameter holds either what the sync is due to give it or the stale weights,
    both kinds present (a sync that copies some parameters only), else None."""
    if stale is None or not _has(stale, p.names):
        return None
    fresh = [n for n in p.names if _dist({n: got[n]}, {n: synced[n]}, [n]) <= p.bound]
    old = [n for n in p.names if n not in fresh and _dist({n: got[n]}, {n: stale[n]}, [n]) <= p.bound]
    if not fresh or not old or len(fresh) + len(old) != len(p.names):
        return None
    return got, (f"the sampler's sync copied {len(fresh)} of {len(p.names)} parameters; the other {len(old)} still "
                f"hold the weights that sampled step k: {', '.join(old[:4])}{', …' if len(old) > 4 else ''}: a sync "
                "that skips them (a filter on names or on the state dict's keys: tied or shared weights, "
                "embeddings, the head)")


def reference_check(p: _Pair) -> PhaseCheck:
    q = "reference: its weights at k+1 = at k (frozen)"
    sk, sk1 = p.sk, p.sk1
    if sk is None or sk1 is None or sk.reference is None or sk1.reference is None or math.isnan(p.unit):
        return skipped("reference", q, "the reference's weights were not recorded at both steps")
    if not _has(sk.reference, p.names) or not _has(sk1.reference, p.names):
        return skipped("reference", q, "the recorded reference lacks some of the policy's parameters")
    c = _weights_disagree(p, "reference", q, sk1.reference, sk.reference, [])
    if c.status != DISAGREE:
        return c
    for name, theta in (("θ_after(k)", sk.after), ("θ_before(k+1)", sk1.before), ("θ_before(k)", sk.before)):
        shared = _shares(p, sk.reference, sk1.reference, theta)
        if shared:
            why = (f"{len(shared)} of the reference's {len(p.names)} parameters moved between the steps, and each now "
                   f"holds the policy's ({name}): {', '.join(shared[:4])}{', …' if len(shared) > 4 else ''}. Those "
                   "tensors are the policy's own (shared storage: a reference built by reusing the policy's modules, "
                   "or layers tied to it), so the KL term does not hold the policy to a fixed reference there")
            return PhaseCheck("reference", q, DISAGREE, c.max_abs_diff, c.tolerance, c.where, c.recorded,
                              c.recomputed, "reference_tracks_policy", why, measure=c.measure,
                              fit={"kind": "shares_policy", "params": {"parameters": shared, "toward": name},
                                   "residual": 0.0, "sentence": why}, samples=c.samples)
        a = _toward(p, sk.reference, sk1.reference, theta)
        if a is not None:
            why = (f"the reference was re-copied from the policy ({name}) between the steps" if abs(a - 1) <= p.tol
                   else f"the reference moved {a:.4g} of the way to the policy ({name}): ref ← (1 − {a:.3g})·ref + "
                        f"{a:.3g}·θ (TRL's sync_ref_model does this on purpose with ref_model_mixup_alpha = {a:.3g})")
            return PhaseCheck("reference", q, DISAGREE, c.max_abs_diff, c.tolerance, c.where, c.recorded,
                              c.recomputed, "reference_tracks_policy", why, measure=c.measure,
                              fit={"kind": "toward_policy", "params": {"alpha": a, "toward": name},
                                   "residual": 0.0, "sentence": why}, samples=c.samples)
    return c


def _shares(p: _Pair, ref0: dict, ref1: dict, theta) -> list:
    """The parameters the reference moved between the steps where it moved only some, when every one of them now
    equals θ's (within the relative tolerance); else []."""
    if theta is None or not _has(theta, p.names):
        return []

    def off(a, b, n) -> bool:
        return float((a[n].double() - b[n].double()).norm()) > p.tol * float(b[n].double().norm()) + 1e-12
    moved = [n for n in p.names if off(ref1, ref0, n)]
    if not moved or len(moved) == len(p.names) or any(off(ref1, theta, n) for n in moved):
        return []
    return moved


def _toward(p: _Pair, ref0: dict, ref1: dict, theta) -> Optional[float]:
    """a when ref1 = ref0 + a·(θ − ref0) within the bound (a ≠ 0), else None."""
    if theta is None or not _has(theta, p.names):
        return None
    d = {n: theta[n].double() - ref0[n].double() for n in p.names}
    moved = {n: ref1[n].double() - ref0[n].double() for n in p.names}
    dd = dot(d, d, p.names)
    if dd <= 0:
        return None
    a = dot(moved, d, p.names) / dd
    resid = math.sqrt(max(dot(moved, moved, p.names) - a * a * dd, 0.0))
    return a if resid <= p.bound and abs(a) * math.sqrt(dd) > p.bound else None


def _scheduler_check(p: _Pair) -> PhaseCheck:
    from .consecutive_rerun import step_count
    from .loss_phase import accumulation
    from .schedule import scheduler_carried
    # a recorded empty state is a fresh optimizer's (count 0); an unrecorded one says nothing
    n0 = step_count(p.sk.optimizer_state, p.sk.optimizer) if p.sk is not None and p.sk.optimizer_state is not None \
        else None
    return scheduler_carried(p.trace_k, p.trace_k1, p.gap, n0, accumulation(p.trace_k))


def gradient_check(p: _Pair, replay_k1=None) -> PhaseCheck:
    from .consecutive_rerun import GRAD_ATOL, declared_gradient_at
    from rookworld_debug.grpo.trace.state import relative_error
    q = "gradient: step k+1's recorded gradient = its declared loss's (nothing left of step k's)"
    sk, sk1 = p.sk, p.sk1
    if sk is None or sk1 is None or sk.gradient is None or sk1.gradient is None or sk1.before is None:
        return skipped("gradient", q, "the gradient of both steps and the weights before step k+1 are needed")
    agreed = next((c for c in getattr(replay_k1, "checks", ()) if c.phase == "gradient" and c.status == AGREE), None)
    if agreed is not None:
        return PhaseCheck("gradient", q, AGREE, agreed.max_abs_diff, agreed.tolerance, measure=agreed.measure,
                          explanation="step k+1's replay: its gradient is its declared loss's")
    ours, why = declared_gradient_at(p.trace_k1, sk1)
    if ours is None:
        return skipped("gradient", q, why)
    names = [n for n in ours if n in sk1.gradient and n in sk.gradient]
    err, worst, _ = relative_error(sk1.gradient, ours, names)
    norm_ref, norm_rec = math.sqrt(dot(ours, ours, names)), math.sqrt(dot(sk1.gradient, sk1.gradient, names))
    if err <= p.tol or err * norm_ref <= GRAD_ATOL:
        return PhaseCheck("gradient", q, AGREE, err, p.tol, measure="‖g_recorded − g‖ / ‖g‖")
    rest = {n: sk1.gradient[n].double() - ours[n].double() for n in names}
    prev = {n: sk.gradient[n].double() for n in names}
    pp = dot(prev, prev, names)
    c = dot(rest, prev, names) / pp if pp > 0 else 0.0
    resid = math.sqrt(max(dot(rest, rest, names) - c * c * pp, 0.0))
    bound = max(p.tol * norm_rec, GRAD_ATOL)
    where = f"worst parameter {worst}"
    if resid > bound or abs(c) * math.sqrt(pp) <= bound:
        return PhaseCheck("gradient", q, SKIPPED, err, p.tol, where, explanation="step k+1's gradient differs from "
                          "its declared loss's by more than step k's gradient explains: its own replay says where",
                          measure="‖g_recorded − g‖ / ‖g‖")
    clip = _clip_factor(p.trace_k, prev, names)
    why = (f"step k+1's recorded gradient is its declared loss's plus {c:.4g} × step k's recorded gradient"
           + (f" (step k's clip factor is {clip:.4g}: the clipped gradient stayed in .grad)" if clip is not None
              else "") + ": gradients not zeroed between the steps")
    return PhaseCheck("gradient", q, DISAGREE, err, p.tol, where, f"‖g‖ = {fmt(norm_rec)}", f"‖g‖ = {fmt(norm_ref)}",
                      "gradient_not_zeroed", why, measure="‖g_recorded − g‖ / ‖g‖",
                      fit={"kind": "carried_over", "params": {"previous step's gradient": c},
                           "residual": resid / max(norm_rec, 1e-300), "sentence": why})


def _clip_factor(trace_k, grad: dict, names) -> Optional[float]:
    """min(1, max_grad_norm / ‖g_k‖): what clip_grad_norm_ left of step k's gradient in .grad."""
    mx = clip_of(trace_k)
    norm = math.sqrt(dot(grad, grad, names))
    return min(1.0, float(mx) / norm) if mx and norm > 0 else None


def rewards_check(tk, tk1) -> PhaseCheck:
    """The same (prompt, completion, label) in both steps: the same reward (within a step too: else the reward is
    not a function of its inputs at all)."""
    q = "rewards: the same (prompt, completion, label) gets the same reward at k and k+1"
    measure = "max |r(k+1) − r(k)| / max(1, |r(k)|) over the inputs both steps scored"
    late = _previous_batch(tk, tk1)
    if late is not None:
        return late
    a, b = _scored(tk), _scored(tk1)
    shared = sorted(set(a) & set(b), key=repr)
    if not shared:
        return skipped("rewards", q, f"no (prompt, completion, label) appears in both steps ({len(a)} and {len(b)} "
                                     "distinct): not checkable")
    key = max(shared, key=lambda k: _rdiff(a[k], b[k]))
    worst = _rdiff(a[key], b[key])
    if worst <= VALUE_TOL:
        return PhaseCheck("rewards", q, AGREE, worst, VALUE_TOL, f"{len(shared)} shared inputs", measure=measure)
    where = f"{len(shared)} shared inputs; the worst: completion {key[1][:60]!r}"
    shift = [b[k][0] - a[k][0] for k in shared]
    constant = all(math.isfinite(s) for s in shift) and \
        max(shift) - min(shift) <= VALUE_TOL * max(1.0, max(abs(s) for s in shift))
    if max(_spread(a), _spread(b)) > VALUE_TOL:
        cause, why = "reward_not_deterministic", ("the same input gets different rewards within one step too: the "
                                                  "reward is not a function of (prompt, completion, label)")
    else:
        cause, why = "reward_has_memory", (
            "the same (prompt, completion, label) got another reward at step k+1 than at step k, while within each "
            "step it got one: the reward function keeps state between calls"
            + (f" (here a constant {shift[0]:+.4g}: a bonus or offset that changes from call to call)"
               if constant else ""))
    return PhaseCheck("rewards", q, DISAGREE, worst, VALUE_TOL, where, fmt(b[key]), fmt(a[key]), cause, why,
                      measure=measure, fit={"kind": "shift", "params": {"shift": shift[0]}, "residual": 0.0,
                                            "sentence": why} if constant else None)


def batch_check(tk, tk1) -> PhaseCheck:
    """Step k+1 sampled new completions for exactly step k's prompts, in step k's order: the data loader handed
    the same batch again (SUSPECT: a dataset of one batch does so by design)."""
    q = "batch: step k+1's prompts are its own (not step k's batch again)"
    r0, r1 = tk.rollout, tk1.rollout
    if list(r0.completions) == list(r1.completions):
        return skipped("batch", q, "step k+1 holds step k's rollout (a later pass over it): one batch by design")
    if tk1.recorded is None and tk1.capture is None:
        return skipped("batch", q, "this package's own run: its batch mode (overfit_single_batch by default) trains "
                                   "the same batch every step by design")
    if list(r0.prompts) != list(r1.prompts):
        return PhaseCheck("batch", q, AGREE, 0.0, 0.0, measure="prompts step k+1 shares with step k, in order")
    n = len(r1.prompts)
    why = (f"step k+1's {n} prompts are step k's, in the same order, with new completions: the data loader handed "
           "the same batch again (an iterator restarted at a resume without skipping the batches already trained, "
           "or re-created every step), so the run trains on its first batches over and over. A dataset of exactly "
           "one batch repeats it by design")
    return PhaseCheck("batch", q, SUSPECT, float(n), 0.0, f"all {n} prompts", f"{n} prompts of step k", "new ones",
                      "batch_repeated", why, measure="prompts step k+1 shares with step k, in order")


def new_batch(tk, tk1) -> bool:
    """Step k+1 scored other prompts and other completions than step k. The same completions (a later pass over one
    rollout) or the same prompts (an overfit batch, whose rows may earn the same rewards again) are not."""
    return list(tk.rollout.completions) != list(tk1.rollout.completions) and \
        list(tk.rollout.prompts) != list(tk1.rollout.prompts)


def late_by_one(tk, tk1, earlier: torch.Tensor) -> bool:
    """On a `new_batch`, step k+1's recorded rewards are `earlier` (rewards of step k's rows: its recorded ones, or
    a candidate's) row for row (to 1e-5 × max(1, |r|)), with at least 3 distinct values (exact equality of that many
    is no chance): the reward function is one batch late."""
    a, b = earlier.double(), tk1.rewards.rewards.double()                        # (N,) each
    return new_batch(tk, tk1) and a.shape == b.shape and bool(torch.isfinite(a).all()) and \
        a.unique().numel() >= 3 and bool(((a - b).abs() <= VALUE_TOL * a.abs().clamp(min=1.0)).all())


def _previous_batch(tk, tk1) -> Optional[PhaseCheck]:
    """Step k+1's recorded rewards are step k's (`late_by_one`), or None."""
    a, b = tk.rewards.rewards.double(), tk1.rewards.rewards.double()          # (N,) each
    if not late_by_one(tk, tk1, a):
        return None
    n = a.numel()
    why = (f"step k+1's {n} rewards are step k's, value for value and row for row ({int(a.unique().numel())} "
           "distinct values), on other completions: the reward function returns the previous batch's rewards "
           "(one batch late: a cache or a queue in it), so every advantage belongs to another completion")
    return PhaseCheck("rewards", "rewards: step k+1's rewards are its own completions' (not step k's)", DISAGREE,
                      float(n), float(n - 1), f"all {n} rows", fmt(b[:4].tolist()), fmt(a[:4].tolist()),
                      "rewards_other_batch", why,
                      measure="rows whose reward at k+1 equals step k's reward of the same row (to 1e-5 × "
                              "max(1, |r|)), the completions differing")


def _rdiff(xs: list, ys: list) -> float:
    """The largest |y − x| / max(1, |x|) between two steps' rewards of one input (NaN, unscorable, only equals NaN)."""
    out = 0.0
    for x in xs:
        for y in ys:
            if math.isnan(x) or math.isnan(y):
                out = out if math.isnan(x) and math.isnan(y) else math.inf
            else:
                out = max(out, abs(y - x) / max(1.0, abs(x)))
    return out


def _scored(trace) -> dict:
    """{(prompt, completion, label): [reward per row]} of one step."""
    from .data_phases import row_labels
    r = trace.rollout
    labels = row_labels(trace) or [None] * len(r.completions)
    rewards = trace.rewards.rewards.double().tolist()
    out: dict = {}
    for p, c, lab, x in zip(r.prompts, r.completions, labels, rewards):
        out.setdefault((p, c, lab), []).append(x)
    return out


def _spread(scored: dict) -> float:
    """The largest reward difference between rows of one step with the same input (relative, as the check's)."""
    out = 0.0
    for xs in scored.values():
        fin = [x for x in xs if not math.isnan(x)]
        if fin and len(fin) != len(xs):
            return math.inf
        if len(fin) > 1:
            out = max(out, (max(fin) - min(fin)) / max(1.0, abs(fin[0])))
    return out
