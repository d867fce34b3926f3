"""`loss_type="rlvr_mini"`: rookworld-rlvr's objective composed from its terms into a LossBreakdown.

Shape legend: N rows, T completion tokens; ℓ = per_token_logps (N, T, grad), ℓ_ref (N, T), m = completion mask,
A (N,). The math is `grpo.families.rlvr_mini.objective` (checked against the mini's golden numbers); this module only fills the
record every view reads:

    s_i = Σ_t m(ℓ − ℓ_ref)  (÷ |o_i| with rlvr_length_normalize)   r_i = exp(clamp(s_i, ±20))
    pg_loss     = mean_i PG_i,  PG_i = −min(r_i A_i, clip(r_i) A_i)          rlvr_sequence_surrogate
    kl_loss     = β · mean_i KL_i  (forward / reverse / symmetric surrogate, β = the step's kl_coef)
    entropy_term = −c_H · mean_i Σ_t −m e^ℓ ℓ                                 (the mini's entropy surrogate)
    loss        = pg_loss + kl_loss + entropy_term (+ value_loss_coef · mean (v − v̂)² when values are given)

Per-token records: per_token_pg spreads PG_i evenly over the row's tokens (PG_i/|o_i| each, so rows sum to
PG_i); per_token_kl is the surrogate's per-token term; per_token_ratio is r_i broadcast. The mini's own
metrics (its names, e.g. its `clipped_frac`, which counts rows outside [1 − ε, 1 + ε] whatever the sign of A)
are in `metrics["rlvr/..."]`; `clip_ratio/*` are the rows where the clip binds (TRL's definition).
"""
from __future__ import annotations

import math

import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.families.rlvr_mini.objective import (KL_TYPE_FORMULAS, clipped_sequence_surrogate,
                                                                mini_metrics, mini_terms, per_token_kl_terms,
                                                                row_sum_mean)
from rookworld_debug.grpo.families.rlvr_mini.settings import MiniSettings
from rookworld_debug.grpo.objective.aggregation import AggregationInputs
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.objective.terms import ObjectiveInputs, PolicyTerm


def rlvr_sequence_surrogate(x: ObjectiveInputs) -> PolicyTerm:
    """rlvr_mini: one PPO term per SEQUENCE, its ratio against the REFERENCE (coef_1 = r_i (N, 1)):
        PG_i = −min(r_i·A_i, clip(r_i, 1 − ε_low, 1 + ε_high)·A_i),  r_i = exp(clamp(Σ_t m(ℓ − ℓ_ref), ±20))
    clipped low: r < 1 − ε_low and A < 0; high: r > 1 + ε_high and A > 0 (where the clip binds)."""
    r, adv = x.coef_1, x.adv                                                    # (N, 1) each
    pg = clipped_sequence_surrogate(r, adv, x.epsilon_low, x.epsilon_high)      # (N, 1)
    return PolicyTerm(pg, (r < 1 - x.epsilon_low) & (adv < 0), (r > 1 + x.epsilon_high) & (adv > 0))


def knobs(objective) -> MiniSettings:
    """The mini's settings: an Objective's section (its defaults when it carries none) or a StepConfig's."""
    if isinstance(objective, Objective):
        return objective.settings if isinstance(objective.settings, MiniSettings) else MiniSettings()
    return objective.section(MiniSettings.SECTION)


def effective_mask(mask: torch.Tensor, length_normalize: bool) -> torch.Tensor:
    """m, or m/|o_i| (per-token means instead of sums)."""
    return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) if length_normalize else mask


def compute_rlvr_loss(logps: torch.Tensor, ref, advantages: torch.Tensor, completion_mask: torch.Tensor,
                      ob: Objective, b: LossBatch) -> dict:
    """The fields of the mini's LossBreakdown (loss.compute_loss builds the record for loss_type 'rlvr_mini';
    `normalizer` comes as (name, value, description))."""
    k = knobs(ob)
    opts = {"rlvr_kl_type": k.rlvr_kl_type, "rlvr_length_normalize": k.rlvr_length_normalize, "values": b.values,
            "value_targets": b.value_targets, "value_loss_coef": k.rlvr_value_loss_coef}
    adv = _validate(logps, ref, advantages, completion_mask, ob, b)
    dtype = logps.dtype
    mask = completion_mask.to(dtype)                                                  # (N, T)
    ref = ref.to(dtype)                                                               # (N, T)
    m_eff = effective_mask(mask, opts["rlvr_length_normalize"])                       # (N, T)
    kl_type, beta, c_h = opts["rlvr_kl_type"], float(ob.beta), float(ob.entropy_coef)
    t = mini_terms(logps, ref, adv, m_eff, kl_coef=beta, eps_low=ob.epsilon_low, eps_high=ob.epsilon_high,
                   kl_type=kl_type, entropy_coef=c_h, values=opts["values"], value_targets=opts["value_targets"],
                   value_loss_coef=opts["value_loss_coef"])
    objective, aggregation = rlvr_sequence_surrogate, row_sum_mean
    s = (m_eff * (logps - ref)).sum(-1, keepdim=True)                                 # (N, 1)
    r = torch.exp(torch.clamp(s, -20.0, 20.0))                                        # (N, 1)
    pol = objective(ObjectiveInputs(logps, adv.unsqueeze(1), logps - ref, r, mask, ob.epsilon_low, ob.epsilon_high,
                                    None, {}))
    agg = aggregation(AggregationInputs(mask, ob.loss_type, b.gradient_accumulation_steps, ob.max_completion_length,
                                        None, None))
    g = float(b.gradient_accumulation_steps)
    pg_loss = agg.reduce(pol.per_token_pg)                                            # () = t.pg_loss / g
    kl_loss = beta * t.kl_div / g
    entropy_term = (t.entropy_loss if c_h > 0 else torch.zeros((), dtype=dtype)) / g
    loss = pg_loss + kl_loss + entropy_term + opts["value_loss_coef"] * t.value_loss / g
    with torch.no_grad():
        rec = _records(logps.detach(), ref, mask, m_eff, t, pol, kl_type, beta, c_h, g, b.num_generations)
        metrics = {f"rlvr/{k}": v for k, v in mini_metrics(t, logps.detach(), ref, adv, m_eff, kl_coef=beta,
                                                            eps_low=ob.epsilon_low, eps_high=ob.epsilon_high).items()}
        metrics.update(_binding_clip(pol, mask))
        if b.k1_observation is not None:           # what the KL controller saw before the loss
            metrics["rlvr/k1_observation"] = float(b.k1_observation)
        metrics["kl"] = float(rec["per_token_kl"].sum() / mask.sum().clamp(min=1.0))
        metrics["entropy"] = float(rec["per_token_entropy"].sum() / mask.sum().clamp(min=1.0))
        share, undefined = _kl_share(pg_loss, kl_loss, entropy_term)
        flags = _flags(loss, mask, logps, ref, adv, rec["seq_len"], undefined)
    norm = agg.description
    lnorm = " (÷ |o_i|: rlvr_length_normalize)" if opts["rlvr_length_normalize"] else " (summed, not averaged)"
    definition = (f"r_i = exp(clamp(Σ_t (logp − ref){lnorm}, ±20)) against the REFERENCE; PG = −mean_i min(r_i·A_i, "
                  f"clip(r_i, {1 - ob.epsilon_low:g}, {1 + ob.epsilon_high:g})·A_i); + {beta:g}·mean_i KL_i, "
                  f"KL_i = {KL_TYPE_FORMULAS[kl_type]}" + (f"; − {c_h:g}·mean_i Σ_t −e^logp·logp" if c_h else "")
                  + f"; aggregated by {norm}")
    return dict(
        loss=loss, pg_loss=pg_loss, kl_loss=kl_loss, entropy_loss=t.entropy / g, entropy_term=entropy_term,
        completion_mask=mask.detach(), advantages=adv.detach(), **rec, kl=metrics["kl"], entropy=metrics["entropy"],
        kl_share=share, kl_share_undefined=undefined, normalizer=("rlvr_mini", agg.denominator, norm), metrics=metrics,
        loss_type="rlvr_mini",
        beta=beta, epsilon_low=float(ob.epsilon_low), epsilon_high=float(ob.epsilon_high), delta=None,
        importance_sampling_level="sequence", kl_estimator=f"rlvr_{kl_type}", use_bias_correction_kl=False,
        entropy_coef=c_h, gradient_accumulation_steps=int(b.gradient_accumulation_steps),
        num_generations=b.num_generations, definition=definition, flags=flags,
        loss_params={"rlvr_kl_type": kl_type, "rlvr_length_normalize": bool(opts["rlvr_length_normalize"])})


def _validate(logps, ref, advantages, completion_mask, ob, b) -> torch.Tensor:
    if not isinstance(logps, torch.Tensor) or logps.dim() != 2 or not logps.is_floating_point():
        raise ConfigError("per_token_logps", "must be a 2-D floating (N, T) tensor")
    if ref is None:
        raise ConfigError("ref_per_token_logps", "loss_type='rlvr_mini' needs the reference log-probs (its ratio "
                          "and KL are against the reference)")
    if tuple(ref.shape) != tuple(logps.shape) or tuple(completion_mask.shape) != tuple(logps.shape):
        raise ConfigError("ref_per_token_logps", f"shapes {tuple(ref.shape)} / {tuple(completion_mask.shape)} must "
                          f"equal per_token_logps {tuple(logps.shape)}")
    adv = torch.as_tensor(advantages).to(device=logps.device, dtype=logps.dtype).reshape(-1)
    if adv.shape[0] != logps.shape[0]:
        raise ConfigError("advantages", f"shape {tuple(adv.shape)} must be (N,) = ({logps.shape[0]},)")
    if ob.beta < 0 or ob.epsilon_low < 0 or ob.epsilon_high < 0:
        raise ConfigError("beta" if ob.beta < 0 else "epsilon_low", "must be ≥ 0")
    if b.num_generations is not None and (b.num_generations < 1 or logps.shape[0] % b.num_generations):
        raise ConfigError("num_generations", f"{b.num_generations!r} does not divide N = {logps.shape[0]}")
    return adv


def _kl_share(pg_loss, kl_loss, entropy_term) -> tuple[float, bool]:
    """|kl_loss| / (|pg_loss| + |kl_loss| + |entropy_term|) and whether that is 0/0 (as loss.py's)."""
    a = [abs(float(x)) for x in (pg_loss, kl_loss, entropy_term)]
    den = sum(a)
    return (a[1] / den if den > 0 else 0.0), not den > 0


def _flags(loss, mask, logps, ref, adv, seq_len, kl_share_undefined: bool) -> tuple:
    """The loss phase's warnings for this objective (non-finite values, empty rows, 0/0 share)."""
    flags = []
    if not math.isfinite(float(loss)):
        flags.append(f"non-finite loss ({float(loss)}): the optimizer step must refuse")
    for name, x in (("per_token_logps", logps), ("ref_per_token_logps", ref)):
        bad = int((~torch.isfinite(x.detach()) & (mask > 0)).sum())
        if bad:
            flags.append(f"{bad} non-finite value(s) in {name} at unmasked positions")
    if not bool(torch.isfinite(adv).all()):
        flags.append("non-finite advantages")
    empty = [int(i) for i in torch.nonzero(seq_len == 0).flatten()]
    if empty:
        flags.append(f"{len(empty)} completion(s) fully masked (rows {empty}): the mini still counts −A_i for them")
    if kl_share_undefined:
        flags.append("kl_share undefined (all terms are 0): reported as 0")
    return tuple(flags)


def _records(p, q, mask, m_eff, t, pol, kl_type: str, beta: float, c_h: float, g: float, num_generations) -> dict:
    N, T = p.shape
    seq_len = mask.sum(-1)                                                            # (N,)
    seq_len_c = seq_len.clamp(min=1.0)                                                # (N,)
    pt_pg = t.per_seq_pg[:, None] * mask / seq_len_c[:, None]                         # (N, T) Σ_t = PG_i
    pt_kl = per_token_kl_terms(p, q, kl_type) * m_eff                                 # (N, T)
    pt_ent = (-torch.exp(p) * p) * m_eff                                              # (N, T)
    per_seq_pg = t.per_seq_pg / (N * g)                                               # (N,)
    per_seq_kl_loss = beta * t.per_seq_kl / (N * g)                                   # (N,)
    per_seq_ent = (-c_h * t.per_seq_entropy / (N * g)) if c_h > 0 else torch.zeros_like(per_seq_pg)
    per_seq_loss = per_seq_pg + per_seq_kl_loss + per_seq_ent
    group = [x.view(-1, num_generations).sum(1) if num_generations else None
             for x in (per_seq_pg, per_seq_kl_loss, per_seq_loss)]
    ratio = t.ratio[:, None].expand(N, T).clone()                                     # (N, T)
    m_bool = mask > 0                                                                 # (N, T)
    return dict(
        per_token_pg=pt_pg, per_token_kl=pt_kl, per_token_loss=pt_pg + beta * pt_kl, per_token_ratio=ratio,
        per_token_entropy=pt_ent, is_clipped_low=pol.is_low.expand(N, T) & m_bool,
        is_clipped_high=pol.is_high.expand(N, T) & m_bool, seq_len=seq_len,
        per_seq_pg=per_seq_pg, per_seq_kl_loss=per_seq_kl_loss, per_seq_entropy_term=per_seq_ent,
        per_seq_loss=per_seq_loss, per_seq_kl=pt_kl.sum(-1) / seq_len_c, per_seq_entropy=pt_ent.sum(-1) / seq_len_c,
        per_seq_ratio=t.ratio.clone(), per_seq_logp=(p * mask).sum(-1) / seq_len_c,
        per_group_pg=group[0], per_group_kl_loss=group[1], per_group_loss=group[2])


def _binding_clip(pol, mask) -> dict:
    """Rows where the clip binds (TRL's clip_ratio definition, counted per row: the ratio is per sequence)."""
    low, high = pol.is_low.float().flatten(), pol.is_high.float().flatten()
    n = max(float(low.numel()), 1.0)
    return {"clip_ratio/low_mean": float(low.sum() / n), "clip_ratio/high_mean": float(high.sum() / n),
            "clip_ratio/region_mean": float((low + high).clamp(max=1).sum() / n),
            "clip_ratio/low_min": float(low.min()) if low.numel() else math.nan,
            "clip_ratio/high_max": float(high.max()) if high.numel() else math.nan}


def step_kl_coef(logps: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, objective) -> tuple[float, float]:
    """(kl_coef used by this step, the k1 observation): a fresh AdaptiveKLController(β, target, horizon) updated
    once with mean_i Σ_t m(ℓ − ℓ_ref), before the loss, as the mini does; β itself when rlvr_adaptive_kl is off.
    `objective`: an Objective (or a StepConfig: the same names)."""
    from rookworld_debug.grpo.families.rlvr_mini.baselines import AdaptiveKLController, k1_observation
    obs = k1_observation(logps.detach().double(), ref.double(), mask.double())
    k = knobs(objective)
    if not k.rlvr_adaptive_kl:
        return float(objective.beta), obs
    ctl = AdaptiveKLController(objective.beta, k.rlvr_kl_target, k.rlvr_kl_horizon)
    return ctl.update(obs), obs


def rlvr_step(rollout, advantages, objective, mask: torch.Tensor) -> tuple:
    """(Objective, LossBatch fields) of one rlvr_mini step: the controlled kl_coef replaces β; the values (the
    rewards, with rlvr_values='rewards') and the controller's observation go with the batch."""
    beta, obs = step_kl_coef(rollout.per_token_logps, rollout.ref_per_token_logps, mask, objective)
    extra = {"k1_observation": obs}
    if knobs(objective).rlvr_values == "rewards":
        r = torch.nan_to_num(advantages.rewards.to(rollout.per_token_logps.dtype), nan=0.0)
        extra.update(values=r, value_targets=r)
    return objective.replace(beta=beta), extra
