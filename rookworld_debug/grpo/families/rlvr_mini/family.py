"""rookworld-rlvr's mini, registered as an objective family (loss_type "rlvr_mini").

What it adds to the shared phases: its advantages (baselines, one global normalisation), its own loss record
(`loss.compute_rlvr_loss`: a SEQUENCE ratio against the reference, so it needs ℓ_ref whatever β), a per-step
preparation (its adaptive KL controller and values), the update's β (the controller's kl_coef) and the
data-pipeline faults it can reproduce (`StepConfig.rlvr_pitfalls`): two in the sampler, two in the rollout.
"""
from __future__ import annotations

from rookworld_debug.grpo.families.rlvr_mini.settings import MiniSettings
from rookworld_debug.grpo.registry import Family, LossRule, register

HELP = ("rookworld-rlvr's pure-PyTorch GRPO: r_i = exp(clamp(Σ_t (logp − ref), ±20)) against the REFERENCE, "
        "−mean_i min(r_i·A_i, clip(r_i)·A_i) + β·mean_i KL_i − c_H·mean_i H_i, sums not means (its knobs: the "
        "rlvr_mini section; β is its kl_coef, epsilon_low/high its clip_range; grpo/families/rlvr_mini/objective.py).")


# its metrics' definitions (metrics.definition serves them beside the core glossary)
METRICS = {
    "loss_type/rlvr_mini": "rookworld-rlvr's objective: s_i = Σ_t m(ℓ − ℓ^ref) (SUMMED, against the REFERENCE), "
                           "r_i = exp(clamp(s_i, ±20)), loss = −mean_i min(r_i A_i, clip(r_i, 1−ε, 1+ε) A_i) + "
                           "β·mean_i KL_i − c_H·mean_i Σ_t −m e^ℓ ℓ (+ c_V·mean (v − v̂)²); A from its baseline + "
                           "one batch-wide (A − mean)/(std + 1e-8).",
    "rlvr/pg_loss": "The mini's −mean_i min(r_i·A_i, clip(r_i)·A_i), r_i the sequence ratio to the REFERENCE.",
    "rlvr/kl_div": "mean_i KL_i of the selected rlvr_kl_type: a sampled-token surrogate, NOT a KL divergence "
                   "(forward Σ_t m e^ℓ(ℓ − ℓ^ref) can be negative).",
    "rlvr/kl_forward": "mean_i Σ_t m·e^ℓ·(ℓ − ℓ^ref) (can be < 0).",
    "rlvr/kl_reverse": "mean_i Σ_t m·e^ℓref·(ℓ^ref − ℓ) (can be < 0).",
    "rlvr/kl_symmetric": "½(kl_forward + kl_reverse).",
    "rlvr/value_loss": "mean (v − v̂)² when values and targets are given, else 0.",
    "rlvr/entropy_loss": "The signed entropy term −c_H·mean_i Σ_t −m e^ℓ ℓ (sampled-token surrogate; ≤ 0).",
    "rlvr/total_loss": "The mini's total loss.",
    "rlvr/ratio_mean": "mean_i r_i, r_i = exp(clamp(Σ_t m(ℓ − ℓ^ref), ±20)): the SEQUENCE ratio to the reference.",
    "rlvr/ratio_std": "Unbiased std of r_i over rows (NaN for one row).",
    "rlvr/ratio_outliers": "Fraction of rows with r_i < 0.5 or r_i > 2 (float32).",
    "rlvr/advantage_mean": "Mean of the advantages fed to the loss.",
    "rlvr/advantage_std": "Unbiased std of those advantages.",
    "rlvr/clipped_frac": "The mini's 'clipped' fraction: rows with r_i outside [1 − ε_low, 1 + ε_high] WHATEVER the "
                         "sign of A (not the rows where the clip binds: see clip_ratio/region_mean); r_i is against "
                         "the reference and summed over tokens, so it measures drift from π_ref, not one update.",
    "rlvr/kl_coef": "The KL coefficient used by this step (its adaptive controller's output when rlvr_adaptive_kl).",
    "rlvr/k1_observation": "What the controller observed before the loss: mean_i Σ_t m(ℓ − ℓ^ref) (rollout).",
}


def _advantages(rewards, config):
    from rookworld_debug.grpo.families.rlvr_mini.advantages import rlvr_advantages_from_config
    return rlvr_advantages_from_config(rewards, config)


def _loss(logps, old, ref, advantages, mask, objective, batch):
    from rookworld_debug.grpo.families.rlvr_mini.loss import compute_rlvr_loss
    return compute_rlvr_loss(logps, ref, advantages, mask, objective, batch)


def _prepare(rollout, advantages, objective, mask):
    from rookworld_debug.grpo.families.rlvr_mini.loss import rlvr_step       # the KL controller and values
    return rlvr_step(rollout, advantages, objective, mask)


def _update_config(config, loss):
    return config.replace(beta=loss.beta) if config.rlvr_adaptive_kl else config   # the controller's kl_coef


def _sampler_options(config) -> dict:
    """The decode loop's options for the mini's sampler faults."""
    return {"mini_positions": "kv_cache_positions" in config.rlvr_pitfalls,
            "continue_after_eos": "train_past_eos" in config.rlvr_pitfalls}


def _rollout_transform(rollout, config, policy, reference, tokenizer):
    """The mini's layout faults: what its loss trains (the rollout unchanged without them)."""
    if not config.rlvr_pitfalls:
        return rollout
    from rookworld_debug.grpo.families.rlvr_mini.pitfalls import apply_layout_faults
    return apply_layout_faults(rollout, config, policy, reference, tokenizer)


def _own_settings(config) -> tuple:
    return ("rlvr_pitfalls",) if config.rlvr_pitfalls else ()


# its own loss record (`loss`) replaces the table's objective, aggregation and definition; the rule keeps the
# update's weighting: the mini's terms are means over rows
FAMILY = register(Family(
    "rookworld-rlvr mini", {"rlvr_mini": LossRule("rows", entropy="sequences", help=HELP)}, _advantages,
    loss=_loss, prepare=_prepare, update_config=_update_config, needs_reference=True, kl_knob="rlvr_kl_type",
    sampler_options=_sampler_options, rollout_transform=_rollout_transform, own_settings=_own_settings,
    settings=MiniSettings, metric_definitions=METRICS))
