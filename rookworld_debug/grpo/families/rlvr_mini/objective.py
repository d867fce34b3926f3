"""rookworld-rlvr's "mini" GRPO objective (jorahn/rookworld-rlvr, pure PyTorch), one small function per term.

Shape legend: N rows (B in the mini's own names), T positions; p = the policy's log-prob of the sampled
token (N, T), q = the reference's, m = the completion mask (N, T): in the mini m = 1 − prompt_mask, so every
position that is not prompt counts, pads included (they hold p = q = 0 and add nothing to the value).

    s_i    = Σ_t m·(p − q)                       SEQUENCE log-ratio against the REFERENCE, summed (not averaged)
    r_i    = exp(clamp(s_i, −20, 20))
    PG     = −mean_i min(r_i·A_i, clip(r_i, 1 − ε_low, 1 + ε_high)·A_i)        (the mini: ε_low = ε_high = ε)
    KL_i   = forward   Σ_t m·e^p·(p − q)          (sampled-token surrogates: not KL divergences, can be < 0)
             reverse   Σ_t m·e^q·(q − p)
             symmetric ½(forward + reverse)
    H      = mean_i Σ_t −m·e^p·p                  (sampled-token entropy surrogate)
    loss   = PG + kl_coef·mean_i KL_i + value_loss_coef·mean_i (v_i − v̂_i)² − c_H·H
             (the value term only when both values and targets are given; the entropy term only if c_H > 0)

Metrics as the mini reports them (`mini_metrics`): `clipped_frac` = the fraction of rows with r outside
[1 − ε, 1 + ε] whatever the sign of A (not the rows where the clip binds) and `ratio_outliers`
(r < 0.5 or r > 2), both float32 fractions; `entropy_loss` is the signed −c_H·H; std's are unbiased.
Each function matches ../shared/fixtures/rlvr_mini_golden.json (tests/test_rlvr_mini.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.objective.aggregation import Aggregation, AggregationInputs

KL_TYPES = ("forward", "reverse", "symmetric")
LOG_RATIO_CLAMP = 20.0
KL_TYPE_FORMULAS = {
    "forward": "Σ_t m·e^p·(p − q)",
    "reverse": "Σ_t m·e^q·(q − p)",
    "symmetric": "½(Σ_t m·e^p·(p − q) + Σ_t m·e^q·(q − p))",
}


def _check_kl_type(kl_type: str) -> None:
    if kl_type not in KL_TYPES:
        raise ConfigError("rlvr_kl_type", f"unknown value {kl_type!r}; expected one of {list(KL_TYPES)}")


def per_token_kl_terms(p: torch.Tensor, q: torch.Tensor, kl_type: str) -> torch.Tensor:
    """The mini's per-token KL surrogate (unmasked), (N, T): forward e^p(p − q), reverse e^q(q − p), symmetric ½Σ."""
    _check_kl_type(kl_type)
    if kl_type == "forward":
        return torch.exp(p) * (p - q)
    if kl_type == "reverse":
        return torch.exp(q) * (q - p)
    return 0.5 * (torch.exp(p) * (p - q) + torch.exp(q) * (q - p))


def kl_divergence(p: torch.Tensor, q: torch.Tensor, mask: torch.Tensor, kl_type: str = "forward") -> torch.Tensor:
    """The mini's `compute_kl_divergence`: one value per row (N,), the mask multiplied after the exponential
    (so a −inf under the mask gives NaN, as in the mini)."""
    _check_kl_type(kl_type)
    fwd = (mask * torch.exp(p) * (p - q)).sum(-1) if kl_type != "reverse" else None     # (N,)
    rev = (mask * torch.exp(q) * (q - p)).sum(-1) if kl_type != "forward" else None     # (N,)
    if kl_type == "forward":
        return fwd
    if kl_type == "reverse":
        return rev
    return 0.5 * (fwd + rev)


def sequence_log_ratio(p: torch.Tensor, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = Σ_t m·(p − q), (N,)."""
    return (mask * (p - q)).sum(-1)


def sequence_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """r_i = exp(clamp(s_i, ±20)), (N,): the clamp saturates the gradient beyond |s| = 20."""
    return torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_sequence_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
                               eps_high: float) -> torch.Tensor:
    """Per-row PG_i = −min(r_i·A_i, clip(r_i, 1 − ε_low, 1 + ε_high)·A_i), (N,)."""
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)


def entropy_surrogate(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row H_i = Σ_t −m·e^p·p, (N,)."""
    return (-mask * torch.exp(p) * p).sum(-1)


def create_prompt_mask(shape, prompt_lengths) -> torch.Tensor:
    """The mini's `create_prompt_mask`: float32 (N, S − 1), row i = 1 on its first L_i − 1 positions with Python
    slice semantics (L = 1 marks nothing, L = 0 every position but the last, L ≥ S everything). It assumes
    RIGHT padding: under left padding these positions are pads and the real prompt counts as completion."""
    n, s = int(shape[0]), int(shape[1])
    mask = torch.zeros((n, s - 1), dtype=torch.float32)
    for i, length in enumerate(prompt_lengths):
        mask[i, :int(length) - 1] = 1.0
    return mask


def compute_log_probs(logits: torch.Tensor, input_ids: torch.Tensor,
                      attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The mini's `compute_log_probs` from a model's logits (N, S, V): position t is log-softmax(logits_t) at
    token t + 1, times attention_mask[t + 1] when given. (N, S − 1). Under left padding the last pad's
    position keeps the first real token's log-prob (its target is real)."""
    logp = torch.log_softmax(logits[:, :-1], dim=-1)                                    # (N, S−1, V)
    out = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)                   # (N, S−1)
    if attention_mask is not None:
        out = out * attention_mask[:, 1:].to(out.dtype)
    return out


@dataclass(frozen=True)
class MiniTerms:
    """The mini's loss terms for one batch (0-dim tensors carry the gradient)."""
    total: torch.Tensor                 # () PG + kl_coef·KL + value term − c_H·H
    pg_loss: torch.Tensor               # ()
    kl_div: torch.Tensor                # () mean_i KL_i of the selected type
    value_loss: torch.Tensor            # () mean (v − v̂)² (0 when unused)
    entropy: torch.Tensor               # () H = mean_i H_i (unscaled)
    entropy_loss: torch.Tensor          # () −c_H·H (0 when c_H = 0)
    log_ratio: torch.Tensor             # (N,) s_i, detached
    ratio: torch.Tensor                 # (N,) r_i, detached
    per_seq_pg: torch.Tensor            # (N,) PG_i, detached
    per_seq_kl: torch.Tensor            # (N,) KL_i of the selected type, detached
    per_seq_entropy: torch.Tensor       # (N,) H_i, detached


def mini_terms(p: torch.Tensor, q: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, kl_coef: float,
               eps_low: float, eps_high: float, kl_type: str, entropy_coef: float,
               values: Optional[torch.Tensor] = None, value_targets: Optional[torch.Tensor] = None,
               value_loss_coef: float = 0.1) -> MiniTerms:
    """The mini's `grpo_loss` composed from the functions above (same float operations, same order)."""
    _check_kl_type(kl_type)
    s = sequence_log_ratio(p, q, mask)                                                  # (N,)
    r = sequence_ratio(s)                                                               # (N,)
    pg_i = clipped_sequence_surrogate(r, adv, eps_low, eps_high)                        # (N,)
    pg = pg_i.mean()
    kl_i = kl_divergence(p, q, mask, kl_type)                                           # (N,)
    kl = kl_i.mean()
    total = pg + kl_coef * kl
    zero = torch.zeros((), dtype=p.dtype, device=p.device)
    value_loss = zero
    if values is not None and value_targets is not None:
        value_loss = ((values - value_targets) ** 2).mean()
        total = total + value_loss_coef * value_loss
    h_i = entropy_surrogate(p, mask)                                                    # (N,)
    h = h_i.mean()
    entropy_loss = zero
    if entropy_coef > 0:
        entropy_loss = -entropy_coef * h
        total = total + entropy_loss
    return MiniTerms(total, pg, kl, value_loss, h, entropy_loss, s.detach(), r.detach(), pg_i.detach(),
                     kl_i.detach(), h_i.detach())


def mini_metrics(t: MiniTerms, p: torch.Tensor, q: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
                 kl_coef: float, eps_low: float, eps_high: float) -> dict:
    """The metrics dict the mini returns (its names; see the module docstring for what each measures)."""
    with torch.no_grad():
        r = t.ratio
        kls = {k: float(kl_divergence(p, q, mask, k).mean()) for k in KL_TYPES}
        return {
            "pg_loss": float(t.pg_loss), "kl_div": float(t.kl_div), "kl_forward": kls["forward"],
            "kl_reverse": kls["reverse"], "kl_symmetric": kls["symmetric"], "value_loss": float(t.value_loss),
            "entropy_loss": float(t.entropy_loss), "total_loss": float(t.total),
            "ratio_mean": float(r.mean()), "ratio_std": _std(r),
            "ratio_outliers": float(((r < 0.5) | (r > 2.0)).float().mean()),
            "advantage_mean": float(adv.mean()), "advantage_std": _std(adv),
            "clipped_frac": float(((r < 1 - eps_low) | (r > 1 + eps_high)).float().mean()),
            "kl_coef": float(kl_coef),
        }


def _std(x: torch.Tensor) -> float:
    """Unbiased std; NaN for a single value (as torch's, without its warning)."""
    return float(x.std()) if x.numel() > 1 else float("nan")


def grpo_loss(policy_log_probs: torch.Tensor, ref_log_probs: torch.Tensor, advantages: torch.Tensor,
              prompt_mask: torch.Tensor, kl_coef: float = 0.02, clip_range: float = 0.2, kl_type: str = "forward",
              values: Optional[torch.Tensor] = None, value_targets: Optional[torch.Tensor] = None,
              value_loss_coef: float = 0.1, entropy_coef: float = 0.01) -> tuple[torch.Tensor, dict]:
    """The mini's `grpo_loss` with its own signature and defaults: (total loss, metrics)."""
    mask = 1 - prompt_mask
    t = mini_terms(policy_log_probs, ref_log_probs, advantages, mask, kl_coef=kl_coef, eps_low=clip_range,
                   eps_high=clip_range, kl_type=kl_type, entropy_coef=entropy_coef, values=values,
                   value_targets=value_targets, value_loss_coef=value_loss_coef)
    return t.total, mini_metrics(t, policy_log_probs, ref_log_probs, advantages, mask, kl_coef=kl_coef,
                                 eps_low=clip_range, eps_high=clip_range)


def row_sum_mean(a: AggregationInputs) -> Aggregation:
    """rlvr_mini: the mean over rows of each row's token SUM; a per-row term (N, 1) (the sequence PG_i) enters
    as it is.   agg(L) = mean_i( Σ_t m L_it ) / g   |   mean_i( L_i ) / g"""
    mask, N, g = a.mask, a.mask.shape[0], a.g

    def reduce(x):
        per_row = x.reshape(N) if x.shape[-1] == 1 and mask.shape[-1] != 1 else (x * mask).sum(-1)
        return per_row.mean() / g
    w = torch.full((N,), 1.0 / (N * g), dtype=mask.dtype, device=mask.device)          # (N,)
    text = (f"rlvr_mini: mean over {N} sequences of per-sequence SUMS (no length normalisation: a row's "
            f"weight grows with its length)" + a.per_g())
    return Aggregation(reduce, w, float(N), text)
