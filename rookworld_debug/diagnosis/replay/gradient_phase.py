"""The gradient phase: the recorded gradient against ∇θ of the declared loss at the weights before the update; on a
disagreement, what it was fitted to be (a scale, whole parameters backward never reached, the micro-batches summed in
a 16-bit buffer, the loss's terms with other coefficients, the micro-batches weighted otherwise, an input wired in another's place, per-token discounted
advantages, the rows' own coefficients).

    gradient_check(recorded, ours, dtype, accumulation, fit=None, max_grad_norm=None) -> PhaseCheck
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .compare import DISAGREE, REL_TOL, parameter_samples, skipped, tol_for
from .records import AGREE, PhaseCheck, fmt
from .terms import dot as _dot, terms_cause

# a gradient difference below this L2 norm is float noise whatever the gradient's size (all-zero advantages leave
# only a KL gradient of ~1e-9 at a policy one tiny step from its reference)
GRAD_ATOL = 1e-6


def gradient_check(recorded: dict, ours: dict, dtype: str, accumulation: int, fit=None,
                   max_grad_norm=None) -> PhaseCheck:
    """The recorded gradient against the declared loss's; on a disagreement, the simplest fit that explains it: a
    scale, then `fit` (terms.GradientFit: the loss's terms with other coefficients, then its micro-batches). A
    gradient recorded after the loop's own clip agrees, with a note (`max_grad_norm`: the clip it applied)."""
    from rookworld_debug.grpo.trace.state import relative_error
    names = [n for n in ours if n in recorded]
    q = "gradient: ∇θ of the declared loss at the weights before the update (before clipping)"
    if not names:
        return skipped("gradient", q, "the recorded gradient names none of the model's parameters")
    tol = tol_for(REL_TOL, dtype)
    err, worst, worst_err = relative_error(recorded, ours, names)
    norm_ref = math.sqrt(_dot(ours, ours, names))
    norm_rec = math.sqrt(_dot(recorded, recorded, names))
    if err <= tol or err * norm_ref <= GRAD_ATOL:
        return PhaseCheck("gradient", q, AGREE, err, tol, measure="‖g_recorded − g‖ / ‖g‖")
    clipped = _recorded_after_clip(recorded, ours, names, norm_ref, max_grad_norm, tol, q)
    if clipped is not None:
        return clipped
    bound = max(tol * norm_rec, GRAD_ATOL)          # a fit holds to the recorded precision, or to float noise
    # a NaN or inf gradient: no fit (an infinite bound would let every one hold)
    finite = math.isfinite(norm_rec) and math.isfinite(norm_ref)
    phase, cause, why, fitted = _scale_fit(recorded, ours, names, norm_rec, norm_ref, bound, accumulation) \
        if finite else ("gradient", "", "the recorded or recomputed gradient holds NaN or ±inf", None)
    if cause == "gradient_scaled":
        cause, why, fitted = _scaled_up_to_clip(cause, why, fitted, norm_ref, norm_rec, max_grad_norm, tol)
    if not cause and finite and norm_rec > GRAD_ATOL:
        cause, why = _parameters_missing(recorded, ours, names, tol)
    if not cause and fit is not None and finite:
        phase, cause, why, fitted = _regression_fits(recorded, names, fit, bound, norm_rec, accumulation, ours)
    if not cause and norm_rec <= GRAD_ATOL:
        cause, why = "gradient_missing", "the recorded gradient is 0: backward never reached the parameters"
    k = _dot(recorded, ours, names) / (norm_ref ** 2) if norm_ref > 0 else math.nan
    if not cause and fit is not None and finite and 0.5 < k < 1.5 and norm_rec > 1.2 * norm_ref:
        cause, why = "gradient_not_zeroed", ("the recorded gradient holds this loss's gradient plus another one that "
                                             "no term of this step's loss explains: gradients not zeroed since an "
                                             "earlier backward")
    quantity = q if phase == "gradient" else ("the loss's gradient: ∇θ of the declared loss (the value agrees; "
                                              "what it differentiates does not)")
    return PhaseCheck(phase, quantity, DISAGREE, err, tol, f"worst parameter {worst} (relative error {worst_err:.3g})",
                      f"‖g‖ = {fmt(norm_rec)}", f"‖g‖ = {fmt(norm_ref)}", cause, why,
                      measure="‖g_recorded − g‖ / ‖g‖", fit=fitted, samples=parameter_samples(recorded, ours, worst, tol))


# the recorded gradient of a 16-bit loop is held to this many times the distance between the replay's own 16-bit
# and fp32 gradients of the step (the rounding's size on this step), where that is above the fixed tolerance
ROUNDING_MARGIN = 2.0
LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def within_rounding(check: PhaseCheck, trace, policy, trainable, ours: dict, dtype: str) -> PhaseCheck:
    """A 16-bit loop's gradient disagreement that no mechanism explains, held again to the rounding's own size on
    this step: the declared gradient recomputed under `dtype` autocast (one more forward and backward) is d from the
    fp32 one `ours`; within ROUNDING_MARGIN·d the check agrees, saying so. Else `check` unchanged."""
    from .terms import TokenJacobian, declared_gradient
    from rookworld_debug.grpo.trace.state import relative_error
    low = LOW.get(str(dtype).removeprefix("torch."))
    if low is None or check.status != DISAGREE or check.cause or not math.isfinite(check.max_abs_diff):
        return check
    device = next(policy.parameters()).device.type
    with torch.autocast(device, dtype=low):
        jac = TokenJacobian(trace, policy, trainable)
    rounded = declared_gradient(trace, jac)
    d = relative_error(rounded, ours, [n for n in ours if n in rounded])[0]
    bound = ROUNDING_MARGIN * d
    if not check.max_abs_diff <= bound:
        return check
    return PhaseCheck("gradient", check.quantity, AGREE, check.max_abs_diff, bound, measure=check.measure,
                      explanation=f"within the {dtype} rounding of this step's gradient: the replay's own {dtype} "
                                  f"autocast gradient is {d:.3g} from its fp32 one (relative), and the recorded one "
                                  f"{check.max_abs_diff:.3g}, within {ROUNDING_MARGIN:g}× that")


def unreachable(recorded: dict, jac, u: tuple, dtype: str) -> Optional[PhaseCheck]:
    """gradient_check(recorded, Jᵀu, dtype, …)'s disagreement where the head screen shows it without the backward
    (terms.TokenJacobian.screen_gap), else None. That check agrees only where ‖recorded − s·Jᵀu‖ ≤ tol·‖s·Jᵀu‖ (or
    GRAD_ATOL) for s = 1 or a clip's s < 1, and then ‖s·Jᵀu‖ ≤ ‖recorded‖ / (1 − tol): no s in [0, 1] within
    max(tol·‖recorded‖ / (1 − tol), GRAD_ATOL) rules every agreement out."""
    names = [n for n, _ in jac.params if n in recorded]
    tol = tol_for(REL_TOL, dtype)
    norm_rec = math.sqrt(_dot(recorded, recorded, names))
    bound = max(tol * norm_rec / (1.0 - tol), GRAD_ATOL)
    gap = jac.screen_gap(recorded, names, *u, scale=(0.0, 1.0)) if names else None
    if gap is None or gap <= bound:
        return None
    return PhaseCheck("gradient", "gradient: ∇θ of the declared loss at the weights before the update (before "
                      "clipping)", DISAGREE, gap / norm_rec, tol, "the final layer norm's gradient alone is farther "
                      "from the recorded one than any agreement allows (no backward run)", f"‖g‖ = {fmt(norm_rec)}",
                      "", measure="min over s in [0, 1] of ‖g_recorded − s·g‖ / ‖g_recorded‖ on the final layer norm "
                                  "(a lower bound)")


def _parameters_missing(recorded, ours, names, tol: float) -> tuple[str, str]:
    """(code, sentence) where the recorded gradient is exactly 0 on whole parameters whose declared gradient is not
    (backward never reached them: a gradient of a used parameter is never exactly 0 by chance), else ("", "")."""
    def norm(d, n):
        return float(d[n].double().norm())
    zero = [n for n in names if float(recorded[n].abs().max()) == 0.0 and norm(ours, n) > GRAD_ATOL]
    if not zero:
        return "", ""
    rest = [n for n in names if n not in zero]
    off = [n for n in rest if norm(recorded, n) == 0.0 or
           float((recorded[n].double() - ours[n].double()).norm()) > tol * max(norm(ours, n), GRAD_ATOL)]
    lost = math.sqrt(sum(norm(ours, n) ** 2 for n in zero))
    have = [n for n in rest if norm(recorded, n) > 0]
    why = (f"the recorded gradient is exactly 0 on {len(zero)} of {len(names)} parameters whose gradient under the "
           f"declared loss is not (‖g‖ = {lost:.4g} there): {', '.join(zero[:3])}{', …' if len(zero) > 3 else ''}; "
           f"only {', '.join(have[:4])}{', …' if len(have) > 4 else ''} carry one"
           + (f" ({len(rest) - len(off)} of them as declared)" if off else ", as declared") +
           ". Backward never reached those parameters: the graph is cut between them and the loss (a detach, a "
           "no_grad region, or reentrant activation checkpointing whose inputs do not require grad)")
    return "gradient_parameters_missing", why


def _scaled_up_to_clip(cause, why, fitted, norm_ref: float, norm_rec: float, max_grad_norm, tol: float):
    """A gradient scaled by k > 1 to exactly max_grad_norm from a smaller norm: the clip's coefficient
    max_norm / ‖g‖ applied without min(1, ·), so a small gradient is scaled UP (`grad_clip_scales_up`)."""
    m = float(max_grad_norm) if max_grad_norm else 0.0
    if not m or norm_ref >= m or abs(norm_rec - m) > tol * m:
        return cause, why, fitted
    k = norm_rec / norm_ref
    why = (f"the recorded gradient is {k:.4g} × the loss's gradient: its norm {norm_ref:.4g} was scaled UP to "
           f"max_grad_norm = {m:g} (the recorded norm {norm_rec:.4g}); the clip's coefficient max_norm / ‖g‖ = "
           f"{k:.4g} was applied without capping it at 1, so every step's gradient has norm {m:g}: "
           "clamp the coefficient (min(1, max_norm / ‖g‖), as torch.nn.utils.clip_grad_norm_ does)")
    return "grad_clip_scales_up", why, {**(fitted or {}), "sentence": why}


def _recorded_after_clip(recorded, ours, names, norm_ref: float, max_grad_norm, tol: float, q: str):
    """An agreeing check when the recorded gradient is exactly clip_grad_norm_(g, max_grad_norm) of the declared
    loss's g: the loop handed the recorder its gradient after clipping (a place to record, not a fault); else None."""
    from rookworld_debug.grpo.trace.state import relative_error
    if not max_grad_norm or not math.isfinite(norm_ref) or norm_ref <= float(max_grad_norm):
        return None
    c = float(max_grad_norm) / (norm_ref + 1e-6)                       # torch's clip coefficient
    err = relative_error(recorded, {n: ours[n] * c for n in names}, names)[0]
    if err > tol:
        return None
    return PhaseCheck("gradient", q, AGREE, err, tol, measure="‖g_recorded − clip(g)‖ / ‖clip(g)‖",
                      explanation=f"the loop recorded its gradient after clip_grad_norm_: it is the declared loss's "
                                  f"gradient (‖g‖ = {norm_ref:.4g}) × the clip's {c:.4g}, ‖g‖ = max_grad_norm = "
                                  f"{float(max_grad_norm):g}. Call rec.gradient(model) before clipping, so the "
                                  "update check sees the clip")


def _clipped_early(mb: dict, fit, names) -> Optional[str]:
    """The sentence when the micro-batches' fitted weights are those that clipping inside the micro-batch loop
    leaves (terms.clipped_in_loop at the declared max_grad_norm), else None."""
    from .terms import clipped_in_loop
    m = getattr(fit.trace.config, "max_grad_norm", None)
    grads = fit.micro_batch_gradients()
    if not m or len(mb) != len(grads) or len(grads) < 2:
        return None
    w = clipped_in_loop(list(grads.values()), names, float(m))
    a = [mb[k][0] for k in grads]
    if all(x >= 1.0 - 1e-9 for x in w) or any(abs(x - y) > 1e-3 * max(abs(y), 1e-12) + 1e-9 for x, y in zip(a, w)):
        return None                           # no clip bound, or the weights are not the clip's
    return (f"the recorded gradient is what clip_grad_norm_(max_grad_norm = {float(m):g}) leaves when it runs after "
            "each micro-batch's backward: the micro-batches carry weights " + ", ".join(f"{x:.4g}" for x in a) +
            " (the sequential clip's " + ", ".join(f"{x:.4g}" for x in w) + "), not 1 each. Clip once, after the "
            "last micro-batch's backward")


def _scale_fit(recorded, ours, names, norm_rec, norm_ref, bound, accumulation):
    """(phase, code, sentence, fit) of g_recorded = k·g, or ("gradient", "", "", None)."""
    if norm_ref == 0 or norm_rec <= GRAD_ATOL:
        return "gradient", "", "", None
    k = _dot(recorded, ours, names) / norm_ref ** 2
    resid = math.sqrt(max(norm_rec ** 2 - 2 * k * _dot(recorded, ours, names) + k * k * norm_ref ** 2, 0.0))
    if resid > bound or not math.isfinite(k):
        return "gradient", "", "", None
    why = f"the recorded gradient is {k:.4g} × the loss's gradient" + (
        f": the micro-batch losses were not divided by the {accumulation} accumulation steps"
        if accumulation > 1 and abs(k - accumulation) < 0.05 * accumulation else "" if k > 0 else
        ": it points the other way")
    return "gradient", "gradient_scaled", why, {"kind": "scaled", "params": {"scale": k},
                                                "residual": resid / norm_rec, "sentence": why}


def _regression_fits(recorded, names, fit, bound, norm_rec, accumulation, ours):
    """(phase, code, sentence, fit) of the loss's terms' regression, then the micro-batches'; the terms' fit (with
    its residual) as evidence when neither holds."""
    low = _accumulated_in_low_precision(recorded, names, fit, bound, norm_rec, ours)
    if low is not None:
        return low
    coefs, resid = fit.fit(recorded, names, bound)
    rel = resid / norm_rec if norm_rec > 0 else math.inf
    fitted = {"kind": "terms", "params": {t: {"fitted": a, "declared": d} for t, (a, d) in coefs.items()},
              "residual": rel, "sentence": ""}
    if resid <= bound:
        phase, cause, why = terms_cause(coefs, accumulation)
        return phase, cause, why, {**fitted, "sentence": why}
    carried, resid_c = fit.fit_carried_over(recorded, ours, names)
    if resid_c <= bound:
        c = carried["the previous pass's gradient"][0]
        why = (f"the recorded gradient is this pass's plus {c:.4g} × the previous pass's (at the weights that sampled"
               "): gradients not zeroed between the optimizer passes over the rollout")
        return "gradient", "gradient_not_zeroed", why, {
            "kind": "carried_over", "params": {t: {"fitted": a, "declared": d} for t, (a, d) in carried.items()},
            "residual": resid_c / norm_rec, "sentence": why}
    mb, resid_mb = fit.fit_micro_batches(recorded, names)
    early = _clipped_early(mb, fit, names) if resid_mb <= bound else None
    if early is not None:
        return "gradient", "gradient_clipped_early", early, {
            "kind": "micro_batches", "params": {t: {"fitted": a, "declared": d} for t, (a, d) in mb.items()},
            "residual": resid_mb / norm_rec if norm_rec > 0 else math.inf, "sentence": early}
    if resid_mb <= bound:
        why = ("the recorded gradient holds the micro-batches' gradients with other weights than the declared 1 "
               "each: " + "; ".join(f"{t}: {a:.4g}" for t, (a, _) in mb.items()) +
               (" (only the last survives: gradients zeroed between micro-batches)"
                if all(abs(a) < 0.02 for a, _ in list(mb.values())[:-1]) else ""))
        return "gradient", "gradient_micro_batches", why, {
            "kind": "micro_batches", "params": {t: {"fitted": a, "declared": d} for t, (a, d) in mb.items()},
            "residual": resid_mb / norm_rec if norm_rec > 0 else math.inf, "sentence": why}
    wired = fit.fit_wiring(recorded, names, bound)
    if wired is not None:
        name, why, resid_w = wired
        return "loss", "loss_wiring", why, {"kind": "wiring", "params": {"substitution": name},
                                            "residual": resid_w / norm_rec if norm_rec > 0 else math.inf,
                                            "sentence": why}
    discounted = fit.fit_discount(recorded, names, bound)
    if discounted is not None:
        gamma, resid_d = discounted
        why = (f"the policy term's per-token advantages are A·γ^(L−1−t) with γ = {gamma:g}: each row's outcome "
               "advantage discounted by the token's distance to the row's last token (a cumulative-return pass with "
               "γ < 1; GRPO's outcome advantage is the same for every token of a row, γ = 1), so early tokens get "
               "less of the credit")
        return "loss", "advantage_discounted_per_token", why, {
            "kind": "discount", "params": {"gamma": gamma},
            "residual": resid_d / norm_rec if norm_rec > 0 else math.inf, "sentence": why}
    return _rows_fit(recorded, names, fit, bound, norm_rec) or ("gradient", "", "", fitted)


def _accumulated_in_low_precision(recorded, names, fit, bound, norm_rec, ours) -> Optional[tuple]:
    """(phase, code, sentence, fit) where every recorded value is a 16-bit one and the micro-batches' gradients,
    summed in that type (the buffer rounded after each micro-batch's backward, as a bf16 or fp16 .grad accumulates
    them), reproduce the recorded gradient far closer than the declared one does; else None."""
    grads = list(fit.micro_batch_gradients().values())
    if len(grads) < 2:
        return None
    plain = math.sqrt(sum(float((recorded[n].double() - ours[n].double()).pow(2).sum()) for n in names))
    for dt in (torch.bfloat16, torch.float16):
        if not all(torch.equal(recorded[n], recorded[n].to(dt).to(recorded[n].dtype)) for n in names):
            continue
        acc = {n: torch.zeros(recorded[n].shape, dtype=torch.float32) for n in names}
        for g in grads:
            acc = {n: (acc[n] + g[n].float()).to(dt).float() for n in names}
        resid = math.sqrt(sum(float((recorded[n].double() - acc[n].double()).pow(2).sum()) for n in names))
        if resid <= bound and resid <= 0.1 * plain:       # the rounding is what closes the gap
            name = str(dt).removeprefix("torch.")
            why = (f"the recorded gradient is the {len(grads)} micro-batches' gradients summed in {name}: the "
                   f"accumulation buffer was rounded to {name} after each backward (a {name} .grad, or a cast after "
                   f"each micro-batch), so every partial sum lost its low bits; ‖g − g_{name} sum‖ / ‖g‖ = "
                   f"{resid / norm_rec:.2g} against {plain / norm_rec:.2g} for the declared fp32 sum. Accumulate "
                   "gradients in fp32")
            return "gradient", f"gradient_accumulated_in_{'bf16' if dt == torch.bfloat16 else 'fp16'}", why, {
                "kind": "accumulated_in_low_precision", "params": {"dtype": name, "micro_batches": len(grads)},
                "residual": resid / norm_rec if norm_rec > 0 else math.inf, "sentence": why}
    return None


def _rows_fit(recorded, names, fit, bound, norm_rec) -> Optional[tuple]:
    """(phase, code, sentence, fit) of the per-row regression (each row's policy term and KL term with its own
    coefficient), where it reproduces the recorded gradient and its coefficients say which rows went wrong."""
    from rookworld_debug.grpo.phases.generation import loss_mask
    from .terms import rows_cause
    rows, resid = fit.fit_rows(recorded, names)
    if not rows or resid > bound:
        return None
    t = fit.trace
    said = rows_cause(rows, t.advantages.advantages, float(t.config.beta), loss_mask(t.rollout, t.config).sum(1))
    if said is None:
        return None
    code, why = said
    return "loss", code, why, {"kind": "rows", "params": {k: [float(x) for x in v] for k, v in rows.items()},
                               "residual": resid / norm_rec if norm_rec > 0 else math.inf, "sentence": why}
