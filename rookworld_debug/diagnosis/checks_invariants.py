"""Checks: invariants every healthy GRPO step keeps, read from the mechanism, not from one fault's signature.

* the optimizer applied what the gradient asked: lr > 0 and a non-zero gradient move the weights (‖Δθ‖ > 0) and
  the log-probs of the sampled tokens (Δℓ ≠ 0);
* the reference is frozen and separate from the policy: once the policy has moved, ℓ ≠ ℓ^ref somewhere (KL > 0);
* the loss the optimizer differentiated is the displayed loss (the grad path's value equals the record's);
* the policy moved toward its advantages: corr(A, Δℓ) is not negative beyond noise;
* no setting turns the objective upside down (β < 0, a negative learning rate, every reward weight negative,
  a negative clip range; a negative entropy coefficient minimises entropy).
A check that needs a record the trace lacks (no update, no post-update evaluation) says nothing.
"""
from __future__ import annotations

import math

import torch

from rookworld_debug.diagnosis import evidence as E
from rookworld_debug.diagnosis.context import current_step
from rookworld_debug.diagnosis.findings import Finding, Fix

# float32 forwards of the same weights and tokens agree to ~1e-7 nats; a moved policy's sampled tokens move by
# far more (one AdamW step at lr 1e-6 moves each weight by ~1e-6 and a token's log-prob by ~1e-2)
SAME_LOGP = 1e-6
# the smallest step any first-order optimizer takes is ~lr·min(1, ‖g‖) (AdamW: ~lr per weight; SGD: lr·‖g‖);
# a thousand times below that is no step
NO_STEP = 1e-3
# a gradient below this norm is ~0 next to AdamW's ε (1e-8 per weight): no move is expected from it
MIN_GRAD = 1e-6
# corr(A, Δℓ) below 0 by more than 3 standard errors (Fisher z): not noise
Z_AGAINST = 3.0
LOSS_PATH_TOLERANCE = 1e-5   # |loss(grad path) − loss(record)|: fp32 recompute noise is ~1e-7


def _step(trace):
    return E.step_of(trace, current_step())


def _moved_logps(trace):
    """max |ℓ_after − ℓ_before| on the masked sampled tokens, or None without a post-update evaluation."""
    e = trace.evaluation
    if e is None or e.delta_logp is None:
        return None
    d = e.delta_logp.float()[E.mask(trace)]
    if d.numel() == 0 or not bool(torch.isfinite(d).all()):
        return None
    return float(d.abs().max())


def check_optimizer_applied(trace) -> list[Finding]:
    """lr > 0 and a non-zero gradient, yet the weights (‖Δθ‖) or the sampled tokens' log-probs did not move."""
    u = trace.update
    if u is None or not (float(u.lr) > 0) or not math.isfinite(u.grad_norm_post_clip):
        return []
    g = float(u.grad_norm_post_clip)
    if g <= MIN_GRAD:
        return []
    bound = NO_STEP * float(u.lr) * min(1.0, g)
    pdn = float(u.param_delta_norm)
    moved = _moved_logps(trace)
    still_w = math.isfinite(pdn) and pdn <= bound
    still_l = moved is not None and moved <= SAME_LOGP
    if not (still_w or still_l):
        return []
    evs = (E.ev("learning_rate", u.lr, "the optimizer step's learning rate", "config"),
           E.ev("grad_norm_post_clip", g, "global gradient L2 norm after clipping (what the optimizer was given)",
                where="report: Update"),
           E.ev("param_delta_norm", pdn, "‖θ_after − θ_before‖₂ over the policy's weights (NaN: not recorded)"),
           E.ev("smallest_expected_step", bound, f"{NO_STEP:g} × lr × min(1, ‖g‖): far below any first-order "
                "optimizer's step"),
           E.ev("max_abs_delta_logp", moved if moved is not None else math.nan, "max |ℓ_after − ℓ_before| on the "
                "rollout's sampled tokens (NaN: no post-update evaluation)", "sampled rollout",
                "report: Post-update evaluation"))
    return [Finding(
        code="optimizer_no_op", severity="error",
        cause="The optimizer applied nothing: the step had a non-zero gradient and a positive learning rate, but "
              "the policy's weights and log-probs did not move, so training cannot change the model.",
        evidence=evs, fix=Fix("Build the optimizer over the policy's own parameters and call step() after backward "
                              "(before zero_grad).",
                              code_change="optimizer = AdamW(policy.parameters()); loss.backward(); optimizer.step(); "
                                          "optimizer.zero_grad() — check the parameters are the trained model's and "
                                          "require grad"),
        alternatives=("frozen parameters (requires_grad=False) or an optimizer over a copy of the model",
                      "a learning-rate schedule at 0 this step (the logged lr says)"),
        score=10.8, step=_step(trace))]


def _shares_weights(a, b) -> bool:
    """True when two live models are one object or share their first weight's storage."""
    if a is None or b is None:
        return False
    if a is b:
        return True
    try:
        return next(a.parameters()).data_ptr() == next(b.parameters()).data_ptr()
    except (AttributeError, StopIteration, TypeError, RuntimeError):
        return False


def _after_updates(trace) -> bool:
    """The policy that sampled this rollout has been updated (a later step of a run_step run). A TRL capture alone
    cannot tell: a step with a zero gradient leaves the policy at its start, so the captured run's weights hashes
    decide (`checks_run_invariants.check_captured_weights`)."""
    if trace.capture is not None:
        return False
    step = current_step()
    return step is not None and step >= 1


def check_reference_frozen(trace) -> list[Finding]:
    """The reference must be a frozen copy: not the policy object, and different from a policy that has moved."""
    beta = float(trace.loss.beta)
    s = trace.setup
    live = _shares_weights(getattr(s, "policy", None), getattr(s, "reference", None))
    gap = E.ref_gap(trace)
    exact = gap is not None and beta > 0 and _after_updates(trace) and float(gap.abs().max()) <= SAME_LOGP
    if not (live or exact):
        return []
    evs = [E.ev("beta", beta, "β of the KL term", "config")]
    if live:
        evs.append(E.ev("reference_shares_policy_weights", 1.0, "1: the reference model is the policy object (or "
                        "shares its weight storage)", "model"))
    if gap is not None:
        evs += [E.ev("max_abs_logp_gap", float(gap.abs().max()), "max |ℓ − ℓ^ref| on the masked sampled tokens"),
                E.ev("kl", trace.loss.kl, "TRL `kl`: token mean of the KL estimator (raw)",
                     where="report: Loss decomposition")]
    alt = () if live else ("optimizer_no_op: a policy that never moved also equals its reference",)
    return [Finding(
        code="reference_tracks_policy", severity="error",
        cause="The reference is not a frozen copy of the start weights: it is (or moves with) the policy, so the KL "
              "to it stays 0 and β·KL never pulls the policy back.",
        evidence=tuple(evs), fix=Fix("Create the reference as a separate, frozen copy of the start weights.",
                                     code_change="reference = copy.deepcopy(policy).eval().requires_grad_(False) "
                                                 "before the first update (never the policy object itself)"),
        alternatives=alt, score=10.6 if live else 10.1, step=_step(trace))]


def check_loss_path(trace) -> list[Finding]:
    """The loss the optimizer differentiated (grad path) must equal the displayed loss record. A recorded step's
    loss is held to the declared objective by its replay (per micro-batch, as the loop normalised it), not here."""
    if getattr(trace, "recorded", None) is not None:
        return []
    u = trace.update
    its = getattr(trace, "iterations", ()) or ()
    first = its[0].updates[0] if its and its[0].updates else u
    if first is None or not math.isfinite(first.loss_record_diff):
        return []
    diff = float(first.loss_record_diff)
    if diff <= LOSS_PATH_TOLERANCE or _forwards_differ(trace):
        return []                     # agree, or the two forwards differ (forward_mismatch / dropout_active says why)
    return [Finding(
        code="loss_path_mismatch", severity="error",
        cause=f"The loss the optimizer differentiated is not the displayed loss (they differ by {diff:.3g}): the "
              "gradient follows another objective than the one every view shows.",
        evidence=(E.ev("loss_record_diff", diff, "|loss of the update's grad path − the loss record's| on the first "
                       "optimizer step", where="report: Update"),
                  E.ev("loss_update", first.loss, "the loss value the backward pass started from"),
                  E.ev("loss_record", trace.loss.loss, "the displayed loss (rollout tensors)",
                       where="report: Loss decomposition"),
                  E.ev("tolerance", LOSS_PATH_TOLERANCE, "float32 recompute noise is ~1e-7", "config")),
        fix=Fix("Make the update differentiate the same loss the record computes (same terms, weights, mask, "
                "normaliser and per-micro-batch scaling).",
                code_change="one loss function for the record and the backward pass; micro-batch weights summing to 1"),
        alternatives=("micro-batch / gradient-accumulation weights that do not sum to one step",
                      "a loss term added or rescaled in the update only"), score=10.3, step=_step(trace))]


def _forwards_differ(trace) -> bool:
    """Two forwards of the same weights already disagree (a fresh grad forward then recomputes another loss)."""
    from rookworld_debug.diagnosis.checks_logprob import check_dropout
    rep = E.repeat_forward_gap(trace)
    return (rep is not None and float(rep.abs().max()) > SAME_LOGP * 100) or bool(check_dropout(trace))


def _pg_share(trace) -> float:
    u = trace.update
    norms = dict(getattr(u, "per_term_global", None) or {}) if u is not None else {}
    total = sum(v for v in norms.values() if math.isfinite(v))
    return norms.get("pg", math.nan) / total if total > 0 else math.nan


def check_moved_with_advantages(trace) -> list[Finding]:
    """After the update, rows with a larger advantage must have gained log-prob: corr(A, Δℓ) ≥ 0 up to noise."""
    e, u = trace.evaluation, trace.update
    if e is None or u is None or not (float(u.lr) > 0):
        return []
    r = float(e.corr_adv_delta_logp)
    a = trace.advantages.advantages
    n = int((a != 0).sum())
    if not math.isfinite(r) or n < 5:
        return []
    z = math.atanh(max(min(r, 1 - 1e-12), -1 + 1e-12)) * math.sqrt(n - 3)
    if z >= -Z_AGAINST:
        return []
    return _against(trace, r, n, z)


def _against(trace, r, n, z) -> list[Finding]:
    e = trace.evaluation
    share = _pg_share(trace)
    evs = (E.ev("corr_adv_delta_logp", r, "Pearson(A_i, mean Δℓ_i per token) over the N rows after the update",
                where="report: Post-update evaluation"),
           E.ev("fisher_z", z, "atanh(r)·√(n − 3): below −3 is not noise"),
           E.ev("rows_with_advantage", n, "rows with A ≠ 0"),
           E.ev("frac_moved_with_advantage", e.frac_moved_with_advantage, "rows with A ≠ 0 whose Σ Δℓ has A's sign"),
           E.ev("pg_grad_share", share, "‖∇PG‖ / Σ of the terms' gradient norms (NaN: not recorded)"))
    return [Finding(
        code="update_against_advantages", severity="error",
        cause="The update moved the policy against its advantages: rows with a higher advantage lost log-prob "
              f"(corr(A, Δℓ) = {r:.2f} over {n} rows), so the step un-learns what the rewards asked for.",
        evidence=evs, fix=Fix("Check the sign of the loss and of the advantages the update uses (minimise −A·ratio).",
                              code_change="loss = −A·ratio (PG term), advantages = (r − mean) / σ, optimizer "
                                          "minimising that loss"),
        alternatives=("kl_dominates / entropy_runaway: another term of the loss outweighs the policy gradient",
                      "objective_inverted (a negative learning rate or β)", "lr_too_large (an overshoot)"),
        score=10.4, step=_step(trace))]


def _signs(trace) -> list[tuple]:
    """(setting, value, why it inverts) of every objective setting with the wrong sign."""
    c, cap = trace.config, trace.capture
    out = []
    lr = float(trace.update.lr) if trace.update is not None else float(getattr(c, "lr", 0.0))
    beta = float(trace.loss.beta)
    if lr < 0:
        out.append(("learning_rate", lr, "a negative learning rate climbs the loss instead of descending it"))
    if beta < 0:
        out.append(("beta", beta, "a negative β rewards moving away from the reference"))
    cfg = (cap.grpo_config or {}) if cap is not None else {}
    eps = cfg.get("epsilon", getattr(c, "epsilon_low", 0.0))
    if isinstance(eps, (int, float)) and eps < 0:
        out.append(("epsilon", float(eps), "a negative clip range clips every ratio"))
    w = [float(x) for x in (trace.rewards.weights or ()) if isinstance(x, (int, float))]
    if w and all(x <= 0 for x in w) and any(x < 0 for x in w):
        out.append(("reward_weights", min(w), "every reward weight ≤ 0: the policy is trained to lower the reward"))
    return out


def check_objective_signs(trace) -> list[Finding]:
    bad = _signs(trace)
    coef = float(getattr(trace.config, "entropy_coef", 0.0) or 0.0)
    out = []
    if bad:
        name, value, why = bad[0]
        out.append(Finding(
            code="objective_inverted", severity="error",
            cause=f"A setting turns the objective upside down: {name} = {value:g} ({why}).",
            evidence=tuple(E.ev(n, v, w, "config") for n, v, w in bad),
            fix=Fix("Use the setting's intended sign.",
                    step_config={k: abs(v) for k, v, _ in bad if k == "beta"},
                    grpo_config={k: abs(v) for k, v, _ in bad if k in ("beta", "learning_rate", "epsilon")}),
            alternatives=("a penalty function with a deliberately negative weight (then another weight is "
                          "positive)",), score=10.9, step=_step(trace)))
    if coef < 0:
        out.append(Finding(
            code="entropy_coef_negative", severity="warning",
            cause=f"entropy_coef = {coef:g} is negative: the loss rewards lower entropy, pushing the policy to "
                  "collapse onto single answers (only intended for deliberate entropy minimisation).",
            evidence=(E.ev("entropy_coef", coef, "c_H: the loss subtracts c_H·H̄", "config"),),
            fix=Fix("Use entropy_coef ≥ 0.", step_config={"entropy_coef": 0.0}), score=7.5, step=_step(trace)))
    return out


def check_cispo_cap(trace) -> list[Finding]:
    """CISPO's importance weight is detach(min(r, ε_high)): a cap below 1 caps every token's weight on a first pass
    (r = 1), so the whole policy term is scaled down to ε_high and the weights never reach 1. TRL reads the cap from
    epsilon_high, falling back to epsilon (0.2: the PPO clip's range) when it is unset."""
    from rookworld_debug.diagnosis.replay.loss_phase import loss_rule
    from rookworld_debug.grpo.objective.terms import cispo
    c = trace.config
    rule = loss_rule(getattr(c, "loss_type", ""))
    if rule is None or rule.objective is not cispo or not float(c.epsilon_high) < 1.0:
        return []
    cfg = (trace.capture.grpo_config or {}) if trace.capture is not None else {}
    unset = trace.capture is not None and cfg.get("epsilon_high") is None
    return [Finding(
        code="cispo_cap_below_one", severity="error",
        cause=f"loss_type = 'cispo' caps the importance weight at ε_high = {float(c.epsilon_high):g}, below 1: every "
              f"token's weight min(r, {float(c.epsilon_high):g}) is capped (on a first pass r = 1), so the policy "
              f"term is {float(c.epsilon_high):g} × its size and no weight ever reaches 1"
              + (" (epsilon_high is unset, and TRL falls back to epsilon, the PPO clip's range)." if unset else "."),
        evidence=(E.ev("epsilon_high", float(c.epsilon_high), "CISPO's cap on the importance weight (TRL: "
                       "epsilon_high, else epsilon)", "config"),),
        fix=Fix("Set CISPO's cap above 1 (the CISPO / ScaleRL papers use epsilon_high = 5).",
                step_config={"epsilon_high": 5.0}, grpo_config={"epsilon_high": 5.0}),
        score=9.6, step=_step(trace))]


def check_sampler_record(trace) -> list[Finding]:
    """Say when no sampler check could run: the trace holds no sampling-time log-probs (TRL without vLLM)."""
    s = trace.rollout.sampling_per_token_logps
    if s is not None and s.numel() and not bool(torch.isnan(s[E.mask(trace)]).all()):
        return []
    return [Finding(
        code="sampler_not_recorded", severity="info",
        cause="No sampling-time log-probs are recorded for this step, so the sampler-vs-trainer checks (temperature, "
              "position ids, sampler precision) could not run.",
        evidence=(E.ev("sampling_logps_recorded", 0.0, "1 when the rollout holds the sampler's own log-probs"),),
        fix=Fix("Record the sampler's log-probs (TRL: use_vllm=True returns them; run_step records them always)."),
        score=0.2, step=_step(trace))]
