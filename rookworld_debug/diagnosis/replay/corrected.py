"""The corrected step: what the fix of a replay's finding changes in one recorded step's update.

From the phase the replay names (its first disagreement, or the phase a fitted declaration differs in) the step is
recomputed with the trusted implementation, from the recorded state: the declared objective's advantages (from the
recorded rewards), the log-probs of the recorded weights, the loss, its gradient at θ_before, the recorded
max_grad_norm's clipping and the recorded optimizer's step from θ_before and its recorded state. The recorded step
and the corrected one are then compared: the loss, the gradient's norm before and after clipping, the angle and size
ratio of the gradients and of the updates, the parameters the fix changes most, and each completion's log-likelihood
change under each update (which completions the recorded step pushed up that the corrected one pushes down).

    corrected_step(trace, folder) -> CorrectedStep

Which declaration is trusted: with a disagreement left, the one the replay agreed under (the fitted declarations
kept: the finding is the disagreement, not them); with only fitted declarations, the declared one (what the loop
would compute if it did what it declares).

Shape legend: N rows, T completion tokens.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Optional

import torch

from .records import CORRECTABLE, fmt

TOP_PARAMETERS = 5
# |Δ Σ_t ℓ| below this (nats) is no direction: float noise of a forward at moved weights, or a row the step left
ROW_FLOOR = 1e-4


@dataclass(frozen=True)
class ParameterChange:
    name: str
    difference: float           # ‖Δθ_corrected − Δθ_recorded‖ over this parameter
    recorded: float             # ‖Δθ_recorded‖
    corrected: float            # ‖Δθ_corrected‖


@dataclass(frozen=True)
class RowChange:
    """One completion under each update: the advantage it was given and its log-likelihood change Σ_t Δℓ_t."""
    row: int
    reward: float
    advantage: tuple            # (recorded, corrected)
    push: float                 # −Σ_t ∂L/∂ℓ_t of the corrected loss: > 0 asks for the row to be more likely
    logp_change: tuple          # (recorded, corrected): Σ_t over the loss mask of ℓ(θ_after) − ℓ(θ_before), nats

    @property
    def flipped(self) -> bool:
        """The two updates move this completion's likelihood in opposite directions."""
        a, b = self.logp_change
        return abs(a) > ROW_FLOOR and abs(b) > ROW_FLOOR and (a > 0) != (b > 0)


@dataclass(frozen=True)
class CorrectedStep:
    phase: str                  # the phase recomputed from ("": nothing to correct, `note` says why)
    basis: str                  # what was corrected: the finding's code and sentence, or the declaration
    note: str = ""
    loss: tuple = (math.nan, math.nan)                 # (recorded, corrected)
    grad_norm: tuple = (math.nan, math.nan)            # (recorded, corrected) ‖g‖ before clipping
    grad_norm_clipped: tuple = (math.nan, math.nan)    # (recorded, corrected) after max_grad_norm's clip
    max_grad_norm: Optional[float] = None
    grad_cos: float = math.nan                         # cos(g_recorded, g_corrected)
    update_norm: tuple = (math.nan, math.nan)          # (recorded, corrected) ‖Δθ‖
    update_cos: float = math.nan                       # cos(Δθ_recorded, Δθ_corrected)
    parameters: tuple = ()      # ParameterChange, the TOP_PARAMETERS largest differences first
    rows: tuple = ()            # RowChange per completion (N,)
    corrected_update: Optional[dict] = None            # {name: Δθ_corrected} float64, parameter shapes; not in JSON
    seconds: float = 0.0        # the comparison's own time
    replay_seconds: float = 0.0     # the replay's that found what to correct (its own, also when it was given)

    @property
    def grad_ratio(self) -> float:
        return _ratio(self.grad_norm[1], self.grad_norm[0])

    @property
    def update_ratio(self) -> float:
        return _ratio(self.update_norm[1], self.update_norm[0])

    @property
    def update_angle(self) -> float:
        """Degrees between the recorded and the corrected update."""
        return math.degrees(math.acos(max(-1.0, min(1.0, self.update_cos)))) if math.isfinite(self.update_cos) \
            else math.nan

    @property
    def flipped(self) -> tuple:
        return tuple(r.row for r in self.rows if r.flipped)

    def verdict(self) -> str:
        """One sentence with the numbers."""
        if not self.phase:
            return self.note
        rec, cor = self.update_norm
        if not (math.isfinite(rec) and math.isfinite(cor)):
            size = f"the recorded or corrected update is not finite (‖Δθ‖ {fmt(rec)} recorded, {fmt(cor)} corrected)"
        elif rec == 0:
            size = f"the recorded step left the weights where they were; the fix moves them by ‖Δθ‖ = {fmt(cor)}"
        else:
            k = self.update_ratio
            grow = f"grows it {k:.3g}×" if k > 1.005 else f"shrinks it {1 / k:.3g}×" if 0 < k < 0.995 else \
                "keeps its size"
            size = f"the fix turns this step's update by {self.update_angle:.0f}° and {grow}"
        return f"{size}; {len(self.flipped)} of {len(self.rows)} completions change direction"

    def to_dict(self) -> dict:
        """Plain JSON: every non-finite number as its name ("nan", "inf")."""
        from .records import _plain
        pair = (lambda p: {"recorded": p[0], "corrected": p[1]})
        return _plain({
            "phase": self.phase, "basis": self.basis, "note": self.note, "verdict": self.verdict(),
            "loss": pair(self.loss), "grad_norm": pair(self.grad_norm),
            "grad_norm_clipped": pair(self.grad_norm_clipped),
            "max_grad_norm": None if self.max_grad_norm is None else float(self.max_grad_norm),
            "grad_cos": self.grad_cos, "grad_ratio": self.grad_ratio, "update_norm": pair(self.update_norm),
            "update_cos": self.update_cos, "update_ratio": self.update_ratio, "update_angle_deg": self.update_angle,
            "parameters": [dataclasses.asdict(p) for p in self.parameters],
            "rows": [{"row": r.row, "reward": r.reward, "advantage": pair(r.advantage), "push": r.push,
                      "logp_change": pair(r.logp_change), "flipped": r.flipped} for r in self.rows],
            "rows_flipped": list(self.flipped), "seconds": self.seconds, "replay_seconds": self.replay_seconds})


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else math.nan)


def corrected_step(trace, folder, replay=None, loaded=None) -> CorrectedStep:
    """The step recomputed from the replay's finding on (see the module doc). NoWeightsError when the step keeps
    no weights before and after, gradient or optimizer state; `phase == ""` with a note where the step agrees or
    the finding is in a phase this comparison does not recompute. `replay`: the step's replay, if already run."""
    from . import replay_trace
    from .weights import weights_for
    t0 = time.perf_counter()
    w = loaded if loaded is not None else weights_for(trace, folder)      # `loaded`: the replay's, shared
    _require_weights(w)
    given = replay is not None
    replay = replay if given else replay_trace(trace, folder, loaded=w)    # one forward for both
    t1 = time.perf_counter()
    spent = replay.seconds if given else t1 - t0
    phase, base, basis = _plan(trace, replay)
    if phase not in CORRECTABLE:
        return CorrectedStep("", basis, note=_why_not(phase, basis), replay_seconds=spent)
    return dataclasses.replace(_compare(base, phase, basis, w), seconds=time.perf_counter() - t1,
                               replay_seconds=spent)


def _require_weights(w) -> None:
    from rookworld_debug.errors import NoWeightsError
    s = w.state
    said = {"before": "weights before the update", "after": "weights after it", "gradient": "gradient"}
    missing = [said[k] for k in said if s is None or getattr(s, k) is None]
    if s is None or w.policy is None or missing or not s.optimizer:
        what = ", ".join(missing + ([] if s is not None and s.optimizer else ["optimizer state"]))
        raise NoWeightsError(f"the step keeps no {what or 'weights'} ({w.source or w.why}): what a fix changes in its "
                             "update needs the weights before and after it, its gradient and the optimizer's state "
                             "(record with StepRecorder.model_before/model_after, StepConfig.keep_weights or "
                             "capture_steps(keep_weights=True))")


def _plan(trace, replay) -> tuple:
    """(phase to recompute from, the trace under the trusted declaration, what is corrected) — phase "" when the
    step agrees."""
    from .declaration import with_inferred_pass
    first = replay.first_disagreement
    if first is not None:
        basis = f"{first.cause or 'replay_' + first.phase}: {first.explanation or first.quantity}"
        if replay.declarations:
            basis += " (under " + ", ".join(f"{d.keyword}={d.fitted!r}" for d in replay.declarations) + \
                     ", which the loop computes)"
        return first.phase, replay.trace, basis
    if replay.declarations:
        d = min(replay.declarations, key=lambda x: _phase_index(x.phase))
        said = ", ".join(f"{x.keyword}={x.declared!r} (the loop computes {x.fitted!r})" for x in replay.declarations)
        return d.phase, with_inferred_pass(trace)[0], f"declaration_mismatch: the declared {said}"
    return "", replay.trace, "every replayed phase agrees with the trusted recomputation"


def _phase_index(phase: str) -> int:
    from .records import PHASES
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def _why_not(phase: str, basis: str) -> str:
    if not phase:
        return f"Nothing to correct: {basis}."
    return (f"The finding is in the {phase} phase ({basis}): its fix changes the step's rollout or rewards, which a "
            "one-step comparison from the recorded rollout does not recompute (it starts at the advantages).")


def _compare(trace, phase: str, basis: str, w) -> CorrectedStep:
    """The corrected step's numbers against the recorded ones."""
    from .consecutive import clip_of
    from .loss_phase import loss_value
    from .update import rerun_update
    s = w.state
    names = [n for n in s.trainable if n in s.gradient and n in s.before and n in s.after]
    fixed, jac = _corrected_inputs(trace, phase, w)
    g_rec = {n: s.gradient[n] for n in names}
    g_cor = g_rec if phase == "update" else _gradient(fixed, jac, names)
    mgn = clip_of(trace)
    after = rerun_update(s.before, g_cor, names, s.optimizer, s.optimizer_settings, s.optimizer_state, mgn,
                         groups=s.optimizer_groups)
    d_rec = {n: s.after[n].double() - s.before[n].double() for n in names}
    d_cor = {n: after[n].double() - s.before[n].double() for n in names}
    norms = (_norm(g_rec, names), _norm(g_cor, names))
    return CorrectedStep(
        phase, basis, loss=(loss_value(trace)[0], _loss(fixed) if phase != "update" else loss_value(trace)[0]),
        grad_norm=norms, grad_norm_clipped=tuple(_clipped(x, mgn) for x in norms), max_grad_norm=mgn,
        grad_cos=_cos(g_rec, g_cor, names), update_norm=(_norm(d_rec, names), _norm(d_cor, names)),
        update_cos=_cos(d_rec, d_cor, names), parameters=_parameters(d_rec, d_cor, names),
        rows=_rows(trace, fixed, w, jac, after), corrected_update=d_cor)


def _corrected_inputs(trace, phase: str, w):
    """(the trace with the corrected advantages or log-probs, the policy's Jacobian at θ_before; None for an update
    fix, whose gradient is the recorded one)."""
    from rookworld_debug.grpo.families import advantages_from_config
    from . import _jacobian
    if phase == "update":
        return trace, None
    fixed = trace
    if phase == "advantages":
        adv = advantages_from_config(trace.rewards.rewards, trace.config).advantages.to(
            trace.advantages.advantages.dtype)                                                      # (N,)
        fixed = dataclasses.replace(trace, advantages=dataclasses.replace(trace.advantages, advantages=adv))
    jac = _jacobian(trace, w)
    if phase == "scoring":
        fixed = _rescored(fixed, w, jac)
    return fixed, jac


def _rescored(trace, w, jac):
    """The trace with the recorded log-probs replaced by the recorded weights' own: the policy's (θ_before), the
    reference's, and π_old's from the weights that sampled (θ_before on a first pass)."""
    from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy
    from .weights import scoring_model
    r = trace.rollout
    m = r.completion_mask.to(jac.logps.dtype)
    mine = jac.logps.detach() * m                                                                    # (N, T)

    def score(model):
        lp, _ = per_token_logps_and_entropy(scoring_model(trace, model), r.prompt_ids, r.prompt_mask,
                                            r.completion_ids, r.completion_mask, r.temperatures)
        return lp.detach() * m                                                                       # (N, T)
    ref = r.ref_per_token_logps
    if ref is not None and w.reference is not None:
        ref = score(w.reference).to(ref.dtype)
    out = dataclasses.replace(trace, rollout=dataclasses.replace(
        r, per_token_logps=mine.to(r.per_token_logps.dtype), ref_per_token_logps=ref))
    old = getattr(trace.recorded, "old_per_token_logps", None)
    if old is not None:
        old = (score(w.sampler) if w.sampler is not None else mine).to(old.dtype)
        out = dataclasses.replace(out, recorded=dataclasses.replace(trace.recorded, old_per_token_logps=old))
    return out


def _gradient(trace, jac, names) -> dict:
    """∇θ of the trace's declared loss at θ_before (one backward through the kept forward)."""
    from rookworld_debug.grpo.objective.params import Objective
    from .terms import token_weights
    g = jac.gradient(*token_weights(trace, Objective.from_config(trace.config), jac))
    return {n: g[n] for n in names}


def _loss(trace) -> float:
    """The declared loss of the trace's (corrected) inputs, as the replay's loss phase computes it."""
    from rookworld_debug.grpo.objective.params import Objective
    from .loss_phase import loss_total
    r = trace.rollout
    old = trace.capture.old_per_token_logps if trace.capture is not None else \
        getattr(trace.recorded, "old_per_token_logps", None)
    try:
        return float(loss_total(trace, Objective.from_config(trace.config), r.per_token_logps, old,
                                r.ref_per_token_logps, trace.advantages.advantages))
    except (RuntimeError, ValueError):          # inputs the loss refuses: the value is not known, the update is
        return math.nan


def _row_push(trace, jac) -> torch.Tensor:
    """(N,) −Σ_t ∂L/∂ℓ_t of the trace's declared loss: > 0 where the loss asks for the row to be more likely."""
    from rookworld_debug.grpo.objective.params import Objective
    from .terms import token_weights
    u, _ = token_weights(trace, Objective.from_config(trace.config), jac)                          # (N, T)
    return -u.double().sum(1)


def _rows(trace, fixed, w, jac, after) -> tuple:
    """Each completion's log-likelihood change under the recorded update and under the corrected one (exact: a
    forward at each set of weights, not a first-order estimate)."""
    from rookworld_debug.grpo.phases.generation import loss_mask
    from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy
    from rookworld_debug.grpo.trace.state import build_model
    from . import _jacobian
    from .weights import scoring_model
    r, s = trace.rollout, w.state
    mask = loss_mask(r, trace.config).double()                                                      # (N, T)

    def total(weights) -> torch.Tensor:                                                            # (N,)
        full = {**s.before, **{n: v.to(s.before[n].dtype) for n, v in weights.items()}}
        model = scoring_model(trace, build_model(s, full))
        lp, _ = per_token_logps_and_entropy(model, r.prompt_ids, r.prompt_mask, r.completion_ids,
                                            r.completion_mask, r.temperatures)
        return (lp.double() * mask).sum(1)
    jac = jac if jac is not None else _jacobian(fixed, w)      # an update fix: for the loss's push per row
    base = (jac.logps.detach().double() * mask).sum(1)
    d_rec, d_cor = total(s.after) - base, total(after) - base
    push = _row_push(fixed, jac)
    adv_rec, adv_cor = trace.advantages.advantages, fixed.advantages.advantages
    rewards = trace.rewards.rewards
    return tuple(RowChange(i, float(rewards[i]), (float(adv_rec[i]), float(adv_cor[i])), float(push[i]),
                           (float(d_rec[i]), float(d_cor[i]))) for i in range(r.completion_ids.shape[0]))


def _norm(d: dict, names) -> float:
    return math.sqrt(sum(float(d[n].double().pow(2).sum()) for n in names))


def _cos(a: dict, b: dict, names) -> float:
    from .terms import dot
    den = _norm(a, names) * _norm(b, names)
    return dot(a, b, names) / den if den > 0 and math.isfinite(den) else math.nan


def _clipped(norm: float, max_norm) -> float:
    """The norm after torch's clip_grad_norm_ (coefficient max / (norm + 1e-6), at most 1)."""
    if not max_norm or not math.isfinite(norm):
        return norm
    return norm * min(1.0, float(max_norm) / (norm + 1e-6))


def _parameters(d_rec: dict, d_cor: dict, names) -> tuple:
    rows = [ParameterChange(n, float((d_cor[n] - d_rec[n]).norm()), float(d_rec[n].norm()), float(d_cor[n].norm()))
            for n in names]
    return tuple(sorted(rows, key=lambda p: -p.difference if math.isfinite(p.difference) else -math.inf)
                 [:TOP_PARAMETERS])


def describe(c: CorrectedStep) -> str:
    """The verdict and a small table (what `whatif STEP --fix` prints)."""
    if not c.phase:
        return c.note
    lines = [c.verdict() + ".", f"corrected from the {c.phase} phase: {c.basis}", "",
             f"{'':22s} {'recorded':>12s} {'corrected':>12s}",
             f"{'loss':22s} {fmt(c.loss[0]):>12s} {fmt(c.loss[1]):>12s}",
             f"{'‖g‖ before clipping':22s} {fmt(c.grad_norm[0]):>12s} {fmt(c.grad_norm[1]):>12s}",
             f"{'‖g‖ after clipping':22s} {fmt(c.grad_norm_clipped[0]):>12s} {fmt(c.grad_norm_clipped[1]):>12s}",
             f"{'‖Δθ‖':22s} {fmt(c.update_norm[0]):>12s} {fmt(c.update_norm[1]):>12s}",
             f"cos(g_recorded, g_corrected) = {fmt(c.grad_cos)}, ‖g_corrected‖ / ‖g_recorded‖ = {fmt(c.grad_ratio)}",
             f"cos(Δθ_recorded, Δθ_corrected) = {fmt(c.update_cos)}, ‖Δθ_corrected‖ / ‖Δθ_recorded‖ = "
             f"{fmt(c.update_ratio)}", "", "parameters the fix changes most (‖Δθ_corrected − Δθ_recorded‖):"]
    lines += [f"  {p.name:40s} {fmt(p.difference):>12s}  (‖Δθ‖ {fmt(p.recorded)} → {fmt(p.corrected)})"
              for p in c.parameters]
    lines += ["", f"{'row':>4s} {'reward':>8s} {'A recorded':>11s} {'A corrected':>12s} {'Δ log-lik rec':>14s} "
                  f"{'Δ log-lik cor':>14s}"]
    lines += [f"{r.row:4d} {r.reward:8.3g} {r.advantage[0]:11.4g} {r.advantage[1]:12.4g} {r.logp_change[0]:14.4g} "
              f"{r.logp_change[1]:14.4g}" + ("  ← changes direction" if r.flipped else "") for r in c.rows]
    return "\n".join(lines)

