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
from rookworld_debug.grpo.phases.generation import loss_mask
from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy

from .compare import DISAGREE, LOGP_TOL, MEAN_TOL, REL_TOL, SAMPLER_TOL, compare, skipped, tol_for
from .fits import value_fits
from .terms import terms_cause
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
                   policy_moved: bool = False, sampler=None, cache: Optional[dict] = None) -> list[PhaseCheck]:
    """Each recorded log-prob tensor against the recompute from the weights that made it (the policy's from the
    weights before the update; π_old's and the sampler's from the weights that sampled: `sampler`, or the weights
    before on a rollout's first pass); mistakes that reproduce it name the cause."""
    r = trace.rollout
    mask = r.completion_mask
    tol = tol_for(LOGP_TOL, dtype)
    iteration = int(getattr(trace.recorded, "iteration", 0) or 0)
    logps = _LogpCache(r, cache)
    ours = logps(policy)                                                                  # (N, T)
    variants = _scoring_variants(trace, policy)
    sampled_by = sampler if sampler is not None else policy if iteration == 0 else None
    models = {"the weights before the update": policy, "the weights that sampled the rollout": sampler,
              "the reference's weights": reference}
    out = [] if sampler is None else [_sampler_identity(policy, sampler, iteration)]
    named = [("policy", "per_token_logps (N, T): the loss forward's log-probs", r.per_token_logps, policy),
             ("old", "old_per_token_logps (N, T): π_old (the weights that sampled the rollout)",
              getattr(trace.recorded, "old_per_token_logps", None), sampled_by),
             ("sampler", "sampling_per_token_logps (N, T): the sampler's log-probs", r.sampling_per_token_logps,
              sampled_by)]
    for key, q, rec, model in named:
        if rec is None or (key == "policy" and "policy" not in have) or not bool(torch.isfinite(rec[mask.bool()]).all()):
            continue
        if model is None:
            out.append(skipped("scoring", q, f"this is pass {iteration} of num_iterations over the rollout: the "
                                             "weights that sampled it were not recorded (StepRecorder.sampler)"))
            continue
        c = compare("scoring", q, rec, logps(model), tol_for(SAMPLER_TOL, dtype) if key == "sampler" else tol,
                    mask=mask, unit="token", variants=variants, mean_tol=tol_for(MEAN_TOL, dtype),
                    fit=value_fits(r.num_generations))
        if c.status == DISAGREE and not c.cause:
            c = _other_weights(c, rec, mask, model, models, logps, tol)
        out.append(_dropout(c, trace) if key == "policy" else c)
    out.append(_reference_check(trace, reference, ours, tol, ref_is_policy, policy_moved, logps))
    return out


class _LogpCache:
    """The trusted log-probs of the rollout under each model, computed once per model."""
    def __init__(self, rollout, cache: Optional[dict] = None):
        self.rollout, self.done = rollout, {} if cache is None else cache

    def __call__(self, model) -> torch.Tensor:
        key = ("logps", id(model), id(self.rollout))
        if key not in self.done:
            self.done[key] = recompute_logps(model, self.rollout)
        return self.done[key]


def _scoring_variants(trace, policy) -> dict:
    r = trace.rollout
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
    warp = _sampler_warpers(trace)
    if warp is not None:        # TRL's convention (and this package's) is the tempered distribution BEFORE top-k/p
        variants["sampler_logps_after_warping"] = (
            lambda: _variant_logps(policy, r, warp=warp), "the sampler recorded log-probs of the top-k / top-p "
            "renormalised distribution, not of the tempered policy: a ratio against them is biased")
    else:                       # a filter the declaration does not have: its k fitted from the recorded values
        k = {}

        def top_k_logps():
            k["k"] = _fitted_top_k(policy, r)
            n = r.completion_ids.shape[0]
            return None if k["k"] is None else _variant_logps(policy, r, warp=(torch.full((n,), k["k"]), None))
        variants["sampler_logps_after_warping/fitted"] = (
            top_k_logps, lambda: f"the sampler's log-probs are those of the tempered distribution renormalised over "
            f"its top k = {k['k']} tokens (k fitted from the recorded values), a filter the declaration does not "
            "have (top_k=0): the rollout came from another distribution than the declared one, and a ratio against "
            "it is biased")
    return variants


@torch.no_grad()
def _fitted_top_k(model, r) -> Optional[int]:
    """The k for which log-probs renormalised over the top k reproduce the recorded sampler's, token by token
    (its most common value over the tokens a filter changed), or None."""
    ks = []
    for s in range(0, r.completion_ids.shape[0], ROWS_PER_FORWARD):
        rows = slice(s, s + ROWS_PER_FORWARD)
        ids, mask = r.completion_ids[rows], r.completion_mask[rows].bool()
        full, attn = torch.cat([r.prompt_ids[rows], ids], 1), torch.cat([r.prompt_mask[rows].long(), mask.long()], 1)
        logits = model(input_ids=full, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
        p, t = r.prompt_ids.shape[1], ids.shape[1]
        lp = (logits[:, p - 1:p + t - 1].float() / r.temperatures[rows].float()[:, None, None]).log_softmax(-1)
        mass = lp.sort(-1, descending=True).values.logcumsumexp(-1)                      # (n, T, V) log Σ top-k
        gap = lp.gather(-1, ids[..., None]).squeeze(-1) - r.sampling_per_token_logps[rows].float()   # (n, T) ≤ 0
        changed = mask & (gap < -1e-3)
        k = (mass - gap[..., None]).abs().argmin(-1) + 1                                  # (n, T)
        ks.append(k[changed])
    ks = torch.cat(ks)
    return int(ks.mode().values) if ks.numel() else None


def _other_weights(check: PhaseCheck, rec, mask, expected, models: dict, logps, tol: float) -> PhaseCheck:
    """A fit over the recorded weights: the disagreeing log-probs are those of another recorded set of weights
    (π_old recomputed from the current weights on a later pass, a sampler's values from the reference, …)."""
    from dataclasses import replace
    for name, model in models.items():
        if model is None or model is expected:
            continue
        if _max_diff_masked(rec, logps(model), mask) <= tol:
            return replace(check, cause="logps_from_other_weights",
                           explanation=f"the recorded values are the log-probs of {name}, not of the weights that "
                                       "should have made them")
    return check


def _max_diff_masked(a, b, mask) -> float:
    d = (a.double() - b.double()).abs().nan_to_num(nan=math.inf).masked_fill(mask == 0, 0.0)
    return float(d.max()) if d.numel() else 0.0


@torch.no_grad()
def _sampler_identity(policy, sampler, iteration: int) -> PhaseCheck:
    """On a rollout's first pass the weights that sampled are the weights before the update; on a later pass they
    are the weights of an earlier one (they differ)."""
    names = [n for n, _ in policy.named_parameters()]
    before = dict(policy.named_parameters())
    samp = dict(sampler.named_parameters())
    num = sum(float((samp[n].double() - before[n].double()).pow(2).sum()) for n in names if n in samp)
    den = sum(float(before[n].double().pow(2).sum()) for n in names)
    rel = math.sqrt(num / den) if den > 0 else math.inf
    q = "the weights that sampled the rollout: the policy's at the rollout's first pass"
    if iteration > 0 or rel == 0.0:
        return PhaseCheck("generation", q, AGREE, rel, 0.0, measure="‖θ_sampler − θ_before‖ / ‖θ_before‖")
    return PhaseCheck("generation", q, DISAGREE, rel, 0.0, "every weight", f"‖Δθ‖/‖θ‖ = {rel:.3g}",
                      "θ_sampler = θ_before", "sampler_weights_stale",
                      "the rollout was sampled by weights that are not the policy's at this step (its first pass): "
                      "a separate sampler copy not synced since an earlier update samples from an older policy",
                      measure="‖θ_sampler − θ_before‖ / ‖θ_before‖")


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
                     policy_moved: bool = False, logps=None) -> PhaseCheck:
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
    ours = logps(reference) if logps is not None else recompute_logps(reference, r)
    variants = {} if ref_is_policy else {
        "reference_tracks_policy": (policy_logps, "the 'reference' log-probs are the policy's own: the KL term is "
                                                  "0 and holds nothing back")}
    return compare("scoring", q, r.ref_per_token_logps, ours, tol, mask=r.completion_mask, unit="token",
                   variants=variants, mean_tol=tol_for(MEAN_TOL, trace_dtype(trace)))


def recompute_gradient(trace, policy, trainable, objective=None, advantages=None) -> dict:
    """{name: ∇θ of the declared loss} on the recorded rows, advantages, π_old and reference, summed over the
    step's micro-batches as the loop accumulated them (`objective` / `advantages`: a variant's)."""
    from rookworld_debug.diagnosis.replay.data_phases import accumulation, micro_batches
    r = trace.rollout
    ob = objective or Objective.from_config(trace.config)
    adv = trace.advantages.advantages if advantages is None else advantages
    names = set(trainable)
    for n, p in policy.named_parameters():
        p.requires_grad_(n in names)
        p.grad = None
    old = getattr(trace.recorded, "old_per_token_logps", None)
    mask = loss_mask(r, trace.config)                                                    # (N, T)
    chunks = micro_batches(trace)
    for rows in chunks:
        logps, ent = per_token_logps_and_entropy(policy, r.prompt_ids[rows], r.prompt_mask[rows],
                                                 r.completion_ids[rows], r.completion_mask[rows],
                                                 r.temperatures[rows], with_grad=True,
                                                 entropy_grad=ob.entropy_coef != 0)
        pick = (lambda x: None if x is None else x[rows])
        loss = compute_loss(logps, pick(old), pick(r.ref_per_token_logps), adv[rows], mask[rows], ob,
                            LossBatch(entropy=ent, num_items_in_batch=mask.sum(),
                                      gradient_accumulation_steps=accumulation(trace))).loss
        loss.backward()
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in policy.named_parameters() if n in names}


def _dot(a: dict, b: dict, names) -> float:
    return sum(float((a[n].double() * b[n].double()).sum()) for n in names)


def gradient_check(recorded: dict, ours: dict, dtype: str, accumulation: int, fit=None) -> PhaseCheck:
    """The recorded gradient against the declared loss's; on a disagreement, the simplest fit that explains it: a
    scale, then `fit` (terms.GradientFit: the loss's terms with other coefficients)."""
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
    phase, cause, why, fitted = "gradient", "", "", None
    if norm_rec == 0:
        cause, why = "gradient_missing", "the recorded gradient is 0: backward never reached the parameters"
    elif resid <= tol * norm_rec and math.isfinite(k):
        cause, why = "gradient_scaled", f"the recorded gradient is {k:.4g} × the loss's gradient" + (
            f": the micro-batch losses were not divided by the {accumulation} accumulation steps"
            if accumulation > 1 and abs(k - accumulation) < 0.05 * accumulation else "" if k > 0 else
            ": it points the other way")
        fitted = {"kind": "scaled", "params": {"scale": k}, "residual": resid / norm_rec, "sentence": why}
    elif fit is not None:
        coefs, rel = fit.fit(recorded, names, tol)
        fitted = {"kind": "terms", "params": {t: {"fitted": a, "declared": d} for t, (a, d) in coefs.items()},
                  "residual": rel, "sentence": ""}
        mb, rel_mb = fit.fit_micro_batches(recorded, names) if rel > tol else ({}, math.inf)
        if rel <= tol:
            phase, cause, why = terms_cause(coefs, accumulation)
            fitted["sentence"] = why
        elif rel_mb <= tol:
            why = ("the recorded gradient holds the micro-batches' gradients with other weights than the declared 1 "
                   "each: " + "; ".join(f"{t}: {a:.4g}" for t, (a, _) in mb.items()) +
                   (" (only the last survives: gradients zeroed between micro-batches)"
                    if all(abs(a) < 0.02 for a, _ in list(mb.values())[:-1]) else ""))
            cause = "gradient_micro_batches"
            fitted = {"kind": "micro_batches", "params": {t: {"fitted": a, "declared": d} for t, (a, d) in mb.items()},
                      "residual": rel_mb, "sentence": why}
        elif 0.5 < k < 1.5 and norm_rec > 1.2 * norm_ref:
            cause, why = "gradient_not_zeroed", ("the recorded gradient holds this loss's gradient plus another "
                                                 "one that no term of this step's loss explains (fitted residual "
                                                 f"{rel:.3g}): gradients not zeroed since an earlier backward")
    quantity = q if phase == "gradient" else ("the loss's gradient: ∇θ of the declared loss (the value agrees; "
                                              "what it differentiates does not)")
    return PhaseCheck(phase, quantity, DISAGREE, err, tol, f"worst parameter {worst} (relative error {worst_err:.3g})",
                      f"‖g‖ = {fmt(norm_rec)}", f"‖g‖ = {fmt(norm_ref)}", cause, why,
                      measure="‖g_recorded − g‖ / ‖g‖", fit=fitted)


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
    fitted = None
    if not cause:
        cause, why, fitted = _update_fit(d_rec, d_ref, before, names, tol, state.optimizer_settings)
    return PhaseCheck("update", q, DISAGREE, err, tol, f"worst parameter {worst} (relative error {worst_err:.3g})",
                      f"‖Δθ‖ = {fmt(norm_rec)}", f"‖Δθ‖ = {fmt(math.sqrt(_dot(d_ref, d_ref, names)))}", cause, why,
                      measure="‖Δθ_recorded − Δθ‖ / ‖Δθ‖", fit=fitted)


def _update_fit(d_rec: dict, d_ref: dict, before: dict, names, tol: float, settings: dict):
    """(code, sentence, fit) of Δθ_recorded ≈ a·Δθ_optimizer + c·θ_before (a: the learning-rate factor actually
    applied; c: a component along θ, a decay the optimizer was not told about), or of an element-wise clamp of the
    optimizer's step; ("", "", fit-with-its-residual) when neither holds."""
    from rookworld_debug.grpo.trace.state import relative_error
    th = {n: before[n].double() for n in names}
    gram = torch.tensor([[_dot(d_ref, d_ref, names), _dot(d_ref, th, names)],
                         [_dot(th, d_ref, names), _dot(th, th, names)]], dtype=torch.float64)
    rhs = torch.tensor([_dot(d_ref, d_rec, names), _dot(th, d_rec, names)], dtype=torch.float64)
    a, c = (float(v) for v in torch.linalg.lstsq(gram, rhs[:, None]).solution.squeeze(1))
    k = _dot(d_rec, d_ref, names) / max(_dot(d_ref, d_ref, names), 1e-300)
    only_a = relative_error(d_rec, {n: k * d_ref[n] for n in names}, names)[0]
    both = relative_error(d_rec, {n: a * d_ref[n] + c * th[n] for n in names}, names)[0]
    lr = settings.get("lr")
    fit = {"kind": "update", "params": {"lr_factor": k, "along_theta": 0.0}, "residual": only_a, "sentence": ""}
    if only_a <= tol and abs(k - 1) > tol:
        why = (f"the weights moved {k:.4g} × the recorded optimizer's step: the learning rate applied was "
               f"{k:.4g} × the optimizer's" + (f" ({k * lr:.4g} instead of {lr:.4g}: another step's schedule, or a "
                                               "changed group lr)" if isinstance(lr, (int, float)) else ""))
        return "update_scaled", why, {**fit, "sentence": why}
    if both <= tol and abs(c) > 0:
        decay = f" = −lr·λ with λ = {-c / lr:.4g} beyond the recorded weight_decay at lr {lr:.4g}" \
            if isinstance(lr, (int, float)) and lr > 0 else ""
        why = (f"the weights moved {a:.4g} × the optimizer's step plus {c:.4g} × θ{decay}: a component along the "
               "weights that the optimizer's recorded settings do not hold (a changed weight_decay, or an L2 term)")
        return "update_along_weights", why, {**fit, "params": {"lr_factor": a, "along_theta": c}, "residual": both,
                                             "sentence": why}
    m = max(float(d_rec[n].abs().max()) for n in names)
    clamped = relative_error(d_rec, {n: d_ref[n].clamp(-m, m) for n in names}, names)[0]
    if clamped <= tol and any(float(d_ref[n].abs().max()) > m * (1 + tol) for n in names):
        why = f"the weights moved by the optimizer's step clamped element-wise to ±{m:.4g}"
        return "update_clamped", why, {**fit, "kind": "clamped", "params": {"bound": m}, "residual": clamped,
                                       "sentence": why}
    return "", "", fit
