"""The entropy mechanism (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models") on one step, and its clip events by bound and sign of A.

Shape legend: N = B·G rows, T completion tokens; m_it the loss mask, n = Σ m.

Estimators (every view states them):

* Cov = Σ m·(ℓ_it − ℓ̄)(A_i − Ā) / n over the masked sampled tokens, ℓ_it = log π_θ(y_it) (tempered, the
  trainer's fp32 forward at the step's start), ℓ̄ = Σ m·ℓ / n and Ā = Σ m·A_i / n token means (Cui et al.'s
  batch-centred token covariance, the quantity their Clip-Cov / KL-Cov act on);
* predicted ΔH = −η·Cov with η = the learning rate: Cui et al.'s FIRST-ORDER result for a softmax policy
  updated by natural policy gradient with step η (logits z ← z + η·A). Adam on shared weights is not that
  update, so read its SIGN (Cov > 0: confident tokens were rewarded → entropy falls) and the implied η_eff =
  −ΔH_measured / Cov, not its magnitude;
* measured ΔH = Σ m·(H_after − H_before) / n on the SAME sampled tokens (same prefixes): H the entropy (nats) of
  the tempered policy, before = the step's start, after = the evaluation's forward after the whole update
  (μ·steps_per_generation optimizer steps); `measured_first_step` = after ONE optimizer step, from the next
  pass's grad forward when μ > 1 (NaN otherwise), the step the first-order prediction is about.

Clip events (per inner pass, from its LossBreakdown): a token crosses the low bound when r < 1 − ε_low and the
high bound when r > 1 + ε_high. With A < 0 the low bound binds (clip-low: the token's probability may not be
pushed further down — the entropy-RAISING side, it would spread mass to other tokens); with A > 0 the high bound
binds (clip-high: the token may not be pushed further up — the entropy-LOWERING side). The other two cells
cross a bound without binding (PPO's min keeps the unclipped term; the gradient flows). Shares are of n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch


@dataclass(frozen=True)
class ClipEvents:
    """One inner pass's tokens by bound crossed × sign of A (module doc); counts and shares of the n tokens."""
    pass_index: int                     # 0-based inner pass (μ)
    n_tokens: int                       # n = Σ m
    clip_low_neg: int                   # r < 1 − ε_low, A < 0: clipped (TRL clip_ratio/low), entropy-raising side
    clip_high_pos: int                  # r > 1 + ε_high, A > 0: clipped (TRL clip_ratio/high), entropy-lowering side
    low_pos: int                        # r < 1 − ε_low, A > 0: bound crossed, not binding
    high_neg: int                       # r > 1 + ε_high, A < 0: bound crossed, not binding
    share_clip_low_neg: float           # clip_low_neg / n (NaN when n = 0)
    share_clip_high_pos: float          # clip_high_pos / n


@dataclass(frozen=True)
class EntropyMechanism:
    """Predicted (−η·Cov) and measured entropy change of one step (module doc)."""
    n_tokens: int                       # n = Σ m over the loss mask
    cov: float                          # Σ m (ℓ − ℓ̄)(A − Ā) / n
    eta: float                          # η = the step's learning rate
    predicted_delta_entropy: float      # −η·Cov (first-order, natural-PG softmax step)
    entropy_before: float               # Σ m·H_before / n (nats/token)
    measured_delta_entropy: float       # Σ m·(H_after − H_before) / n after the whole update (NaN: not evaluated)
    measured_first_step: float          # the same after ONE optimizer step (μ > 1), NaN otherwise
    implied_eta: float                  # −measured ΔH (first step when known) / Cov; NaN when Cov = 0
    sign_agrees: Optional[bool]         # sign(predicted) == sign(measured); None when either is 0/NaN
    per_token_entropy_before: torch.Tensor  # (N, T) H at the step's start, 0 where masked (for the after diff)
    clip: tuple                         # ClipEvents per inner pass (empty before the update)
    flags: tuple


def check_shapes(logps: torch.Tensor, entropy: Optional[torch.Tensor], advantages: torch.Tensor,
                 mask: torch.Tensor) -> None:
    """ConfigError naming the input unless logps, entropy and mask are (N, T) alike and advantages (N,)."""
    from rookworld_debug.errors import ConfigError
    if logps.ndim != 2:
        raise ConfigError("logps", f"need an (N, T) tensor, got shape {tuple(logps.shape)}")
    for name, t in (("entropy", entropy), ("mask", mask)):
        if t is not None and t.shape != logps.shape:
            raise ConfigError(name, f"shape {tuple(t.shape)} differs from the log-probs' {tuple(logps.shape)}")
    if advantages.shape != logps.shape[:1]:
        raise ConfigError("advantages", f"need one advantage per row, shape ({logps.shape[0]},), got "
                                        f"{tuple(advantages.shape)}")


def token_covariance(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> float:
    """Σ m (ℓ − ℓ̄)(A − Ā) / n over masked tokens (module doc). logps (N, T), advantages (N,), mask (N, T).
    NaN when n = 0 or an input is non-finite on a masked token."""
    check_shapes(logps, None, advantages, mask)
    m = mask.to(torch.float64)                                              # (N, T)
    n = float(m.sum())
    if n == 0:
        return math.nan
    lp = torch.where(mask.bool(), logps.to(torch.float64), 0.0)             # (N, T) outside the mask: not read
    a = advantages.to(torch.float64)[:, None].expand_as(lp)                 # (N, T)
    lp_bar, a_bar = float((m * lp).sum()) / n, float((m * a).sum()) / n
    return float((m * (lp - lp_bar) * (a - a_bar)).sum()) / n


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(torch.float64)
    n = float(m.sum())
    return float(torch.where(mask.bool(), x.to(torch.float64), 0.0).sum()) / n if n else math.nan


def clip_events(loss, pass_index: int = 0) -> ClipEvents:
    """The pass's tokens by bound × sign of A, from its LossBreakdown (per_token_ratio, advantages, mask, ε)."""
    m = loss.completion_mask.bool()                                        # (N, T)
    r = loss.per_token_ratio                                               # (N, T)
    a = loss.advantages[:, None].expand_as(r)                              # (N, T)
    low, high = (r < 1 - loss.epsilon_low) & m, (r > 1 + loss.epsilon_high) & m
    n = int(m.sum())
    cells = {"clip_low_neg": int((low & (a < 0)).sum()), "clip_high_pos": int((high & (a > 0)).sum()),
             "low_pos": int((low & (a > 0)).sum()), "high_neg": int((high & (a < 0)).sum())}
    return ClipEvents(pass_index=pass_index, n_tokens=n, **cells,
                      share_clip_low_neg=cells["clip_low_neg"] / n if n else math.nan,
                      share_clip_high_pos=cells["clip_high_pos"] / n if n else math.nan)


def entropy_mechanism(logps: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      lr: float) -> EntropyMechanism:
    """The prediction at the step's start (the measured fields NaN until `with_measured`).
    logps, entropy: (N, T) the trainer's forward at the step's start; advantages (N,); mask (N, T)."""
    check_shapes(logps, entropy, advantages, mask)
    cov = token_covariance(logps, advantages, mask)
    n = int(mask.sum())
    flags = () if n else ("no masked tokens: the covariance and the entropy change are undefined",)
    m = mask.bool()
    bad = int((~torch.isfinite(logps) & m).sum()), int((~torch.isfinite(entropy) & m).sum())
    bad_a = int((~torch.isfinite(advantages)).sum())
    if any(bad) or bad_a:
        flags += (f"non-finite inputs under the mask ({bad[0]} log-prob(s), {bad[1]} entropy value(s), {bad_a} "
                  "advantage(s) NaN or ±inf): Cov, the predicted and the measured change are undefined (NaN)",)
    return EntropyMechanism(n_tokens=n, cov=cov, eta=float(lr), predicted_delta_entropy=-float(lr) * cov,
                            entropy_before=masked_mean(entropy, mask), measured_delta_entropy=math.nan,
                            measured_first_step=math.nan, implied_eta=math.nan, sign_agrees=None,
                            per_token_entropy_before=(entropy.detach() * mask).to(torch.float32), clip=(), flags=flags)


def with_measured(em: EntropyMechanism, mask: torch.Tensor, entropy_after: Optional[torch.Tensor],
                  entropy_after_first_step: Optional[torch.Tensor], passes=()) -> EntropyMechanism:
    """`em` with the measured change on the same tokens (entropy_after (N, T) after the whole update,
    entropy_after_first_step (N, T) after one optimizer step, either None when not measured) and the clip
    events of each inner pass's LossBreakdown in `passes`."""
    h0 = em.per_token_entropy_before.to(torch.float64)

    def delta(h):
        return math.nan if h is None else masked_mean(h.to(torch.float64) - h0, mask)
    full, first = delta(entropy_after), delta(entropy_after_first_step)
    meas = first if math.isfinite(first) else full
    implied = -meas / em.cov if em.cov and math.isfinite(meas) and math.isfinite(em.cov) else math.nan
    pred = em.predicted_delta_entropy
    agrees = None if not (pred and meas and math.isfinite(pred) and math.isfinite(meas)) else \
        (pred > 0) == (meas > 0)
    return replace(em, measured_delta_entropy=full, measured_first_step=first, implied_eta=implied,
                   sign_agrees=agrees, clip=tuple(clip_events(lo, i) for i, lo in enumerate(passes)))
