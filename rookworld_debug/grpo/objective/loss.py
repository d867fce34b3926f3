"""Loss phase: TRL's GRPO loss on (N, T) tensors, decomposed per token / sequence / group / term.

Shape legend: B prompts, G generations per prompt, N = B·G rows (or one micro-batch of rows), T completion
tokens. m = completion_mask (N, T); A = advantages (N,); ℓ = per_token_logps (grad); ℓ_old, ℓ_ref.

This is `trl.GRPOTrainer._compute_loss` (installed TRL 1.16) for ONE micro-batch, num_processes = 1,
g = gradient_accumulation_steps (steps_per_generation = g, TRL's default), without the aux loss (no
counterpart here). Every loss_type of TRL 1.16:

    ℓ_old      = ℓ.detach() if old_per_token_logps is None                  (TRL: num_iterations = 1)
    log w      = ℓ − ℓ_old                              importance_sampling_level = "token"   (N, T)
               = Σ_t m(ℓ − ℓ_old) / max(Σ_t m, 1)       importance_sampling_level = "sequence" (N, 1)
    r          = exp(log w)
    KL_it      = k3: exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1    (TRL)   | k1: ℓ − ℓ_ref | k2: ½(ℓ − ℓ_ref)²
                 full: Σ_v π(v)(log π(v) − log π_ref(v))  (exact, given as per_token_full_kl)
    KL_it     ← KL_it · r   if use_bias_correction_kl (TRL default; sampled-token estimators only)
    c          = clamp(r, 1 − ε_low, 1 + ε_high)         (from the UNclamped r)
    r'         = min(r, δ) if δ else r                    (two-sided clipping)
    PG_it      = −min(r'·A_i, c·A_i)                      grpo, bnpo, dr_grpo, dapo, luspo
               = −sg(min(r, ε_high))·A_i·ℓ_it             cispo (ε_high is ε_max, an absolute cap; TRL suggests 5)
               = −σ(τ_A·(r − 1))·4/τ_A · A_i              sapo  (τ_A = τ_pos if A > 0 else τ_neg)
               = −sg(φ_i)·A_i·ℓ_it                        vespo: log w_i = clamp(Σ_t m·clamp(ℓ − ℓ_old, ±20),
                                                          log 1e-8, 20), φ = exp(λ + k·log w − λ·w) with
                                                          (k, λ) = (k_pos, λ_pos) if A ≥ 0 else (k_neg, λ_neg)
    PG_it     ← PG_it · M_i    OPSM (off_policy_mask_threshold τ): M_i = 0 iff A_i < 0 and
                               Σ_t m(ℓ_sampling − ℓ)/|o_i| > τ  (ℓ_sampling = old log-probs here)
    PG_it     ← PG_it · E_it   entropy mask (top_entropy_quantile ρ < 1): E_it = m_it·[H_it ≥ quantile_{1−ρ}(H)]
    PG_it     ← PG_it · ρ_it   sampling-time IS correction (TRL's vllm_importance_sampling_*, off by default):
                               d = m(ℓ_old − ℓ_sampling), ρ = exp(d) per token or exp(Σ_t d) per row, then
                               clamped to [C_min, C_max] (*_truncate) or 0 outside it (*_mask); vespo: log ρ
                               enters log w_i instead
    L_it       = PG_it + β·KL_it                          (KL added AFTER the PG term and the masks)
    loss       = agg(L) − c_H · H̄
      agg: grpo     mean_i( Σ_t m L / max(Σ_t m, 1) ) / g
           bnpo     Σ m L / max(Σ m, 1) / g
           dr_grpo  Σ m L / (N_rows · max_completion_length) / g
           sapo     as grpo
           dapo     Σ m L / (max(num_items_in_batch, 1) · g / steps_per_generation)   (also cispo, vespo;
                    num_items_in_batch = Σ m over the whole generation batch)
           luspo    mean_i( Σ_t m L ) / g                      (each sequence weighted by its length)
      H̄ = Σ m' H / max(Σ m', 1) / g  with m' = m·E (the entropy mask, if any)   (installed TRL 1.16: a
                                       micro-batch token mean for every loss_type; TRL 1.10 differed for dapo)

`loss_type="manual"` is rookworld-trl's manual sequence-level REINFORCE (jorahn/rookworld-trl manual_grpo_debug.py),
no ratio and no clip:

    loss = (1/N) Σ_i [ −A_i · mean_t ℓ_it + β · mean_t KL_it − c_H · mean_t H_it ] / g

with mean_t the masked mean over the completion's tokens; KL uses `kl_estimator` (rookworld-trl's manual debug run used "full")
without bias correction. (Unlike that run we train on the SAMPLED ids, in float32, EOS included.)

`loss_type="rlvr_mini"` is rookworld-rlvr's objective (grpo/families/rlvr_mini/loss.py; golden-checked in grpo/families/rlvr_mini/objective.py):
    loss = −mean_i min(r_i A_i, clip(r_i) A_i) + β·mean_i KL_i − c_H·mean_i Σ_t −m e^ℓ ℓ,  r_i = exp(clamp(Σ_t m(ℓ − ℓ_ref), ±20))

Decomposition: agg is linear, so `pg_loss = agg(PG)`, `kl_loss = agg(β·KL)`, `entropy_term = −c_H·H̄` and
`loss = pg_loss + kl_loss + entropy_term` exactly (this sum defines `.loss`; it equals TRL's `_compute_loss`
to float rounding). Per-sequence values named `per_seq_*_loss`/`per_seq_pg` are each row's CONTRIBUTION to
the total (they sum to it); `per_seq_kl`, `per_seq_entropy`, `per_seq_ratio` are masked per-token means.

Code layout: each line above is one small function — the per-token objectives, importance weights, KL and
masks in `grpo.objective.terms`, the aggregations and the entropy bonus in `grpo.objective.aggregation` — and
each family's `LossRule` names the objective and aggregation of its loss types (grpo/families/); `compute_loss` composes them and keeps the
records (per token / sequence / group), TRL's metrics and the flags.

The function is pure and vectorised: calling it again on the stored (detached) tensors with a new β/ε/δ/
loss_type recomputes the whole record without any forward pass (median ≈ 1 ms for N = 64, T = 128 on a loaded
2-core CPU; see `_SmallCpuOps`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from rookworld_debug import settings
from rookworld_debug.config import IMPORTANCE_SAMPLING_LEVELS, KL_ESTIMATORS, VLLM_IS_MODES
from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.registry import LossRule, checked
from rookworld_debug.grpo.objective.aggregation import Aggregation, AggregationInputs, entropy_bonus
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.objective.terms import (Masks, ObjectiveInputs, PolicyTerm, high_entropy_mask,
                                                  importance_weights, off_policy_sequence_mask, per_token_kl,
                                                  sampling_importance_ratio, sampling_ratio_metrics, vespo_phi)

__all__ = ["LOSS_TYPES", "KL_ESTIMATORS", "IMPORTANCE_SAMPLING_LEVELS", "KL_FORMULAS", "LossBreakdown", "Normalizer",
           "compute_loss", "high_entropy_mask", "Objective", "LossBatch", "sampling_importance_ratio", "vespo_phi",
           "VLLM_IS_MODES"]



def __getattr__(name: str):
    if name == "LOSS_TYPES":                 # the loss types the registered objective families answer
        return settings.loss_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


KL_FORMULAS = {
    "k3": "k3 = exp(ref−logp) − (ref−logp) − 1 (TRL)",
    "k1": "k1 = logp − ref",
    "k2": "k2 = ½(logp − ref)²",
    "full": "exact Σ_v π(v)·(log π(v) − log π_ref(v))",
}


@dataclass(frozen=True)
class Normalizer:
    """The effective denominator of the aggregation: `value` and a human-readable `description`."""
    name: str               # loss_type
    value: float            # effective denominator (tokens, sequences, or N·L_max), before ÷ g
    description: str        # e.g. "dapo: Σ mask = 312 tokens"

    def __str__(self) -> str:
        return self.description


@dataclass(frozen=True)
class LossBreakdown:
    """Every term of the GRPO loss, per token, per sequence, per group and in total.

    Tensors are detached except `loss`, `pg_loss`, `kl_loss`, `entropy_loss`, `entropy_term`
    (0-dim, differentiable). Per-token tensors are zero where completion_mask is 0 (except the ratio)."""
    # ---- totals (0-dim tensors; loss = pg_loss + kl_loss + entropy_term exactly)
    loss: torch.Tensor                  # () differentiable total
    pg_loss: torch.Tensor               # () agg(PG): policy-gradient term
    kl_loss: torch.Tensor               # () agg(β·KL): the KL penalty as it enters the loss (0 if β = 0)
    entropy_loss: torch.Tensor          # () H̄: entropy as TRL aggregates it (unscaled; 0 without entropy)
    entropy_term: torch.Tensor          # () −entropy_coef·H̄: the bonus as it enters the loss
    # ---- per token
    completion_mask: torch.Tensor       # (N, T) float mask used (after any masking)
    advantages: torch.Tensor            # (N,)
    per_token_pg: torch.Tensor          # (N, T) PG_it (sequence IS: broadcast over t; cispo/vespo/manual: ∝ ℓ_it), masked
    per_token_kl: Optional[torch.Tensor]  # (N, T) KL_it, raw (not β-scaled; × r if bias-corrected), masked; None without ref
    per_token_loss: torch.Tensor        # (N, T) L_it = PG_it + β·KL_it (TRL's per_token_loss), masked
    per_token_ratio: torch.Tensor       # (N, T) r = exp(log w) (sequence IS: broadcast), NOT masked
    per_token_entropy: Optional[torch.Tensor]  # (N, T) H_it masked; None without entropy
    is_clipped_low: torch.Tensor        # (N, T) bool: r < 1 − ε_low and A < 0 (masked)
    is_clipped_high: torch.Tensor       # (N, T) bool: r > 1 + ε_high and A > 0 (cispo: r > ε_high, A > 0), masked
    # ---- per sequence
    seq_len: torch.Tensor               # (N,) Σ_t m
    per_seq_pg: torch.Tensor            # (N,) contribution of row i to pg_loss (Σ_i = pg_loss)
    per_seq_kl_loss: torch.Tensor       # (N,) contribution of row i to kl_loss (Σ_i = kl_loss)
    per_seq_entropy_term: torch.Tensor  # (N,) contribution of row i to entropy_term
    per_seq_loss: torch.Tensor          # (N,) contribution of row i to loss
    per_seq_kl: Optional[torch.Tensor]  # (N,) masked mean KL_it per token (nats/token, not β-scaled)
    per_seq_entropy: Optional[torch.Tensor]  # (N,) masked mean entropy per token
    per_seq_ratio: torch.Tensor         # (N,) masked mean of r (sequence IS: the sequence ratio)
    per_seq_logp: torch.Tensor          # (N,) masked mean ℓ per token
    # ---- per group (None when num_generations is not given)
    per_group_pg: Optional[torch.Tensor]       # (B,) Σ over the group's rows of per_seq_pg
    per_group_kl_loss: Optional[torch.Tensor]  # (B,)
    per_group_loss: Optional[torch.Tensor]     # (B,)
    # ---- scalars and definitions
    kl: float                           # TRL `kl` metric: Σ m·KL / Σ m (raw; NaN without KL)
    entropy: float                      # TRL `entropy` metric: Σ m·H / Σ m (NaN without entropy)
    kl_share: float                     # |kl_loss| / (|pg_loss| + |kl_loss| + |entropy_term|); 0 if 0/0
    kl_share_undefined: bool            # True when that denominator is 0 (kl_share set to 0)
    normalizer: Normalizer              # effective denominator and its name
    metrics: dict                       # TRL-named: kl (whenever KL is available; TRL logs it only if β≠0),
                                        # entropy, clip_ratio/* (PPO loss types), policy_loss (if c_H≠0)
    loss_type: str
    beta: float
    epsilon_low: float
    epsilon_high: float
    delta: Optional[float]
    importance_sampling_level: str
    kl_estimator: str
    use_bias_correction_kl: bool
    entropy_coef: float
    gradient_accumulation_steps: int
    num_generations: Optional[int]
    definition: str                     # the formula, with this record's settings
    flags: tuple                        # human-readable warnings (non-finite values, empty completions…)
    # ---- TRL 1.16 options (defaults keep older saved traces loadable)
    off_policy_mask: Optional[torch.Tensor] = None  # (N,) bool: row kept by OPSM; None when OPSM is off
    entropy_mask: Optional[torch.Tensor] = None     # (N, T) bool: token kept by the entropy mask; None when off
    off_policy_mask_threshold: Optional[float] = None
    top_entropy_quantile: float = 1.0
    loss_params: dict = field(default_factory=dict)  # sapo temperatures / vespo (k, λ) used
    steps_per_generation: Optional[int] = None       # dapo/cispo/vespo normaliser rescale (None = g)
    importance_sampling_ratio: Optional[torch.Tensor] = None  # (N, T) | (N, 1) sampling-time IS weight ρ; None = off
    vllm_importance_sampling_mode: Optional[str] = None      # the correction's mode; None when off

    # aliases used by the update phase
    @property
    def pg_term(self) -> torch.Tensor:
        return self.pg_loss

    @property
    def kl_term(self) -> torch.Tensor:
        return self.kl_loss

    @property
    def totals(self) -> dict:
        """Plain floats of the totals, for tables."""
        return {"loss": float(self.loss), "pg_loss": float(self.pg_loss), "kl_loss": float(self.kl_loss),
                "entropy_loss": float(self.entropy_loss), "entropy_term": float(self.entropy_term),
                "kl": self.kl, "entropy": self.entropy, "kl_share": self.kl_share}


def _check_2d(name: str, x, shape) -> None:
    if x is None:
        return
    if not isinstance(x, torch.Tensor):
        raise ConfigError(name, f"must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ConfigError(name, f"shape {tuple(x.shape)} does not match per_token_logps {tuple(shape)} (N, T)")


def _scalar(x: Union[float, torch.Tensor, None]) -> Optional[float]:
    if x is None:
        return None
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


class _SmallCpuOps:
    """Run small CPU tensor math on one intra-op thread (restored afterwards). On a loaded 2-core machine
    the OpenMP/MKL thread hand-off dominates ops on ~10⁴ elements: torch.exp on (64, 128) measured 25 ms
    with 2 threads vs 0.01 ms with 1. Large or non-CPU tensors are left alone."""

    def __init__(self, x: torch.Tensor):
        self.active = x.device.type == "cpu" and x.numel() <= (1 << 20) and torch.get_num_threads() > 1
        self.prev = None

    def __enter__(self):
        if self.active:
            self.prev = torch.get_num_threads()
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self.prev is not None:
            torch.set_num_threads(self.prev)


def compute_loss(per_token_logps: torch.Tensor, old_per_token_logps: Optional[torch.Tensor],
                 ref_per_token_logps: Optional[torch.Tensor], advantages: torch.Tensor,
                 completion_mask: torch.Tensor, objective: Objective,
                 batch: Optional[LossBatch] = None) -> LossBreakdown:
    """TRL's GRPO loss for one micro-batch, decomposed. See the module docstring for every formula.

    per_token_logps (N, T) carries the gradient; old/ref logps (N, T) or None (old None → ℓ.detach(), TRL's
    on-policy case; ref may be None only when β = 0 or kl_estimator = "full"); advantages (N,);
    completion_mask (N, T) (bool/int/float). `objective` holds every knob (`Objective.from_config(config)`);
    `batch` what this call adds (grpo/objective/params.py): entropy (N, T) (c_H ≠ 0, ρ < 1), per_token_full_kl
    (N, T) for "full", sampling_per_token_logps (OPSM, IS correction; None → the old log-probs, as TRL without
    vLLM), num_items_in_batch = Σ mask over the whole batch (dapo; None → this micro-batch's Σ mask),
    num_generations (per-group values), gradient_accumulation_steps = TRL's g (÷ g for
    grpo/bnpo/dr_grpo/luspo/sapo/manual and H̄), steps_per_generation = TRL's (None = g): dapo/cispo/vespo
    divide by num_items_in_batch·g/steps_per_generation; the mini's per-step values (rlvr_mini).
    """
    if not isinstance(objective, Objective):
        raise ConfigError("objective", f"must be an Objective (Objective.from_config(config)), got "
                          f"{type(objective).__name__}")
    if batch is not None and not isinstance(batch, LossBatch):
        raise ConfigError("batch", f"must be a LossBatch or None, got {type(batch).__name__}")
    family = objective.family                               # resolved with the objective, not looked up again
    rule = family.rules[objective.loss_type]
    if family.loss is not None:                             # a family with its own loss (e.g. the rlvr mini)
        out = family.loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask,
                          objective, batch or LossBatch())
        if isinstance(out, LossBreakdown):
            return out
        checked(family, "loss", out, dict, "a LossBreakdown or its fields as a dict")
        return LossBreakdown(**{**out, "normalizer": Normalizer(*out["normalizer"])})
    if isinstance(per_token_logps, torch.Tensor):
        with _SmallCpuOps(per_token_logps):
            return _compute_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
                                 completion_mask, objective, batch or LossBatch(), rule, family)
    raise ConfigError("per_token_logps", "must be a 2-D (N, T) tensor")


def _compute_loss(logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask,
                  ob: Objective, b: LossBatch, rule: LossRule, family) -> LossBreakdown:
    """The loss type's row composed: weights → KL → objective → masks → aggregation → entropy bonus → records."""
    advantages = _validate(logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask, ob, b, rule)
    dtype = logps.dtype
    mask = completion_mask.to(dtype)                                            # (N, T)
    adv = advantages.to(device=logps.device, dtype=dtype).unsqueeze(1)          # (N, 1)
    old = logps.detach() if old_per_token_logps is None else old_per_token_logps.to(dtype)  # (N, T)
    bias_correction = ob.use_bias_correction_kl and rule.kl_bias_correction

    log_ratio, coef_1 = importance_weights(logps, old, mask, ob.importance_sampling_level)  # (N, T), r
    kl = per_token_kl(logps, ref_per_token_logps, b.per_token_full_kl, coef_1, estimator=ob.kl_estimator,
                      bias_correction=bias_correction)                                     # (N, T) | None
    loss_params = {k: float(getattr(ob, k)) for k in rule.params}
    masks = _masks(adv, logps, old, mask, ob, b)
    pol = rule.objective(ObjectiveInputs(logps, adv, log_ratio, coef_1, mask, ob.epsilon_low, ob.epsilon_high, ob.delta,
                                    loss_params, masks.is_ratio))
    checked(family, f"{ob.loss_type} objective", pol, PolicyTerm, "a PolicyTerm")   # names the family and hook
    per_token_pg = masks.apply(pol.per_token_pg, rule.sampling_ratio_inside)    # (N, T) | (N, 1)
    agg = checked(family, f"{ob.loss_type} aggregation",
                  rule.aggregation(AggregationInputs(mask, ob.loss_type, b.gradient_accumulation_steps,
                                                     ob.max_completion_length, b.num_items_in_batch,
                                                     b.steps_per_generation)), Aggregation, "an Aggregation")

    norm = Normalizer(ob.loss_type, agg.denominator, agg.description)
    kl_active = ob.beta != 0.0 and kl is not None
    zero = torch.zeros((), dtype=dtype, device=logps.device)
    pg_loss = agg.reduce(per_token_pg)                                          # ()
    kl_loss = agg.reduce(ob.beta * kl) if kl_active else zero                    # ()
    ent = None if b.entropy is None else entropy_bonus(
        b.entropy, mask, masks.entropy, entropy_coef=ob.entropy_coef, g=float(b.gradient_accumulation_steps),
        per_sequence=rule.entropy == "sequences")
    entropy_loss, entropy_term = (zero, zero) if ent is None else (ent.entropy_loss, ent.entropy_term)
    loss = pg_loss + kl_loss + entropy_term                                     # ()

    with torch.no_grad():
        rec = _records(logps, mask, per_token_pg, kl, coef_1, pol, agg, ent, ob, b, kl_active)
        metrics = _metrics(rec, mask, pol, ob, b, pg_loss, kl_loss, rule)
        if masks.is_ratio is not None:
            metrics.update(sampling_ratio_metrics(masks.is_ratio, old, b.sampling_per_token_logps.to(dtype), mask))
        kl_share, undefined = _kl_share(pg_loss, kl_loss, entropy_term)
        flags = _flags(loss, mask, logps, old_per_token_logps, ref_per_token_logps, advantages, rec, ob, b, undefined)
    return LossBreakdown(
        loss=loss, pg_loss=pg_loss, kl_loss=kl_loss, entropy_loss=entropy_loss, entropy_term=entropy_term,
        completion_mask=mask.detach(), advantages=advantages.detach(), **rec,
        kl=metrics.pop("_kl"), entropy=metrics.pop("_entropy"), kl_share=kl_share, kl_share_undefined=undefined,
        normalizer=norm, metrics=metrics, loss_type=ob.loss_type, beta=float(ob.beta),
        epsilon_low=float(ob.epsilon_low), epsilon_high=float(ob.epsilon_high), delta=_scalar(ob.delta),
        importance_sampling_level=ob.importance_sampling_level, kl_estimator=ob.kl_estimator,
        use_bias_correction_kl=bool(bias_correction and ob.kl_estimator != "full"),
        entropy_coef=float(ob.entropy_coef), gradient_accumulation_steps=int(b.gradient_accumulation_steps),
        num_generations=b.num_generations,
        definition=_definition(ob, rule, norm, loss_params, _is_mode(ob, b, masks)),
        flags=flags,
        off_policy_mask=None if masks.off_policy is None else (masks.off_policy.squeeze(1) > 0).detach(),
        entropy_mask=None if masks.entropy is None else masks.entropy.detach(),
        off_policy_mask_threshold=_scalar(ob.off_policy_mask_threshold),
        top_entropy_quantile=float(ob.top_entropy_quantile), loss_params=loss_params,
        steps_per_generation=b.steps_per_generation, importance_sampling_ratio=masks.is_ratio,
        vllm_importance_sampling_mode=_is_mode(ob, b, masks))


def _validate(logps, old, ref, advantages, completion_mask, ob: Objective, b: LossBatch, rule: LossRule) -> torch.Tensor:
    """Named errors for every input compute_loss cannot take; returns the advantages as an (N,) tensor."""
    if not isinstance(logps, torch.Tensor) or logps.dim() != 2:
        raise ConfigError("per_token_logps", "must be a 2-D (N, T) tensor")
    if not logps.is_floating_point():
        raise ConfigError("per_token_logps", f"must be floating point, got {logps.dtype}")
    N, T = logps.shape
    for name, x in (("old_per_token_logps", old), ("ref_per_token_logps", ref),
                    ("completion_mask", completion_mask), ("entropy", b.entropy),
                    ("per_token_full_kl", b.per_token_full_kl),
                    ("sampling_per_token_logps", b.sampling_per_token_logps)):
        _check_2d(name, x, (N, T))
    if completion_mask is None:
        raise ConfigError("completion_mask", "is required")
    if not isinstance(advantages, torch.Tensor):
        advantages = torch.as_tensor(advantages)
    if advantages.dim() == 2 and advantages.shape[1] == 1:
        advantages = advantages.squeeze(1)
    if tuple(advantages.shape) != (N,):
        raise ConfigError("advantages", f"shape {tuple(advantages.shape)} must be (N,) = ({N},)")
    _validate_options(N, ref, ob, b)
    if rule.check is not None:
        rule.check(ob)                                      # the loss type's own knobs (e.g. dr_grpo's L_max)
    return advantages


def _validate_options(N: int, ref, ob: Objective, b: LossBatch) -> None:
    for name, allowed in (("kl_estimator", KL_ESTIMATORS),
                          ("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS)):
        if getattr(ob, name) not in allowed:
            raise ConfigError(name, f"unknown value {getattr(ob, name)!r}; expected one of {list(allowed)}")
    if ob.beta < 0:
        raise ConfigError("beta", f"must be ≥ 0, got {ob.beta!r}")
    if ob.epsilon_low < 0 or ob.epsilon_high < 0:
        raise ConfigError("epsilon_low" if ob.epsilon_low < 0 else "epsilon_high", "must be ≥ 0")
    if ob.delta is not None and not ob.delta > 0:
        raise ConfigError("delta", f"must be > 0 or None, got {ob.delta!r}")
    if b.gradient_accumulation_steps < 1:
        raise ConfigError("gradient_accumulation_steps", f"must be ≥ 1, got {b.gradient_accumulation_steps!r}")
    if b.num_generations is not None and (b.num_generations < 1 or N % b.num_generations):
        raise ConfigError("num_generations", f"{b.num_generations!r} does not divide N = {N}")
    if ob.entropy_coef != 0 and b.entropy is None:
        raise ConfigError("entropy", f"entropy_coef={ob.entropy_coef} needs the per-token entropy tensor")
    if not 0.0 <= ob.top_entropy_quantile <= 1.0:
        raise ConfigError("top_entropy_quantile", f"must be in [0, 1], got {ob.top_entropy_quantile!r}")
    if ob.top_entropy_quantile < 1.0 and b.entropy is None:
        raise ConfigError("entropy", f"top_entropy_quantile={ob.top_entropy_quantile} needs the per-token entropy")
    if ob.off_policy_mask_threshold is not None and not ob.off_policy_mask_threshold >= 0:
        raise ConfigError("off_policy_mask_threshold", f"must be ≥ 0 or None, got {ob.off_policy_mask_threshold!r}")
    if b.steps_per_generation is not None and b.steps_per_generation < 1:
        raise ConfigError("steps_per_generation", f"must be ≥ 1 or None, got {b.steps_per_generation!r}")
    _validate_sampling_correction(ob, b)
    if ob.kl_estimator == "full":
        if b.per_token_full_kl is None and (ob.beta != 0 or ref is not None):
            raise ConfigError("per_token_full_kl", "kl_estimator='full' needs the exact per-token full-vocab KL")
    elif ob.beta != 0 and ref is None:
        raise ConfigError("ref_per_token_logps", f"beta={ob.beta} needs the reference log-probs")


def _validate_sampling_correction(ob: Objective, b: LossBatch) -> None:
    if not ob.vllm_importance_sampling_correction:
        return
    mode = ob.vllm_importance_sampling_mode
    lo, hi = ob.vllm_importance_sampling_clip_min, ob.vllm_importance_sampling_clip_max
    if mode not in VLLM_IS_MODES:
        raise ConfigError("vllm_importance_sampling_mode", f"unknown value {mode!r}; expected one of "
                          f"{list(VLLM_IS_MODES)}")
    if mode.endswith("truncate") and lo is None and hi is None:
        raise ConfigError("vllm_importance_sampling_clip_max", f"{mode} needs a bound (clip_min or clip_max)")
    if lo is not None and hi is not None and not lo <= hi:
        raise ConfigError("vllm_importance_sampling_clip_min", f"must be ≤ clip_max = {hi!r}, got {lo!r}")


def _is_mode(ob: Objective, b: LossBatch, masks: Masks) -> Optional[str]:
    """The sampling-correction mode in effect (None when off or without sampling log-probs)."""
    return None if masks.is_ratio is None else ob.vllm_importance_sampling_mode


def _masks(adv, logps, old, mask, ob: Objective, b: LossBatch) -> Masks:
    """OPSM (against the sampling log-probs, else the old ones, as TRL without vLLM), the entropy mask and
    the sampling-time IS weight ρ (needs the sampling log-probs)."""
    opsm = ent_mask = is_ratio = None
    if ob.off_policy_mask_threshold is not None:
        sampling = old if b.sampling_per_token_logps is None else b.sampling_per_token_logps.to(logps.dtype)
        opsm = off_policy_sequence_mask(adv, logps, sampling, mask, ob.off_policy_mask_threshold)  # (N, 1)
    if ob.top_entropy_quantile < 1.0:
        ent_mask = high_entropy_mask(b.entropy, mask, 1 - ob.top_entropy_quantile)  # (N, T) bool
    if ob.vllm_importance_sampling_correction and b.sampling_per_token_logps is not None:
        is_ratio = sampling_importance_ratio(
            old.detach(), b.sampling_per_token_logps.to(logps.dtype), mask, mode=ob.vllm_importance_sampling_mode,
            clip_min=ob.vllm_importance_sampling_clip_min, clip_max=ob.vllm_importance_sampling_clip_max)
    return Masks(off_policy=opsm, entropy=ent_mask, is_ratio=is_ratio)


def _records(logps, mask, per_token_pg, kl, coef_1, pol: PolicyTerm, agg: Aggregation, ent, ob: Objective, b: LossBatch,
             kl_active: bool) -> dict:
    """The detached per-token, per-sequence and per-group fields of LossBreakdown (no grad)."""
    N, T = logps.shape
    dtype = logps.dtype
    m_bool = mask > 0                                                           # (N, T)
    seq_len = mask.sum(-1)                                                      # (N,)
    seq_len_c = seq_len.clamp(min=1.0)                                          # (N,)
    pt_pg = (per_token_pg.expand(N, T) * mask).detach()                         # (N, T)
    pt_kl = (kl.expand(N, T) * mask).detach() if kl is not None else None       # (N, T)
    pt_loss = pt_pg + ob.beta * pt_kl if kl_active else pt_pg.clone()            # (N, T)
    ratio = coef_1.detach().expand(N, T).clone()                                # (N, T)
    w = agg.row_weights.to(dtype)                                               # (N,)
    zeros = torch.zeros(N, dtype=dtype, device=logps.device)                    # (N,)
    per_seq_pg = pt_pg.sum(-1) * w                                              # (N,)
    per_seq_kl_loss = ob.beta * pt_kl.sum(-1) * w if kl_active else zeros        # (N,)
    per_seq_ent = zeros if ent is None else ent.per_seq_entropy_term            # (N,)
    per_seq_loss = per_seq_pg + per_seq_kl_loss + per_seq_ent                   # (N,)
    per_token_entropy = None if ent is None else ent.per_token_entropy          # (N, T)
    if b.num_generations:
        per_group = [x.view(-1, b.num_generations).sum(1) for x in (per_seq_pg, per_seq_kl_loss, per_seq_loss)]
    else:
        per_group = [None, None, None]
    return dict(
        per_token_pg=pt_pg, per_token_kl=pt_kl, per_token_loss=pt_loss, per_token_ratio=ratio,
        per_token_entropy=per_token_entropy,
        is_clipped_low=pol.is_low.expand(N, T) & m_bool, is_clipped_high=pol.is_high.expand(N, T) & m_bool,
        seq_len=seq_len.detach(), per_seq_pg=per_seq_pg, per_seq_kl_loss=per_seq_kl_loss,
        per_seq_entropy_term=per_seq_ent, per_seq_loss=per_seq_loss,
        per_seq_kl=pt_kl.sum(-1) / seq_len_c if pt_kl is not None else None,
        per_seq_entropy=per_token_entropy.sum(-1) / seq_len_c if per_token_entropy is not None else None,
        per_seq_ratio=(ratio * mask).sum(-1) / seq_len_c, per_seq_logp=(logps.detach() * mask).sum(-1) / seq_len_c,
        per_group_pg=per_group[0], per_group_kl_loss=per_group[1], per_group_loss=per_group[2])


def _metrics(rec: dict, mask, pol: PolicyTerm, ob: Objective, b: LossBatch, pg_loss, kl_loss, rule: LossRule) -> dict:
    """TRL-named metrics, exactly as TRL logs them (num_processes = 1), plus "_kl"/"_entropy" (the
    record's always-present values, popped by the caller)."""
    pt_kl, per_token_entropy = rec["per_token_kl"], rec["per_token_entropy"]
    denom_tok = mask.sum().clamp(min=1.0)
    metrics = {"_kl": float(pt_kl.sum() / denom_tok) if pt_kl is not None else float("nan"),
               "_entropy": float(per_token_entropy.sum() / denom_tok) if per_token_entropy is not None
               else float("nan")}
    if pt_kl is not None:
        metrics["kl"] = metrics["_kl"]                                          # TRL logs it only when β ≠ 0
    if per_token_entropy is not None:
        metrics["entropy"] = metrics["_entropy"]
    if rule.metrics is not None:
        metrics.update(rule.metrics(pol, mask))                                 # e.g. TRL's clip_ratio/*
    if b.entropy is not None and ob.entropy_coef != 0:
        per_g = 1.0 if rule.global_normaliser else float(b.gradient_accumulation_steps)
        metrics["policy_loss"] = float((pg_loss + kl_loss) * per_g)
    return metrics


def _kl_share(pg_loss, kl_loss, entropy_term) -> tuple[float, bool]:
    """|kl_loss| / (|pg_loss| + |kl_loss| + |entropy_term|), and whether that is 0/0 (then 0)."""
    a_kl, a_pg, a_ent = abs(float(kl_loss)), abs(float(pg_loss)), abs(float(entropy_term))
    share_den = a_pg + a_kl + a_ent
    undefined = not share_den > 0
    return (0.0 if undefined else a_kl / share_den), undefined


def _flags(loss, mask, logps, old, ref, advantages, rec: dict, ob: Objective, b: LossBatch,
           kl_share_undefined: bool) -> tuple:
    """Human-readable warnings: non-finite values at unmasked positions, empty completions, 0/0 shares."""
    flags = []
    m_bool = mask > 0                                                           # (N, T)
    if not math.isfinite(float(loss)):
        flags.append(f"non-finite loss ({float(loss)}): the optimizer step must refuse")
    for name, x in (("per_token_logps", logps), ("old_per_token_logps", old), ("ref_per_token_logps", ref),
                    ("entropy", b.entropy), ("per_token_full_kl", b.per_token_full_kl)):
        if x is not None:
            bad = int((~torch.isfinite(x.detach()) & m_bool).sum())
            if bad:
                flags.append(f"{bad} non-finite value(s) in {name} at unmasked positions")
    if not bool(torch.isfinite(advantages).all()):
        flags.append("non-finite advantages")
    empty = tuple(int(i) for i in torch.nonzero(rec["seq_len"] == 0).flatten())
    if empty:
        flags.append(f"{len(empty)} completion(s) fully masked (rows {list(empty)}): no loss contribution")
    if kl_share_undefined:
        flags.append("kl_share undefined (all terms are 0): reported as 0")
    if ob.vllm_importance_sampling_correction and b.sampling_per_token_logps is None:
        flags.append("vllm_importance_sampling_correction is on but no sampling log-probs were given: ρ = 1 "
                     "(no correction)")
    return tuple(flags)


def _definition(ob: Objective, rule: LossRule, norm, params: dict, is_mode: Optional[str]) -> str:
    """The formula with this call's settings (LossBreakdown.definition)."""
    est, coef = ob.kl_estimator, ob.entropy_coef
    opsm, rho = ob.off_policy_mask_threshold, ob.top_entropy_quantile
    r = "r_it = exp(logp − old)" if ob.importance_sampling_level == "token" else "r_i = exp(mean_t(logp − old))"
    pg = rule.text(ob, params, r)
    bias = ob.use_bias_correction_kl and rule.kl_bias_correction and est != "full"
    kl = f"KL_it = {KL_FORMULAS[est]}" + (" × r" if bias else "")
    ent = f"; − {coef:g}·H̄" if coef else ""
    masks = (f"; PG × OPSM (drop A < 0 rows with mean(old − logp) > {opsm:g})" if opsm is not None else "") + \
        (f"; PG × entropy mask (top {rho:g} of tokens by entropy)" if rho < 1 else "") + \
        (f"; PG × ρ (sampling-time IS, {is_mode})" if is_mode else "")
    return f"{pg}{masks}; L = PG + {ob.beta:g}·KL, {kl}; aggregated by {norm}{ent}"
