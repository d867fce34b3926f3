"""TRL 1.16's GRPOTrainer as an objective family: its eight loss types as rows of the loss table, its advantages.

    loss_type  per-token objective   aggregation          micro-batch weighting   metrics
    grpo       clipped_surrogate     sequence_mean        rows                    clip_ratio/*
    bnpo       clipped_surrogate     batch_token_mean     tokens                  clip_ratio/*
    dr_grpo    clipped_surrogate     fixed_length         rows                    clip_ratio/*
    dapo       clipped_surrogate     global_token_mean    global                  clip_ratio/*
    luspo      clipped_surrogate     sequence_sum_mean    rows                    clip_ratio/*
    cispo      cispo                 global_token_mean    global                  cispo_clip_ratio
    sapo       sapo_gate             sequence_mean        rows                    -
    vespo      vespo                 global_token_mean    global                  vespo/phi_seq_mean

The entropy bonus is a token mean of the micro-batch for every loss type (so its weighting is by tokens).
Formulas: grpo/objective/loss.py's module docstring; the terms: grpo/objective/terms.py.
"""
from __future__ import annotations

import dataclasses

import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.registry import Family, LossRule, register
from rookworld_debug.grpo.objective.aggregation import (batch_token_mean, fixed_length, global_token_mean,
                                                        sequence_mean, sequence_sum_mean)
from rookworld_debug.grpo.objective.terms import cispo, clipped_surrogate, sapo_gate, vespo
from rookworld_debug.grpo.phases.advantages import compute_advantages

# the loss-specific knobs each objective reads (recorded in LossBreakdown.loss_params)
SAPO_PARAMS = ("sapo_temperature_pos", "sapo_temperature_neg")
VESPO_PARAMS = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


def trl_advantages(rewards, config):
    """TRL's group-relative advantages with the config's knobs."""
    return compute_advantages(rewards, config.num_generations, scale_rewards=config.scale_rewards,
                              eps=config.adv_eps, std_ddof=config.std_ddof, clip=config.adv_clip)


# ---------------------------------------------------------------- metrics (TRL's names, one process)
def global_masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """TRL's global_masked_mean (one process): a (N, 1) tensor counts sequences, (N, T) masked tokens."""
    if x.shape[1] == 1:
        return float(x.sum() / max(float(x.shape[0]), 1.0))
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def clip_metrics(pol, mask: torch.Tensor) -> dict:
    """TRL's clip_ratio/* metrics (global_masked_mean / masked_seq_mean + nanmin/nanmax)."""
    def masked_seq_mean(x):
        if x.shape[1] == 1:
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)                                # NaN for empty rows (TRL)

    def nan_reduce(x, fn):
        x = x[~torch.isnan(x)]
        return float(fn(x)) if x.numel() else float("nan")

    mask = mask.float()                                                         # TRL: bool.float() → float32
    low, high = pol.is_low.float(), pol.is_high.float()
    region = (pol.is_low | pol.is_high).float()
    return {
        "clip_ratio/low_mean": global_masked_mean(low, mask),
        "clip_ratio/high_mean": global_masked_mean(high, mask),
        "clip_ratio/region_mean": global_masked_mean(region, mask),
        "clip_ratio/low_min": nan_reduce(masked_seq_mean(low), torch.min),
        "clip_ratio/high_max": nan_reduce(masked_seq_mean(high), torch.max),
    }


def _cispo_metrics(pol, mask):
    return {"cispo_clip_ratio": global_masked_mean(pol.is_high.float(), mask.float())}   # TRL: .float()


def _vespo_metrics(pol, mask):
    return {"vespo/phi_seq_mean": global_masked_mean(pol.phi_seq, mask)}


# ---------------------------------------------------------------- knob checks TRL makes for one loss type
def _check_dr_grpo(ob) -> None:
    if not (ob.max_completion_length and ob.max_completion_length > 0):
        raise ConfigError("max_completion_length", f"dr_grpo needs a positive max_completion_length, got "
                          f"{ob.max_completion_length!r}")


def _check_sapo(ob) -> None:
    if not (ob.sapo_temperature_pos > 0 and ob.sapo_temperature_neg > 0):
        raise ConfigError("sapo_temperature_pos" if not ob.sapo_temperature_pos > 0 else "sapo_temperature_neg",
                          "sapo temperatures must be > 0")


def _check_vespo(ob) -> None:
    mode = ob.vllm_importance_sampling_mode
    if ob.vllm_importance_sampling_correction and not str(mode).startswith("token"):   # TRL refuses it too
        raise ConfigError("vllm_importance_sampling_mode", f"vespo needs a token_* mode, got {mode!r}")


# ---------------------------------------------------------------- the definition's PG part
def _ppo_text(ob, params, r):
    dl = f", r' = min(r, {ob.delta:g})" if ob.delta is not None else ""
    return f"{r}; PG = −min(r'·A, clip(r, {1 - ob.epsilon_low:g}, {1 + ob.epsilon_high:g})·A){dl}"


def _cispo_text(ob, params, r):
    return f"{r}; PG = −sg(min(r, {ob.epsilon_high:g}))·A·logπ (IS weight clipped, no trust region)"


def _sapo_text(ob, params, r):
    return (f"{r}; PG = −σ(τ·(r−1))·4/τ·A, τ = {params.get('sapo_temperature_pos', 1.0):g} if A > 0 "
            f"else {params.get('sapo_temperature_neg', 1.05):g} (soft gate)")


def _vespo_text(ob, params, r):
    return (f"w_i = exp(Σ_t(logp − old)); PG = −sg(φ(w_i))·A·logπ, φ = e^(λ + k·log w − λw), (k, λ) = "
            f"({params.get('vespo_k_pos', 2):g}, {params.get('vespo_lambda_pos', 3):g}) if A ≥ 0 else "
            f"({params.get('vespo_k_neg', 3):g}, {params.get('vespo_lambda_neg', 2):g})")


def _ppo(aggregation, weighting, *, check=None, global_normaliser=False) -> LossRule:
    return LossRule(weighting, clipped_surrogate, aggregation, metrics=clip_metrics, text=_ppo_text, check=check,
                    global_normaliser=global_normaliser)


# each loss type's definition in StepConfig's loss_type help
HELP = {
    "dapo": "TRL 1.16's default: Σ m·L / num_items_in_batch (token mean over the whole batch).",
    "grpo": "TRL's mean_i(Σ_t m·L / |o_i|).",
    "bnpo": "TRL's Σ m·L / Σ m (micro-batch token mean).",
    "dr_grpo": "TRL's Σ m·L / (N·max_new_tokens).",
    "cispo": "TRL's IS weight clipped at epsilon_high, dapo's normaliser.",
    "sapo": "TRL's soft sigmoid gate, grpo's normaliser.",
    "luspo": "TRL's per-sequence token sums, meant for importance_sampling_level='sequence'.",
    "vespo": "TRL's gamma weight of the sequence ratio, dapo's normaliser.",
}
RULES = {lt: dataclasses.replace(rule, help=HELP[lt]) for lt, rule in {
    "dapo": _ppo(global_token_mean, "global", global_normaliser=True),
    "grpo": _ppo(sequence_mean, "rows"),
    "bnpo": _ppo(batch_token_mean, "tokens"),
    "dr_grpo": _ppo(fixed_length, "rows", check=_check_dr_grpo),
    "cispo": LossRule("global", cispo, global_token_mean, metrics=_cispo_metrics, text=_cispo_text,
                      global_normaliser=True),
    "sapo": LossRule("rows", sapo_gate, sequence_mean, params=SAPO_PARAMS, text=_sapo_text,
                     check=_check_sapo),
    "luspo": _ppo(sequence_sum_mean, "rows"),
    "vespo": LossRule("global", vespo, global_token_mean, params=VESPO_PARAMS, metrics=_vespo_metrics,
                      text=_vespo_text, check=_check_vespo, global_normaliser=True, sampling_ratio_inside=True),
}.items()}

FAMILY = register(Family("TRL GRPOTrainer", RULES, trl_advantages))
