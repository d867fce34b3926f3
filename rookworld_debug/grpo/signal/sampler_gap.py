"""Sampler–trainer gap: how far the log-probs the sampler saw are from the trainer's.

Shape legend: N = B·G rows, T completion tokens; m_it the loss mask, n = Σ m.

Estimators (every view states them):

* Δ_it = ℓ^sampler_it − ℓ^trainer_it on the masked sampled tokens: ℓ^sampler = `Rollout.sampling_per_token_logps`
  (the decoding loop's own log-prob of the token it drew), ℓ^trainer = the trainer's fp32 teacher-forced forward at
  the same θ (the step's start). Reported: quantiles, mean, mean |Δ|, max |Δ| and a histogram of Δ;
* truncated importance weights as TRL 1.16 forms them (`vllm_importance_sampling_mode='token_truncate'`):
  w_it = min(exp(ℓ^trainer − ℓ^sampler), C) = min(e^{−Δ}, C), the factor that reweights the sampler's tokens to the
  trainer's policy; C = `cap` (TRL `vllm_importance_sampling_clip_max`, default 3.0 in TRL 1.16; the older
  `vllm_importance_sampling_cap` defaulted to 2.0). Sequence level ('sequence_truncate'):
  w_i = min(exp(Σ_t m·(ℓ^trainer − ℓ^sampler)), C);
* effective sample size ESS = (Σ w)² / Σ w²: per token over the n masked tokens, and per sequence over the N rows;
  ESS / n (or / N) = 1 means the weights are uniform (no gap), → 1/n when one token carries all the weight.

Tokens whose Δ is not finite (a NaN or ±inf log-prob on either side) get Δ = 0, w = 1 (TRL's rule for NaN) and
are counted in `nan_tokens`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TRL_IS_CAP = 3.0            # TRL 1.16 GRPOConfig.vllm_importance_sampling_clip_max default
QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)


@dataclass(frozen=True)
class SamplerTrainerGap:
    """The gap record (module doc)."""
    sampler: str                        # how the sampler ran, e.g. "fp32" or "bf16 autocast (cpu)"
    trainer: str                        # how the trainer's log-probs were taken
    n_tokens: int                       # n = Σ m
    n_seqs: int                         # rows with at least one masked token
    delta: torch.Tensor                 # (n,) Δ = ℓ^sampler − ℓ^trainer on the masked tokens (NaN-sampler: 0)
    quantiles: tuple                    # ((q, Δ quantile), ...) for QUANTILES
    mean: float                         # mean Δ
    mean_abs: float                     # mean |Δ| (TRL sampling/sampling_logp_difference/mean)
    max_abs: float                      # max |Δ| (TRL sampling/sampling_logp_difference/max)
    cap: float                          # C
    is_min: float                       # token weights w = min(e^{−Δ}, C): min, mean, max
    is_mean: float
    is_max: float
    frac_capped: float                  # share of tokens with e^{−Δ} > C
    ess_token: float                    # (Σw)²/Σw² over the n tokens
    ess_token_frac: float               # ess_token / n
    ess_seq: float                      # the same over the sequence weights
    ess_seq_frac: float                 # ess_seq / n_seqs
    nan_tokens: int                     # masked tokens whose Δ was NaN or ±inf
    flags: tuple

    @property
    def metrics(self) -> dict:
        """TRL-named (sampling/*) metrics of this gap."""
        return {"sampling/sampling_logp_difference/mean": self.mean_abs,
                "sampling/sampling_logp_difference/max": self.max_abs,
                "sampling/importance_sampling_ratio/min": self.is_min,
                "sampling/importance_sampling_ratio/mean": self.is_mean,
                "sampling/importance_sampling_ratio/max": self.is_max}


def ess(w: torch.Tensor) -> float:
    """(Σ w)² / Σ w² of non-negative weights; NaN for none or all zero."""
    w = w.to(torch.float64)
    s2 = float((w * w).sum())
    return float(w.sum()) ** 2 / s2 if s2 > 0 else math.nan


def sampler_trainer_gap(sampler_logps: torch.Tensor, trainer_logps: torch.Tensor, mask: torch.Tensor, *,
                        cap: float = TRL_IS_CAP, sampler: str = "fp32", trainer: str = "fp32 forward") -> SamplerTrainerGap:
    """The gap of (N, T) sampler vs trainer log-probs on `mask` (N, T). `cap` = C > 0."""
    from rookworld_debug.errors import ConfigError
    if not cap > 0:
        raise ConfigError("cap", f"the importance-weight cap C must be > 0, got {cap}")
    if sampler_logps.shape != trainer_logps.shape or sampler_logps.shape != mask.shape:
        raise ConfigError("sampler_logps", f"shapes differ: sampler {tuple(sampler_logps.shape)}, trainer "
                          f"{tuple(trainer_logps.shape)}, mask {tuple(mask.shape)}")
    m = mask.bool()                                                         # (N, T)
    flags = []
    raw = (sampler_logps.to(torch.float64) - trainer_logps.to(torch.float64))   # (N, T)
    nan_tok = int((~torch.isfinite(raw) & m).sum())      # NaN, or ±inf on one side (−inf − −inf is NaN too)
    if nan_tok:
        flags.append(f"{nan_tok} masked token(s) without a finite sampler/trainer log-prob: Δ = 0, w = 1 (TRL's rule)")
    d_all = raw.masked_fill(~torch.isfinite(raw) | ~m, 0.0)                 # (N, T)
    d = d_all[m]                                                            # (n,)
    n, rows = int(d.numel()), m.any(1)                                      # (N,)
    if n == 0:
        flags.append("no masked tokens: the gap is undefined")
        nan = math.nan
        return SamplerTrainerGap(sampler=sampler, trainer=trainer, n_tokens=0, n_seqs=0, delta=d.float(),
                                 quantiles=tuple((q, nan) for q in QUANTILES), mean=nan, mean_abs=nan, max_abs=nan,
                                 cap=float(cap), is_min=nan, is_mean=nan, is_max=nan, frac_capped=nan, ess_token=nan,
                                 ess_token_frac=nan, ess_seq=nan, ess_seq_frac=nan, nan_tokens=nan_tok,
                                 flags=tuple(flags))
    w = torch.exp(-d).clamp(max=cap)                                        # (n,)
    w_seq = torch.exp(-d_all.sum(1)[rows]).clamp(max=cap)                   # (n_seqs,)
    q = torch.quantile(d, torch.tensor(QUANTILES, dtype=d.dtype, device=d.device))
    e_tok, e_seq = ess(w), ess(w_seq)
    return SamplerTrainerGap(
        sampler=sampler, trainer=trainer, n_tokens=n, n_seqs=int(rows.sum()), delta=d.float(),
        quantiles=tuple(zip(QUANTILES, (float(x) for x in q))), mean=float(d.mean()), mean_abs=float(d.abs().mean()),
        max_abs=float(d.abs().max()), cap=float(cap), is_min=float(w.min()), is_mean=float(w.mean()),
        is_max=float(w.max()), frac_capped=float((torch.exp(-d) > cap).double().mean()), ess_token=e_tok,
        ess_token_frac=e_tok / n, ess_seq=e_seq, ess_seq_frac=e_seq / int(rows.sum()), nan_tokens=nan_tok,
        flags=tuple(flags))
