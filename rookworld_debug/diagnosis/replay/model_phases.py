"""The phases a replay recomputes from weights: the log-probs (policy, π_old, sampler, reference), the gradient of
the declared loss, and the optimizer's update.

Shape legend: N rows, T completion tokens, P prompt tokens, V vocabulary.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy

from .compare import DISAGREE, LOGP_TOL, MEAN_TOL, REL_TOL, SAMPLER_TOL, compare, skipped, tol_for
from .records import AGREE, PhaseCheck, fmt

ROWS_PER_FORWARD = 16
# a gradient difference below this L2 norm is float noise whatever the gradient's size (all-zero advantages leave
# only a KL gradient of ~1e-9 at a policy one tiny step from its reference)
GRAD_ATOL = 1e-6


@torch.no_grad()
def _variant_logps(model, r, *, temperature_one=False, plain_positions=False, unshifted=False,
                   warp=None) -> torch.Tensor:
    """(N, T) log-probs of the sampled ids under a common scoring mistake: logits not divided by the temperature,
    position ids that count the left padding, or logits not shifted by one (position t scoring token t)."""
    out = []
    for s in range(0, r.completion_ids.shape[0], ROWS_PER_FORWARD):
        rows = slice(s, s + ROWS_PER_FORWARD)
        ids, mask = r.completion_ids[rows], r.completion_mask[rows].long()
        full, attn = torch.cat([r.prompt_ids[rows], ids], 1), torch.cat([r.prompt_mask[rows].long(), mask], 1)
        kw = {} if plain_positions else {"position_ids": (attn.cumsum(1) - 1).clamp(min=0)}
        logits = model(input_ids=full, attention_mask=attn, **kw).logits.float()          # (n, P+T, V)
        p, t = r.prompt_ids.shape[1], ids.shape[1]
        at = logits[:, p:p + t] if unshifted else logits[:, p - 1:p + t - 1]             # (n, T, V)
        temps = torch.ones(ids.shape[0]) if temperature_one else r.temperatures[rows].float()
        tempered = at / temps[:, None, None]                                              # (n, T, V)
        if warp is not None:                  # the sampler's top-k / top-p, as the decoding loop applies them
            from rookworld_debug.grpo.phases.decoding import _warp
            n_, t_, v_ = tempered.shape
            k, p_ = (None if w is None else w[rows].repeat_interleave(t_) for w in warp)
            tempered = _warp(tempered.reshape(n_ * t_, v_), k, p_).reshape(n_, t_, v_)
        lp = tempered.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
        out.append(lp * mask)
    return torch.cat(out)


def recompute_logps(model, r) -> torch.Tensor:
    """(N, T) the trusted teacher-forced log-probs (tempered, fp32 log-softmax), 0 where masked."""
    logps, _ = per_token_logps_and_entropy(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                           r.temperatures)
    return logps


def scoring_checks(trace, policy, reference, dtype: str, *, have: set, ref_is_policy: bool,
                   policy_moved: bool = False) -> list[PhaseCheck]:
    """Each recorded log-prob tensor against the weights' recompute; mistakes that reproduce it name the cause."""
    r = trace.rollout
    mask = r.completion_mask
    tol = tol_for(LOGP_TOL, dtype)
    ours = recompute_logps(policy, r)                                                     # (N, T)
    variants = {
        "temperature_not_applied": (lambda: _variant_logps(policy, r, temperature_one=True),
                                    "the log-probs are of the raw logits: the sampling temperature was not applied"),
        "position_ids_left_pad": (lambda: _variant_logps(policy, r, plain_positions=True),
                                  "the forward counted the left padding in the position ids (no position_ids from "
                                  "the attention mask): every left-padded row is scored at shifted positions"),
        "logits_not_shifted": (lambda: _variant_logps(policy, r, unshifted=True),
                               "position t's logits scored token t (no shift by one): the log-probs are of the "
                               "next token"),
    }
    out = []
    named = [("policy", "per_token_logps (N, T): the loss forward's log-probs", r.per_token_logps),
             ("old", "old_per_token_logps (N, T): π_old (the weights before the update)",
              getattr(trace.recorded, "old_per_token_logps", None)),
             ("sampler", "sampling_per_token_logps (N, T): the sampler's log-probs", r.sampling_per_token_logps)]
    warp = _sampler_warpers(trace)
    if warp is not None:        # TRL's convention (and this package's) is the tempered distribution BEFORE top-k/p
        variants["sampler_logps_after_warping"] = (
            lambda: _variant_logps(policy, r, warp=warp), "the sampler recorded log-probs of the top-k / top-p "
            "renormalised distribution, not of the tempered policy: a ratio against them is biased")
    for key, q, rec in named:
        if rec is None or (key == "policy" and "policy" not in have) or not bool(torch.isfinite(rec[mask.bool()]).all()):
            continue
        c = compare("scoring", q, rec, ours, tol_for(SAMPLER_TOL, dtype) if key == "sampler" else tol, mask=mask,
                    unit="token", variants=variants, mean_tol=tol_for(MEAN_TOL, dtype))
        out.append(_dropout(c, trace) if key == "policy" else c)
    out.append(_reference_check(trace, reference, ours, tol, ref_is_policy, policy_moved))
    return out


def trace_dtype(trace) -> str:
    return getattr(trace.recorded, "dtype", None) or str(trace.config.dtype)


def _sampler_warpers(trace):
    """(top_k (N,), top_p (N,)) the sampler declared, each None when no row uses it; None when neither is on."""
    from rookworld_debug.grpo.phases.decoding import active_warpers
    settings = [trace.config.sampling_for(t) for t in trace.rollout.tasks]
    k = torch.tensor([int(s[2] or 0) for s in settings])
    p = torch.tensor([float(s[1] if s[1] is not None else 1.0) for s in settings])
    k, p = active_warpers(k, p, "cpu")
    return None if k is None and p is None else (k, p)


def _dropout(check: PhaseCheck, trace) -> PhaseCheck:
    from dataclasses import replace
    rec = trace.recorded
    if check.status == DISAGREE and not check.cause and rec is not None and rec.policy_training_mode:
        return replace(check, cause="dropout_active", explanation="the loss forward ran in training mode: dropout "
                       "made its log-probs random, so they are not the policy's")
    return check


def _reference_check(trace, reference, policy_logps, tol: float, ref_is_policy: bool,
                     policy_moved: bool = False) -> PhaseCheck:
    r = trace.rollout
    q = "ref_per_token_logps (N, T): the reference's log-probs"
    if r.ref_per_token_logps is None:
        return skipped("scoring", q, "no reference log-probs were recorded (β = 0 or the loop has no reference)")
    if reference is None:
        return skipped("scoring", q, "the reference's weights were not recorded")
    step = getattr(trace.recorded, "step", None)
    if ref_is_policy and policy_moved and step is not None and step > 1:
        return PhaseCheck("scoring", "the reference's weights: frozen at the policy's start", DISAGREE, 0.0, 0.0,
                          f"every weight (step {step})", "θ_ref = θ_policy", f"θ_ref = the start weights (policy "
                          f"moved by {step - 1} update(s))", "reference_tracks_policy",
                          f"at step {step} the reference's weights are the policy's own, although the optimizer's "
                          "moments show earlier updates: a frozen reference keeps the start weights, so the KL term is "
                          "0 and holds nothing back (TRL's sync_ref_model copies them on purpose, at its sync steps "
                          "only)", measure="max |θ_ref − θ_policy|")
    ours = recompute_logps(reference, r)
    variants = {} if ref_is_policy else {
        "reference_tracks_policy": (policy_logps, "the 'reference' log-probs are the policy's own: the KL term is "
                                                  "0 and holds nothing back")}
    return compare("scoring", q, r.ref_per_token_logps, ours, tol, mask=r.completion_mask, unit="token",
                   variants=variants, mean_tol=tol_for(MEAN_TOL, trace_dtype(trace)))


def recompute_gradient(trace, policy, trainable, objective=None, advantages=None) -> dict:
    """{name: ∇θ of the declared loss} on the recorded rows, advantages, π_old and reference, summed over the
    step's micro-batches as the loop accumulated them (`objective` / `advantages`: a variant's)."""
    from rookworld_debug.diagnosis.replay.data_phases import micro_batches
    r = trace.rollout
    ob = objective or Objective.from_config(trace.config)
    adv = trace.advantages.advantages if advantages is None else advantages
    names = set(trainable)
    for n, p in policy.named_parameters():
        p.requires_grad_(n in names)
        p.grad = None
    old = getattr(trace.recorded, "old_per_token_logps", None)
    chunks = micro_batches(trace)
    for rows in chunks:
        logps, ent = per_token_logps_and_entropy(policy, r.prompt_ids[rows], r.prompt_mask[rows],
                                                 r.completion_ids[rows], r.completion_mask[rows],
                                                 r.temperatures[rows], with_grad=True,
                                                 entropy_grad=ob.entropy_coef != 0)
        pick = (lambda x: None if x is None else x[rows])
        compute_loss(logps, pick(old), pick(r.ref_per_token_logps), adv[rows], r.completion_mask[rows], ob,
                     LossBatch(entropy=ent, num_items_in_batch=r.completion_mask.sum(),
                               gradient_accumulation_steps=len(chunks))).loss.backward()
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in policy.named_parameters() if n in names}


def loss_variant_gradients(trace, policy, trainable, ours: dict):
    """(code, sentence, gradient) of the loss mistakes a loss value can hide (Σ A = 0 within a group at ratio 1),
    each computed on demand."""
    from rookworld_debug.grpo.families import families
    ob = Objective.from_config(trace.config)

    def grad(**kw):
        return lambda: recompute_gradient(trace, policy, trainable, **kw)
    yield ("loss_advantage_sign", "the loss uses −A (its value hides it: Σ A = 0 in a group; its gradient does "
           "not): the update pushes down the better completions", grad(advantages=-trace.advantages.advantages))
    if ob.beta:
        no_kl = grad(objective=ob.replace(beta=0.0))
        yield ("kl_not_applied", "the loss leaves out the β·KL term", no_kl)
        yield ("kl_sign_flipped", "the KL term enters with −β: it pushes the policy away from the reference",
               lambda: {n: 2 * v - ours[n] for n, v in no_kl().items()})     # linear in β: g(−β) = 2·g(0) − g(β)
    for lt in sorted({lt for fam in families() for lt in fam.rules} - {ob.loss_type}):
        yield (f"loss_aggregation/{lt}", f"the loss is loss_type={lt!r}'s aggregation, not the declared "
               f"{ob.loss_type!r}'s", grad(objective=ob.replace(loss_type=lt)))


def _dot(a: dict, b: dict, names) -> float:
    return sum(float((a[n].double() * b[n].double()).sum()) for n in names)


def gradient_check(recorded: dict, ours: dict, dtype: str, accumulation: int, loss_variants=()) -> PhaseCheck:
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
    k = _dot(recorded, ours, names) / (norm_ref ** 2) if norm_ref > 0 else math.nan
    resid = math.sqrt(max(norm_rec ** 2 - 2 * k * _dot(recorded, ours, names) + k * k * norm_ref ** 2, 0.0))
    cause, why = "", ""
    if norm_rec == 0:
        cause, why = "gradient_missing", "the recorded gradient is 0: backward never reached the parameters"
    elif resid <= tol * norm_rec and math.isfinite(k):
        cause = "gradient_scaled"
        why = (f"the recorded gradient is {k:.4g} × the loss's gradient" +
               (f": the micro-batch losses were not divided by the {accumulation} accumulation steps"
                if accumulation > 1 and abs(k - accumulation) < 0.05 * accumulation else
                "" if k > 0 else ": it points the other way"))
    else:
        found = _loss_mistake(recorded, names, tol, loss_variants)
        if found is not None:
            code, why, err_v = found
            return PhaseCheck("loss", "the loss's gradient: ∇θ of the declared loss (the value agrees; what it "
                              "differentiates does not)", DISAGREE, err, tol, f"worst parameter {worst}",
                              f"‖g‖ = {fmt(norm_rec)}", f"‖g‖ = {fmt(norm_ref)}", code.split("/")[0], why,
                              measure="‖g_recorded − g‖ / ‖g‖")
        if 0.5 < k < 1.5 and norm_rec > 1.2 * norm_ref:
            cause, why = "gradient_not_zeroed", ("the recorded gradient holds this loss's gradient plus another "
                                                 "one (gradients not zeroed since an earlier backward)")
    return PhaseCheck("gradient", q, DISAGREE, err, tol, f"worst parameter {worst} (relative error {worst_err:.3g})",
                      f"‖g‖ = {fmt(norm_rec)}", f"‖g‖ = {fmt(norm_ref)}", cause, why,
                      measure="‖g_recorded − g‖ / ‖g‖")


def _loss_mistake(recorded: dict, names, tol: float, variants):
    """(code, sentence, error) of the first loss variant whose gradient is the recorded one, else None."""
    from rookworld_debug.grpo.trace.state import relative_error
    for code, sentence, grad in variants:
        try:
            g = grad()
        except Exception:  # noqa: BLE001 - a variant the batch's settings refuse explains nothing
            continue
        err = relative_error(recorded, g, names)[0]
        if err <= tol:
            return code, sentence, err
    return None


OPTIMIZERS = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}


def rerun_update(before: dict, grad: dict, trainable, kind: str, settings: dict, opt_state: Optional[dict],
                 max_grad_norm: Optional[float], *, clip: bool = True, fresh_state: bool = False) -> dict:
    """{name: θ after one step of the recorded optimizer} from θ_before, the recorded gradient and state."""
    names = [n for n in trainable if n in grad and n in before]
    # in the recorded dtype: a bf16 model's optimizer steps in bf16, and its rounding is part of what it did
    params = [torch.nn.Parameter(before[n].detach().clone()) for n in names]
    for p, n in zip(params, names):
        p.grad = grad[n].detach().clone().to(p.dtype)
    if clip and max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, float(max_grad_norm))
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in settings.items()}
    opt = OPTIMIZERS[kind](params, **kw)
    if opt_state and not fresh_state:
        sd = opt.state_dict()
        sd["state"] = {i: {k: (v.clone() if k != "step" else v.clone().float().reshape(()))
                           for k, v in opt_state.get(n, {}).items()} for i, n in enumerate(names)
                       if opt_state.get(n)}
        opt.load_state_dict(sd)
    opt.step()
    return {n: p.detach() for n, p in zip(names, params)}


def update_check(state, max_grad_norm, dtype: str) -> PhaseCheck:
    from rookworld_debug.grpo.trace.state import relative_error
    q = f"update: θ_after from θ_before, the recorded gradient and {state.optimizer or 'its optimizer'}'s state"
    before, after, grad = state.before, state.after, state.gradient
    names = [n for n in state.trainable if n in grad and n in before and n in after]
    tol = tol_for(REL_TOL, dtype)
    ours = rerun_update(before, grad, names, state.optimizer, state.optimizer_settings, state.optimizer_state,
                        max_grad_norm)
    d_rec = {n: after[n].double() - before[n].double() for n in names}
    d_ref = {n: ours[n].double() - before[n].double() for n in names}
    err, worst, worst_err = relative_error(d_rec, d_ref, names)
    if err <= tol:
        return PhaseCheck("update", q, AGREE, err, tol, measure="‖Δθ_recorded − Δθ‖ / ‖Δθ‖")
    norm_rec = math.sqrt(_dot(d_rec, d_rec, names))

    def variant(**kw):
        def run():
            o = rerun_update(before, grad, names, state.optimizer, state.optimizer_settings, state.optimizer_state,
                             max_grad_norm, **kw)
            return relative_error(d_rec, {n: o[n].double() - before[n].double() for n in names}, names)[0]
        return run
    cause, why = "", ""
    if norm_rec == 0:
        cause, why = "optimizer_no_op", "the weights did not move: the optimizer applied nothing"
    else:
        for code, run, sentence in (
                ("optimizer_state_reset", variant(fresh_state=True),
                 "the update is a first step's: the optimizer's moments were reset (a new optimizer each step?)"),
                ("grad_clip_not_applied", variant(clip=False),
                 f"the update used the unclipped gradient: max_grad_norm {max_grad_norm} was not applied")):
            if (max_grad_norm or code != "grad_clip_not_applied") and run() <= tol:
                cause, why = code, sentence
                break
    if not cause:
        k = _dot(d_rec, d_ref, names) / max(_dot(d_ref, d_ref, names), 1e-300)
        if abs(k - 1) > tol and relative_error(d_rec, {n: k * d_ref[n] for n in names}, names)[0] <= tol:
            cause, why = "update_scaled", (f"the weights moved {k:.4g} × the recorded optimizer's step "
                                           "(another learning rate than the optimizer's, or a sign)")
    return PhaseCheck("update", q, DISAGREE, err, tol, f"worst parameter {worst} (relative error {worst_err:.3g})",
                      f"‖Δθ‖ = {fmt(norm_rec)}", f"‖Δθ‖ = {fmt(math.sqrt(_dot(d_ref, d_ref, names)))}", cause, why,
                      measure="‖Δθ_recorded − Δθ‖ / ‖Δθ‖")
