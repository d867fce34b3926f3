"""Checks: advantages that amplify noise, and what the update did (its size, its terms, its signal).

* tiny-σ groups / std-floor blow-ups: a group's advantages are its reward gaps ÷ (σ_g + ε); when σ_g is far below
  the batch's spread, or below anything the reward means, noise becomes a full-size advantage;
* KL dominating the update — by GRADIENT share (‖∇β·KL‖ vs ‖∇PG‖), never by the loss value's share, which on-policy
  is fixed by group-centred advantages;
* an update too large: the policy moved beyond the clip range (|Δℓ| per token > log(1 + ε)) in one step;
* gradient clipping binding: only a fraction of the gradient was applied;
* an update that is mostly noise (SNR across groups), with the B that would be needed (B_simple);
* the entropy term dominating the gradient (runaway), length bias of a per-sequence normaliser.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from rookworld_debug.diagnosis import evidence as E
from rookworld_debug.diagnosis.context import current_step
from rookworld_debug.diagnosis.findings import Finding, Fix
from rookworld_debug.metrics import term_balance, tiny_std_groups

# a group reward range 1000× below the batch's reward spread is below any difference the reward means to make
RESOLUTION = 1e-3
# a group σ an order of magnitude below the batch's turns its reward gaps into advantages ≥ 10× what batch scaling
# gives them: noise-sized gaps become full-size pushes (below that, small groups are ordinary)
AMPLIFIED = 10.0


def _step(trace):
    return E.step_of(trace, current_step())


def check_advantage_noise(trace) -> list[Finding]:
    adv = trace.advantages
    g = adv.num_generations
    rewards = adv.rewards.reshape(-1, g)                                                    # (B, G)
    a = adv.advantages.reshape(-1, g)
    rng = (torch.nan_to_num(rewards, nan=0.0).amax(1) - torch.nan_to_num(rewards, nan=0.0).amin(1))   # (B,)
    amax = a.abs().amax(1)
    bstd = float(adv.batch_std) if math.isfinite(adv.batch_std) else 0.0
    scale = max(bstd, float(torch.nan_to_num(rewards, nan=0.0).abs().max()) * 1e-3, 1e-12)
    blown = [b for b in range(rng.numel()) if 0 < float(rng[b]) < RESOLUTION * scale and float(amax[b]) >= 0.5]
    if blown:
        b = blown[0]
        return [Finding(
            code="std_floor_blowup", severity="error",
            cause="Advantages blow up from the std floor: groups whose rewards differ by less than the reward can mean "
                  "get full-size advantages, because the denominator σ_g + ε divides noise by noise.",
            evidence=(E.ev("blown_groups", len(blown), f"groups with reward range < {RESOLUTION:g} × the batch reward "
                           "spread and max |A| ≥ 0.5", where="report: Advantages"),
                      E.ev("group_reward_range", float(rng[b]), f"max − min reward of group {b}"),
                      E.ev("group_max_abs_advantage", float(amax[b]), f"max |A| in group {b}"),
                      E.ev("adv_eps", adv.eps, "ε added to σ_g in the denominator (TRL 1e-4)", "config")),
            fix=Fix("Raise the floor so sub-resolution gaps give ~0 advantage (or scale by the batch σ).",
                    step_config={"adv_eps": 1e-4, "scale_rewards": "batch"}, grpo_config={"scale_rewards": "batch"}),
            alternatives=("tiny_sigma_groups",), score=8.5, step=_step(trace))]
    tiny = tiny_std_groups(adv.group_std, adv.batch_std, trace.config.tiny_std_fraction)
    if not tiny:
        return []
    b = min(tiny, key=lambda k: float(adv.group_std[k]))
    amp = bstd / max(float(adv.group_std[b]), 1e-12)
    return [Finding(
        code="tiny_sigma_groups", severity="warning" if amp >= AMPLIFIED else "info",
        cause=f"{len(tiny)} group(s) have a reward σ far below the batch's: dividing by their tiny σ turns small "
              "reward gaps (often reward noise) into full-size advantages.",
        evidence=(E.ev("tiny_std_groups", len(tiny), f"groups with 0 < σ_g < {trace.config.tiny_std_fraction:g} × "
                       "batch σ", where="report: Advantages"),
                  E.ev("group_std", float(adv.group_std[b]), f"σ_g of group {b}"),
                  E.ev("reward_std", bstd, "TRL `reward_std`: std of the N rewards"),
                  E.ev("group_max_abs_advantage", float(amax[b]), f"max |A| in group {b}"),
                  E.ev("amplification", amp, f"batch σ / σ_g of group {b}: how much more its reward gaps count "
                       f"than under batch scaling (a warning from {AMPLIFIED:g}×)")),
        fix=Fix("Scale advantages by the batch σ (Lite PPO) so a tiny group σ cannot amplify noise.",
                step_config={"scale_rewards": "batch"}, grpo_config={"scale_rewards": "batch"}),
        alternatives=("std_floor_blowup",), score=5.0 + len(tiny) / max(rng.numel(), 1), step=_step(trace))]


def check_kl_dominates(trace) -> list[Finding]:
    lo = trace.loss
    if float(lo.beta) == 0.0 or trace.update is None:
        return []
    bal = term_balance(lo, trace.update)
    share = bal.kl_grad_share
    if not math.isfinite(share) or share <= 0.5:
        return []                                        # by gradient share only (never the loss-value share)
    norms = bal.grad_norms
    new_beta = float(lo.beta) * norms.get("pg", 0.0) / max(norms.get("kl", 0.0), 1e-12) / 2
    return [Finding(
        code="kl_dominates", severity="error" if share > 0.8 else "warning",
        cause=f"The KL penalty dominates the update's gradient ({share:.0%} of the summed term norms): the step "
              "mostly pulls the policy back to the reference instead of following the advantages.",
        evidence=(E.ev("kl_grad_share", share, "‖∇β·KL‖ / (‖∇PG‖ + ‖∇β·KL‖ + ‖∇entropy‖), global L2 norms of each "
                       "term's gradient", where="report: Loss decomposition"),
                  E.ev("grad_norm_pg", norms.get("pg", math.nan), "‖∇PG‖"),
                  E.ev("grad_norm_kl", norms.get("kl", math.nan), "‖∇β·KL‖"),
                  E.ev("grad_cos_pg_kl", bal.grad_cos_pg_kl, "cos(∇PG, ∇β·KL): < 0 = the KL term undoes the PG step"),
                  E.ev("kl", lo.kl, "TRL `kl`: raw token-mean KL estimate"), E.ev("beta", lo.beta, "β", "config")),
        fix=Fix(f"Lower β so the KL gradient is at most about half the PG gradient (β ≈ {new_beta:.3g}).",
                step_config={"beta": round_sig(new_beta)}, grpo_config={"beta": round_sig(new_beta)}),
        alternatives=("reference_not_start / dropout_active: a KL that is large for the wrong reason also dominates",),
        score=7.0 + share, step=_step(trace))]


def round_sig(x: float, digits: int = 2) -> float:
    return float(f"{x:.{digits}g}") if x and math.isfinite(x) else 0.0


def check_update_size(trace) -> list[Finding]:
    """The policy moved beyond the clip range on its own sampled tokens in one step (needs the evaluation)."""
    e, u = trace.evaluation, trace.update
    if e is None or u is None or e.delta_logp is None:
        return []
    m = E.mask(trace)
    d = e.delta_logp.float()[m]
    if d.numel() == 0 or not bool(torch.isfinite(d).all()):
        return _nonfinite(trace) if d.numel() else []
    moved = float(d.abs().mean())
    eps = float(trace.config.epsilon_high)
    bound = math.log1p(eps)
    if moved <= bound:
        return []
    lr = float(u.lr)
    new_lr = round_sig(lr * bound / moved / 2)
    changed = sum(bool(x) for x in e.resample_changed) / max(len(e.resample_changed), 1)
    return [Finding(
        code="lr_too_large", severity="error",
        cause=f"The update is too large for its learning rate: one step moved the policy's log-probs on its own "
              f"samples by {moved:.2f} nats/token on average, beyond the clip range log(1 + ε) = {bound:.2f}; the "
              "next step's ratio would be clipped and its KL jumps.",
        evidence=(E.ev("mean_abs_delta_logp", moved, "Σ m |ℓ_after − ℓ_before| / Σ m on the rollout's sampled tokens "
                       "(one step)", where="report: Post-update evaluation"),
                  E.ev("trust_region", bound, "log(1 + ε_high): the ratio change PPO's clip tolerates", "config"),
                  E.ev("learning_rate", lr, "the optimizer step's learning rate", "config"),
                  E.ev("param_delta_norm", u.param_delta_norm, "‖θ_after − θ_before‖₂"),
                  E.ev("resample_changed_share", changed, "share of same-seed resampled completions that changed"),
                  E.ev("delta_reward", e.delta_reward_batch, "greedy reward after − before on the same prompts",
                       "greedy before/after")),
        fix=Fix(f"Lower the learning rate (first order, Δℓ ∝ lr: ≈ {new_lr:g}).", step_config={"lr": new_lr},
                grpo_config={"learning_rate": new_lr}),
        alternatives=("grad clipping disabled with a gradient spike reads the same",), score=9.7, step=_step(trace))]


def _nonfinite(trace) -> list[Finding]:
    return [Finding(
        code="non_finite", severity="error",
        cause="The update produced non-finite log-probs: the weights overflowed (learning rate far too large, or "
              "a non-finite gradient).",
        evidence=(E.ev("learning_rate", trace.update.lr, "the optimizer step's learning rate", "config"),
                  E.ev("grad_norm_pre_clip", trace.update.grad_norm_pre_clip, "global gradient L2 norm before clip")),
        fix=Fix("Lower the learning rate; keep gradient clipping on.", step_config={"lr": trace.update.lr / 100,
                                                                                   "max_grad_norm": 1.0}),
        alternatives=("lr_too_large",), score=9.5, step=_step(trace))]


def _adam_neutral(trace, u) -> tuple:
    """(clipping leaves an Adam step as it was, per-weight RMS of the clipped gradient, Adam's ε). Adam divides
    the gradient's moments by each other, so scaling every gradient by the same clip factor changes its step only
    where the clipped gradient nears ε; far above it (100×) clipping only re-weights steps against each other."""
    cfg = trace.capture.grpo_config if trace.capture is not None else None
    if cfg is not None:
        adam = "adam" in str(cfg.get("optim", "adamw_torch")).lower()
        eps = float(cfg.get("adam_epsilon", 1e-8) or 1e-8)
    else:
        adam, eps = True, float(getattr(trace.config, "adam_eps", 1e-8))
    prov = trace.setup.provenance if trace.setup is not None and isinstance(trace.setup.provenance, dict) else {}
    n = prov.get("num_parameters")
    if not adam or not isinstance(n, int) or n <= 0 or not math.isfinite(u.grad_norm_post_clip):
        return False, math.nan, eps
    rms = float(u.grad_norm_post_clip) / math.sqrt(n)
    return rms > ADAM_NEUTRAL * eps, rms, eps


# clipped per-weight gradients this far above Adam's ε keep Adam's step unchanged (see _adam_neutral)
ADAM_NEUTRAL = 100.0


def check_grad_clip(trace) -> list[Finding]:
    u = trace.update
    if u is None or not math.isfinite(u.clip_coef) or u.clip_coef >= 0.5:
        return []
    mx = trace.config.max_grad_norm
    neutral, rms, eps = _adam_neutral(trace, u)
    sev = "info" if neutral else "error" if u.clip_coef < 0.01 else "warning"
    effect = ("AdamW's step is invariant to the gradient's scale, so clipping only re-weights this step against "
              "the moments of earlier ones" if neutral else
              "every update is a fixed-length step of size lr × max_grad_norm whatever the advantages say")
    return [Finding(
        code="grad_clip_binding", severity=sev,
        cause=f"Gradient clipping binds: only {u.clip_coef:.2%} of the gradient was applied; {effect}.",
        evidence=(E.ev("grad_norm_pre_clip", u.grad_norm_pre_clip, "global gradient L2 norm before clipping",
                       where="report: Update"),
                  E.ev("max_grad_norm", mx if mx is not None else math.nan, "the clip threshold", "config"),
                  E.ev("clip_coef", u.clip_coef, "min(1, max_grad_norm / pre-clip norm)"),
                  E.ev("clipped_grad_rms_per_weight", rms, "‖g_clipped‖ / √(number of weights) (NaN: unknown)"),
                  E.ev("adam_eps", eps, f"Adam's ε: clipping changes Adam's step once the RMS nears it (info above "
                       f"{ADAM_NEUTRAL:g}×)", "config")),
        fix=Fix("Raise max_grad_norm above the typical gradient norm (or lower the loss scale).",
                step_config={"max_grad_norm": round_sig(max(2 * u.grad_norm_pre_clip, 1.0))},
                grpo_config={"max_grad_norm": round_sig(max(2 * u.grad_norm_pre_clip, 1.0))}),
        alternatives=("a gradient spike (one step only) also makes clipping bind",),
        score=(1.0 if neutral else 6.0) + (1 - u.clip_coef), step=_step(trace))]


def check_noise(trace) -> list[Finding]:
    d = trace.diagnostics
    if d is None or d.noise is None:
        return []
    nz = d.noise
    lo, hi = nz.snr_ci if nz.snr_ci else (math.nan, math.nan)
    if not (nz.pure_noise or nz.snr < 1.0):
        return []
    need = nz.b_simple
    b = nz.num_groups
    evs = (E.ev("snr", nz.snr, "gradient signal-to-noise across the B groups: |G|²_est / (tr Σ̂ / B)",
                where="report: Signal or noise"),
           E.ev("snr_ci_high", hi, "upper end of its bootstrap interval over groups"),
           E.ev("b_simple", need, "noise scale tr Σ̂ / |G|²_est: groups per step at which SNR reaches 1"),
           E.ev("batch_size", b, "B, groups in this step", "config"))
    target = b * 2 if not math.isfinite(need) else int(math.ceil(max(need, b + 1)))
    return [Finding(
        code="update_mostly_noise", severity="warning",
        cause=f"The update is mostly noise: across the {b} groups the gradient's noise outweighs its mean "
              f"(SNR {nz.snr:.2g}), so steps move in near-random directions and cancel over a run.",
        evidence=evs, fix=Fix(f"Average over more groups per step (B ≈ {target}) or more completions per group.",
                              step_config={"batch_size": target}, grpo_config={"per_device_train_batch_size":
                                                                              target * trace.config.num_generations}),
        alternatives=("reward_not_deterministic: a noisy reward is one source of this noise",
                      "B < 8: the estimate itself is loose" if not nz.trustworthy else ""),
        score=5.0 + (1.0 if nz.pure_noise else 0.0), step=_step(trace))]


def check_entropy(trace) -> list[Finding]:
    """The entropy term drives the step: it dominates the gradient, or the bonus is on and one step raised the
    token entropy by more than half of what it was."""
    u = trace.update
    coef = float(getattr(trace.config, "entropy_coef", 0.0) or 0.0)
    norms = dict(getattr(u, "per_term_global", None) or {}) if u is not None else {}
    total = sum(norms.values())
    share = norms.get("entropy", 0.0) / total if total > 0 else 0.0
    e = trace.evaluation
    dh, h0 = math.nan, math.nan
    if e is not None and e.per_token_entropy_after is not None:
        m = E.mask(trace)
        h0 = float(trace.rollout.per_token_entropy.float()[m].mean())
        dh = float((e.per_token_entropy_after.float() - trace.rollout.per_token_entropy.float())[m].mean())
    rose = coef > 0 and math.isfinite(dh) and dh > max(0.5 * h0, 1e-4)
    if share <= 0.5 and not rose:
        return []
    return [Finding(
        code="entropy_runaway", severity="error" if share > 0.8 or rose else "warning",
        cause=f"The entropy bonus drives the update (gradient share {share:.0%}; token entropy {h0:.3g} → "
              f"{h0 + dh:.3g} nats in one step): the step mostly raises entropy whatever the rewards say; repeated, "
              "the policy's output turns to noise.",
        evidence=(E.ev("entropy_grad_share", share, "‖∇entropy term‖ / Σ of the terms' gradient norms",
                       where="report: Loss decomposition"),
                  E.ev("entropy_coef", coef, "c_H", "config"),
                  E.ev("entropy_before", h0, "token-mean entropy of the tempered policy on the sampled tokens"),
                  E.ev("measured_delta_entropy", dh, "token-mean entropy after − before on the same tokens")),
        fix=Fix("Lower or remove the entropy bonus.", step_config={"entropy_coef": 0.0}),
        alternatives=("lr_too_large: a learning rate too large also moves entropy in one step",), score=8.0 + share,
        step=_step(trace))]


def _typical_move(trace) -> Optional[float]:
    """The median |ℓ_ref − ℓ| over the tokens this step trained (the typical token's distance from the start), from
    the capture's own log-probs; None where they are not kept. The KL is a mean, which a few tokens that moved far
    carry on their own (k3 grows as e^d): the median says whether the policy as a whole left the trust region."""
    r = trace.rollout
    m = (trace.loss.completion_mask if trace.loss is not None else r.completion_mask).bool()   # the step's rows
    if r.ref_per_token_logps is None or r.per_token_logps is None or not bool(m.any()):
        return None
    d = (r.ref_per_token_logps - r.per_token_logps)[m].double()
    return float(d.abs().median()) if bool(torch.isfinite(d).all()) else None


def check_capture_drift(trace) -> list[Finding]:
    """A TRL capture at global step t ≥ 2 (μ = 1): KL(π_t‖π_ref) is what the t − 1 earlier updates moved the policy
    (the reference is the policy's start). k3 ≈ ½·E[Δℓ²] for small log-ratios, so √(2·KL) is the RMS distance of
    the log-probs from the start; by the triangle inequality one of the t − 1 updates moved them at least
    √(2·KL) / (t − 1). Beyond log(1 + ε) that update left the trust region. (A KL that grows as t² is a policy
    moving steadily in one direction, not a too-large step: KL / (t − 1) would call every long healthy run.)"""
    cap = trace.capture
    if cap is None or int(cap.global_step) < 2 or trace.rollout.ref_per_token_logps is None:
        return []
    from rookworld_debug.diagnosis.checks_logprob import dropout_on_in_trl
    if dropout_on_in_trl(cap):
        return []                                   # a dropout policy's KL is noise, not distance (dropout_active)
    kl = float(trace.loss.kl)
    eps = float(trace.config.epsilon_high)
    bound = math.log1p(eps)
    updates = int(cap.global_step) - 1
    per = math.sqrt(2 * kl) / updates if math.isfinite(kl) and kl > 0 else 0.0
    typical = _typical_move(trace)
    if per <= bound or (typical is not None and typical / updates <= bound):
        return []           # within the clip range, or only a few tokens moved far (the clip bounds those)
    lr = float(cap.learning_rate)
    new_lr = round_sig(lr * bound / per / 2)
    return [Finding(
        code="lr_too_large", severity="error",
        cause=f"Update too large: learning rate. After {updates} update(s) the policy is {kl:.3g} nats/token (KL) "
              f"from its start, an RMS log-prob distance √(2·KL) = {math.sqrt(2 * kl):.3g}: at least one update "
              f"moved it {per:.3g} or more, beyond the clip range log(1 + ε) = {bound:.3g}.",
        evidence=(E.ev("kl", kl, "TRL `kl` at this step: token-mean k3 KL to the reference (= the policy's start)",
                       where="report: Loss decomposition; triage: kl curve"),
                  E.ev("rms_distance_per_update", per, f"√(2·kl) / {updates} updates (global step − 1): the least "
                       "RMS log-prob move of the largest update"),
                  E.ev("trust_region", bound, "log(1 + ε_high): the log-ratio at the clip bound", "config"),
                  E.ev("learning_rate", lr, "the step's learning rate", "config")),
        fix=Fix(f"Lower the learning rate (≈ {new_lr:g}).", step_config={"lr": new_lr},
                grpo_config={"learning_rate": new_lr}),
        alternatives=("reference_not_start (if the reference was never the policy's start)", "dropout_active"),
        score=9.7, step=_step(trace))]


def check_length_bias(trace) -> list[Finding]:
    from rookworld_debug.grpo.families import rule_of
    from rookworld_debug.grpo.objective.aggregation import sequence_mean
    lo = trace.loss
    if rule_of(lo.loss_type).aggregation is not sequence_mean:     # each row's tokens averaged over its length
        return []
    m = E.mask(trace)
    lengths = m.sum(1).double()
    a = lo.advantages.double()
    keep = a != 0
    if int(keep.sum()) < 4 or float(lengths.std()) == 0.0:
        return []
    cv = float(lengths.std() / lengths.mean())
    if cv < 0.2:
        return []
    x, y = lengths[keep], a[keep]
    corr = float(torch.corrcoef(torch.stack([x, y]))[0, 1]) if float(x.std()) > 0 and float(y.std()) > 0 else math.nan
    return [Finding(
        code="length_bias", severity="info",
        cause=f"loss_type '{lo.loss_type}' averages each completion over its own length: a token of a short "
              "completion weighs more than one of a long one, so wrong long answers are penalised less per token.",
        evidence=(E.ev("length_cv", cv, "coefficient of variation of the completion lengths (masked tokens)"),
                  E.ev("corr_length_advantage", corr, "Pearson correlation of length and advantage over rows with A ≠ 0")),
        fix=Fix("Use a token-level normaliser (dapo, TRL's default) or Dr. GRPO's constant one.",
                step_config={"loss_type": "dapo"}, grpo_config={"loss_type": "dapo"}),
        score=1.0 + cv, step=_step(trace))]
