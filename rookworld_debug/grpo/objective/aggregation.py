"""Aggregations of the GRPO loss: how a per-token term L (N, T) becomes one number, one function per rule.

Shape legend: N rows of one micro-batch, T completion tokens. m = completion_mask (N, T) float; g =
gradient_accumulation_steps (TRL's current_gradient_accumulation_steps). Each aggregation returns the reduce
function TRL applies (the same float operations, in the same order, so the TRL oracle holds to rounding), the
per-row weights w_i with reduce(x) = Σ_i w_i·Σ_t m x_it (each row's contribution, for the per-sequence
records) and the denominator with its description (loss.Normalizer). The entropy bonus is here too: it
is an aggregate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch


@dataclass(frozen=True)
class AggregationInputs:
    """What the aggregations need besides the per-token term (all of it fixed per micro-batch)."""
    mask: torch.Tensor                  # (N, T) float completion mask
    label: str                          # the loss type's name in the description
    gradient_accumulation_steps: int    # g
    max_completion_length: int          # dr_grpo's L_max
    num_items_in_batch: Union[int, float, torch.Tensor, None]  # dapo/cispo/vespo: Σ m of the generation batch
    steps_per_generation: Optional[int]  # None = g

    @property
    def g(self) -> float:
        return float(self.gradient_accumulation_steps)

    def per_g(self) -> str:
        """The "÷ g" suffix of a description (empty when g = 1)."""
        return f", ÷ g={self.gradient_accumulation_steps}" if self.g != 1 else ""


@dataclass(frozen=True)
class Aggregation:
    reduce: Callable[[torch.Tensor], torch.Tensor]  # (N, T) | (N, 1) per-token term → () aggregated term
    row_weights: torch.Tensor                        # (N,) w_i: row i contributes w_i·Σ_t m x_it
    denominator: float                               # the effective denominator (tokens, rows, N·L_max), before ÷ g
    description: str                                 # e.g. "dapo: Σ mask = 312 tokens (this batch)"


def sequence_mean(a: AggregationInputs) -> Aggregation:
    """grpo, sapo, manual: the mean over rows of each row's token mean.
        agg(L) = mean_i( Σ_t m L / max(Σ_t m, 1) ) / g"""
    mask, N, g = a.mask, a.mask.shape[0], a.g

    def reduce(x):
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / g
    text = f"{a.label}: mean over {N} sequences of per-sequence token means (÷ |o_i|, then ÷ {N})" + a.per_g()
    return Aggregation(reduce, 1.0 / (mask.sum(-1).clamp(min=1.0) * N * g), float(N), text)


def batch_token_mean(a: AggregationInputs) -> Aggregation:
    """bnpo: the token mean of this micro-batch.
        agg(L) = Σ m L / max(Σ m, 1) / g"""
    mask, N, g = a.mask, a.mask.shape[0], a.g
    total = mask.sum()                                                          # ()
    den = total.clamp(min=1.0)

    def reduce(x):
        return (x * mask).sum() / mask.sum().clamp(min=1.0) / g
    text = f"{a.label}: Σ mask = {int(total)} tokens (this micro-batch)" + a.per_g()
    return Aggregation(reduce, (1.0 / (den * g)).expand(N), float(den), text)


def fixed_length(a: AggregationInputs) -> Aggregation:
    """dr_grpo: every row counts max_completion_length tokens, whatever its length.
        agg(L) = Σ m L / (N_rows · max_completion_length) / g"""
    mask, N, g, L = a.mask, a.mask.shape[0], a.g, a.max_completion_length
    den = float(N * L)

    def reduce(x):
        return (x * mask).sum() / (N * L) / g
    text = f"{a.label}: N·L_max = {N}·{L} = {int(den)}" + a.per_g()
    return Aggregation(reduce, torch.full((N,), 1.0 / (den * g), dtype=mask.dtype, device=mask.device), den, text)


def sequence_sum_mean(a: AggregationInputs) -> Aggregation:
    """luspo: the mean over rows of each row's token SUM (each sequence weighted by its length).
        agg(L) = mean_i( Σ_t m L ) / g"""
    mask, N, g = a.mask, a.mask.shape[0], a.g

    def reduce(x):
        return (x * mask).sum(-1).mean() / g
    text = (f"{a.label}: mean over {N} sequences of per-sequence token SUMS (each weighted by its length |o_i|)"
            + a.per_g())
    w = torch.full((N,), 1.0 / (N * g), dtype=mask.dtype, device=mask.device)   # (N,)
    return Aggregation(reduce, w, float(N), text)


def global_token_mean(a: AggregationInputs) -> Aggregation:
    """dapo, cispo, vespo: the generation batch's token count, rescaled to one accumulation window.
        agg(L) = Σ m L / (max(num_items_in_batch, 1) · g / steps_per_generation)
    (num_items_in_batch = Σ m over the whole generation batch; None → this micro-batch's Σ m)."""
    mask, N, g = a.mask, a.mask.shape[0], a.g
    if a.num_items_in_batch is None:
        items = mask.sum().detach()
    else:
        items = torch.as_tensor(a.num_items_in_batch, dtype=mask.dtype, device=mask.device)
    den_t = items.clamp(min=1.0)                                                # TRL: / num_processes (1)
    spg = a.steps_per_generation
    rescaled = spg is not None and spg != a.gradient_accumulation_steps
    if rescaled:
        den_t = den_t * g / spg

    def reduce(x):
        return (x * mask).sum() / den_t
    src = "this batch" if a.num_items_in_batch is None else "num_items_in_batch"
    rescale = f" · g/steps_per_generation = {a.gradient_accumulation_steps}/{spg}" if rescaled else ""
    text = f"{a.label}: Σ mask = {_fmt_count(float(den_t))} tokens ({src}{rescale})"
    return Aggregation(reduce, (1.0 / den_t).expand(N), float(den_t), text)


def _fmt_count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class EntropyBonus:
    entropy_loss: torch.Tensor          # () H̄ (unscaled)
    entropy_term: torch.Tensor          # () −c_H·H̄, as it enters the loss
    per_token_entropy: torch.Tensor     # (N, T) H masked, detached
    per_seq_entropy_term: torch.Tensor  # (N,) each row's contribution to entropy_term


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, entropy_mask: Optional[torch.Tensor], *,
                  entropy_coef: float, g: float, per_sequence: bool = False) -> EntropyBonus:
    """The entropy bonus −c_H·H̄, with H̄ a token mean of this micro-batch for every TRL loss type:
        H̄ = Σ m' H / max(Σ m', 1) / g,  m' = m·E (E the entropy mask, if any; TRL: the same tokens as PG)
    and with `per_sequence` (rookworld-trl's manual loop) the mean of per-sequence token means:
        H̄ = mean_i(Σ_t m H / |o_i|) / g."""
    H = entropy.to(mask.dtype)                                                  # (N, T)
    N = mask.shape[0]
    seq_len_c = mask.sum(-1).clamp(min=1.0)                                     # (N,)
    per_token_entropy = (H * mask).detach()                                     # (N, T)
    eff = mask if entropy_mask is None else mask * entropy_mask                 # (N, T)
    if per_sequence:
        entropy_loss = ((H * mask).sum(-1) / seq_len_c).mean() / g              # ()
        row_w = 1.0 / (seq_len_c * N * g)                                       # (N,)
    else:
        entropy_loss = (H * eff).sum() / eff.sum().clamp(min=1.0) / g           # ()
        row_w = (1.0 / (eff.sum().clamp(min=1.0) * g)).expand(N)                # (N,)
    zero = torch.zeros((), dtype=mask.dtype, device=mask.device)
    entropy_term = -entropy_coef * entropy_loss if entropy_coef != 0 else zero  # ()
    with torch.no_grad():
        if entropy_coef != 0:
            tok = per_token_entropy if entropy_mask is None or per_sequence else per_token_entropy * entropy_mask
            per_seq = -entropy_coef * tok.sum(-1) * row_w                       # (N,)
        else:
            per_seq = torch.zeros(N, dtype=mask.dtype, device=mask.device)      # (N,)
    return EntropyBonus(entropy_loss, entropy_term, per_token_entropy, per_seq)
