"""Per-token terms of the GRPO loss, one small function each, and the loss table that composes them.

Shape legend: N rows of one micro-batch, T completion tokens. m = completion_mask (N, T) float; A =
advantages (N, 1); ℓ = per_token_logps (N, T, carries the gradient); ℓ_old, ℓ_ref, ℓ_sampling (N, T).
Sequence-level importance sampling makes r and everything derived from it (N, 1), broadcast over t.

Each function is TRL 1.16's `GRPOTrainer._compute_loss` (or `_generate_and_score_completions`, for the
sampling-time importance-sampling correction) restricted to one term, with the same float operations in the
same order: the TRL oracle tests compare the composition to 1e-9.

Which loss type uses which objective and aggregation is each objective family's table (grpo/families/:
TRL's eight loss types in `trl`, rookworld-trl's REINFORCE in `manual`, the mini's sequence surrogate in
`rlvr_mini`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch



@dataclass(frozen=True)
class ObjectiveInputs:
    """What a per-token objective reads."""
    logps: torch.Tensor                 # (N, T) ℓ, carries the gradient
    adv: torch.Tensor                   # (N, 1) A
    log_ratio: torch.Tensor             # (N, T) ℓ − ℓ_old
    coef_1: torch.Tensor                # (N, T) | (N, 1) r = exp(log w)
    mask: torch.Tensor                  # (N, T) m
    epsilon_low: float
    epsilon_high: float
    delta: Optional[float]
    params: dict                        # the loss type's own knobs (sapo temperatures / vespo (k, λ))
    importance_sampling_ratio: Optional[torch.Tensor] = None  # (N, T) | (N, 1) sampling-time IS weight ρ


@dataclass(frozen=True)
class PolicyTerm:
    """A per-token objective's output: PG_it and which tokens it clipped."""
    per_token_pg: torch.Tensor          # (N, T) | (N, 1) PG_it before the masks
    is_low: torch.Tensor                # (N, T) | (N, 1) bool: clipped from below (PPO types)
    is_high: torch.Tensor               # (N, T) | (N, 1) bool: clipped from above (PPO types, cispo)
    phi_seq: Optional[torch.Tensor] = None  # (N, 1) vespo's φ(w_i)


def _no_clip(x: ObjectiveInputs) -> torch.Tensor:
    return torch.zeros((x.logps.shape[0], 1), dtype=torch.bool, device=x.logps.device)   # (N, 1)


def clipped_surrogate(x: ObjectiveInputs) -> PolicyTerm:
    """PPO's clipped surrogate (grpo, bnpo, dr_grpo, dapo, luspo):
        c = clamp(r, 1 − ε_low, 1 + ε_high)   (from the UNclamped r)
        r' = min(r, δ) if δ else r           (two-sided clipping)
        PG_it = −min(r'·A_i, c·A_i)
    clipped low: r < 1 − ε_low and A < 0; high: r > 1 + ε_high and A > 0."""
    r, adv = x.coef_1, x.adv
    coef_2 = torch.clamp(r, 1 - x.epsilon_low, 1 + x.epsilon_high)             # (N, T) | (N, 1)
    c1 = torch.clamp(r, max=x.delta) if x.delta is not None else r             # (N, T) | (N, 1)
    pg = -torch.min(c1 * adv, coef_2 * adv)                                     # (N, T) | (N, 1)
    return PolicyTerm(pg, (r < 1 - x.epsilon_low) & (adv < 0), (r > 1 + x.epsilon_high) & (adv > 0))


def cispo(x: ObjectiveInputs) -> PolicyTerm:
    """CISPO: clip the IS weight, not r·A (ε_high is ε_max, an absolute cap; TRL suggests 5):
        PG_it = −sg(min(r, ε_high))·A_i·ℓ_it        clipped high (TRL's cispo_clip_ratio): r > ε_high, A > 0"""
    pg = -torch.clamp(x.coef_1, max=x.epsilon_high).detach() * x.adv * x.logps  # (N, T)
    return PolicyTerm(pg, _no_clip(x), (x.coef_1 > x.epsilon_high) & (x.adv > 0))


def sapo_gate(x: ObjectiveInputs) -> PolicyTerm:
    """SAPO: a soft sigmoid gate instead of a hard clip:
        PG_it = −σ(τ_A·(r − 1))·4/τ_A · A_i,   τ_A = τ_pos if A > 0 else τ_neg"""
    tau = torch.where(x.adv > 0, x.params["sapo_temperature_pos"], x.params["sapo_temperature_neg"])  # (N, 1)
    pg = -(torch.sigmoid(tau * (x.coef_1 - 1)) * 4 / tau) * x.adv               # (N, T) | (N, 1)
    return PolicyTerm(pg, _no_clip(x), _no_clip(x))


def vespo(x: ObjectiveInputs) -> PolicyTerm:
    """VESPO: the gamma weight of the SEQUENCE ratio scales a REINFORCE term:
        PG_it = −sg(φ_i)·A_i·ℓ_it   (φ: see vespo_phi; ρ, the sampling-time IS weight, enters w_i)"""
    phi = vespo_phi(x.adv, x.log_ratio, x.mask, importance_sampling_ratio=x.importance_sampling_ratio,
                    **x.params)                                                  # (N, 1) no grad
    return PolicyTerm(-phi * x.adv * x.logps, _no_clip(x), _no_clip(x), phi_seq=phi)


def reinforce(x: ObjectiveInputs) -> PolicyTerm:
    """manual (rookworld-trl's sequence-level REINFORCE, no ratio and no clip):
        PG_it = −A_i·ℓ_it"""
    return PolicyTerm(-x.adv * x.logps, _no_clip(x), _no_clip(x))              # (N, T)


@torch.no_grad()
def vespo_phi(adv: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, *, vespo_k_pos: float,
              vespo_lambda_pos: float, vespo_k_neg: float, vespo_lambda_neg: float,
              importance_sampling_ratio: Optional[torch.Tensor] = None) -> torch.Tensor:
    """VESPO's gamma weight φ(w) = exp(λ + k·log w − λ·w) (φ(1) = 1) on the SEQUENCE ratio w = Π_t r_it
    (a sum of token log-ratios, not a mean), in log space and detached: adv (N, 1), log_ratio (N, T) → (N, 1).
        log w_i = clamp(Σ_t m·clamp(ℓ − ℓ_old, ±20) + Σ_t clamp(log ρ_it, log 1e-8, 20), log 1e-8, 20)
        (k, λ) = (k_pos, λ_pos) if A ≥ 0 else (k_neg, λ_neg)    (ρ: the sampling-time IS weight, if any)"""
    lower = math.log(1e-8)
    seq_log_ratio = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)   # (N, 1)
    if importance_sampling_ratio is not None:                                 # TRL: token TIS/MIS, log space
        seq_log_ratio += torch.clamp(torch.log(importance_sampling_ratio), lower, 20.0).sum(-1, keepdim=True)
    log_w = torch.clamp(seq_log_ratio, lower, 20.0)                                       # (N, 1)
    nonneg = adv >= 0
    k = torch.where(nonneg, vespo_k_pos, vespo_k_neg)
    lam = torch.where(nonneg, vespo_lambda_pos, vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def importance_weights(logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor,
                       level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """log w = ℓ − ℓ_old (level "token", (N, T)) or Σ_t m(ℓ − ℓ_old) / max(Σ_t m, 1) ("sequence", (N, 1));
    returns (log_ratio (N, T), r = exp(log w))."""
    log_ratio = logps - old                                                     # (N, T)
    if level == "token":
        log_w = log_ratio                                                       # (N, T)
    else:
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # (N, 1)
    return log_ratio, torch.exp(log_w)


def per_token_kl(logps: torch.Tensor, ref: Optional[torch.Tensor], full_kl: Optional[torch.Tensor],
                 coef_1: torch.Tensor, *, estimator: str, bias_correction: bool) -> Optional[torch.Tensor]:
    """KL_it to the reference (None when it cannot be computed):
        k3: exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 (TRL) | k1: ℓ − ℓ_ref | k2: ½(ℓ − ℓ_ref)²
        full: Σ_v π(v)(log π(v) − log π_ref(v)) (exact, given as full_kl; never bias-corrected)
        KL_it ← KL_it·r if bias_correction (TRL's use_bias_correction_kl; sampled-token estimators only)"""
    dtype = logps.dtype
    if estimator == "full":
        return None if full_kl is None else full_kl.to(dtype)                  # (N, T)
    if ref is None:
        return None
    ref = ref.to(dtype)                                                         # (N, T)
    if estimator == "k3":
        kl = torch.exp(ref - logps) - (ref - logps) - 1                         # (N, T)
    elif estimator == "k1":
        kl = logps - ref                                                        # (N, T)
    else:
        kl = 0.5 * (logps - ref) ** 2                                           # (N, T)
    return kl * coef_1 if bias_correction else kl                               # (N, T)


def off_policy_sequence_mask(adv: torch.Tensor, logps: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor,
                             threshold: float) -> torch.Tensor:
    """OPSM (DeepSeek-V3.2; TRL's get_off_policy_mask): drop a row iff it has A_i < 0 AND a mean forward KL
    to the sampling policy above τ:  M_i = 0 iff A_i < 0 and Σ_t m(ℓ_sampling − ℓ)/max(|o_i|, 1) > τ.
    NaN sampling log-probs (unscored tokens) count as 0. → (N, 1), 1 = keep."""
    fwd_kl = torch.nan_to_num(sampling - logps.detach(), nan=0.0)               # (N, T) log π_old − log π
    seq_kl = (fwd_kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)  # (N, 1)
    return ((adv >= 0) | (seq_kl <= threshold)).to(mask.dtype)                  # (N, 1)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """TRL's get_high_entropy_mask (one process): tokens whose entropy ≥ the `threshold` quantile of the
    unmasked entropies (fp32 quantile): E_it = m_it·[H_it ≥ quantile_threshold(H)]. (N, T) → (N, T) bool."""
    local = entropy.detach()[mask.bool()].float()
    if local.numel() == 0:
        return torch.zeros_like(entropy, dtype=torch.bool)
    cut = torch.quantile(local, threshold)
    return ((entropy.detach() * mask.float()) >= cut) & mask.bool()


def sampling_importance_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, *, mode: str,
                              clip_min: Optional[float], clip_max: Optional[float]) -> torch.Tensor:
    """TRL's vLLM importance-sampling correction, for a sampler whose log-probs differ from the trainer's
    (here: the log-probs recorded at sampling time):
        d_it = m·(ℓ_old − ℓ_sampling)  (NaN → 0: an unscored token gets ρ = 1)
        ρ = exp(d_it) (token_*, (N, T))  |  exp(Σ_t d_it) (sequence_*, (N, 1))
        *_truncate: ρ ← clamp(ρ, C_min, C_max);  *_mask: ρ ← 0 where ρ < C_min or ρ > C_max
    TRL multiplies PG_it by ρ after the masks (KL untouched); vespo adds log ρ into its w_i instead."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)                   # (N, T)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)                                   # (N, 1)
    ratio = torch.exp(diff)                                                     # (N, T) | (N, 1)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


def sampling_ratio_metrics(ratio: torch.Tensor, old: torch.Tensor, sampling: torch.Tensor,
                           mask: torch.Tensor) -> dict:
    """TRL's sampling/* metrics of the correction (one process): |ℓ_old − ℓ_sampling| mean/max over the
    scored unmasked tokens, and ρ min/mean/max (token modes: over unmasked tokens; sequence modes: rows)."""
    m = mask.bool()
    delta = torch.abs(old - sampling)
    delta = delta[m & ~torch.isnan(delta)]
    flat = ratio.flatten() if ratio.shape[1] == 1 else ratio[m]

    def stat(x, fn):
        return float(fn(x)) if x.numel() > 0 else 0.0
    return {"sampling/sampling_logp_difference/mean": stat(delta, torch.mean),
            "sampling/sampling_logp_difference/max": stat(delta, torch.max),
            "sampling/importance_sampling_ratio/min": stat(flat, torch.min),
            "sampling/importance_sampling_ratio/mean": stat(flat, torch.mean),
            "sampling/importance_sampling_ratio/max": stat(flat, torch.max)}


@dataclass(frozen=True)
class Masks:
    """The PG-only masks and weights applied after the objective (each None when off)."""
    off_policy: Optional[torch.Tensor] = None   # (N, 1) OPSM, 1 = keep
    entropy: Optional[torch.Tensor] = None      # (N, T) bool high-entropy tokens
    is_ratio: Optional[torch.Tensor] = None     # (N, T) | (N, 1) sampling-time IS weight ρ

    def apply(self, per_token_pg: torch.Tensor, ratio_inside: bool = False) -> torch.Tensor:
        """PG ← PG·M (OPSM) ·E (entropy) ·ρ (IS; not when ρ is inside the objective, vespo's φ), in TRL's order."""
        if self.off_policy is not None:
            per_token_pg = per_token_pg * self.off_policy                      # (N, T) | (N, 1)
        if self.entropy is not None:
            per_token_pg = per_token_pg * self.entropy                          # (N, T)
        if self.is_ratio is not None and not ratio_inside:
            per_token_pg = per_token_pg * self.is_ratio                         # (N, T) | (N, 1)
        return per_token_pg
