"""Glossary: the definition of every headline number a view or report shows.

Notation: B prompts, G completions per prompt (one group), N = B·G rows, T completion tokens,
m_it the completion mask (1 up to and including EOS), ℓ_it = log π_θ(y_it) of the SAMPLED token with
logits divided by the sampling temperature (fp32, full vocabulary, as TRL), ℓ^ref the same under the
frozen reference, A_i the advantage of row i, r_it = exp(ℓ_it − ℓ^old_it) the PPO ratio.
Batches: "rollout" = the N sampled completions of this step; "batch" = this step's B prompts decoded
greedily; "heldout" = the fixed held-out prompts decoded greedily. Before/after pairs always use the
SAME prompts and the same decoding.
"""
from __future__ import annotations

GLOSSARY: dict[str, str] = {
    "reward_before": "Mean built-in reward of GREEDY completions of this step's B prompts, before the update (batch).",
    "reward_after": "Same B prompts, greedy, after the update (batch). Same prompts as reward_before.",
    "delta_reward": "reward_after − reward_before on the same B prompts (greedy).",
    "heldout_reward_before": "Mean greedy reward on the fixed held-out prompts before the update (n = heldout_n).",
    "heldout_reward_after": "Same held-out prompts after the update.",
    "rollout_reward": "TRL `reward`: nanmean over the N sampled completions of Σ_k w_k·r_k (rollout).",
    "reward_std": "TRL `reward_std`: nanstd (n−1) of the summed reward over the N sampled completions (rollout).",
    "loss": "The scalar that is backpropagated: pg_loss + kl_loss + entropy term (aggregated by loss_type).",
    "pg_loss": "Policy-gradient term: agg(−min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)) over masked tokens; "
               "on-policy r = 1 so its value is −agg(A) while its gradient is −agg(A·∇ℓ).",
    "kl_loss": "β·agg(KL_it): the KL penalty as it enters the loss (same aggregation as pg_loss).",
    "kl": "TRL `kl`: raw (NOT β-scaled) token mean Σ m·KL_it / Σ m of the chosen estimator "
          "(k3: exp(ℓ^ref−ℓ) − (ℓ^ref−ℓ) − 1 ≥ 0; k1: ℓ − ℓ^ref; k2: ½(ℓ − ℓ^ref)²; full: exact KL over the vocabulary).",
    "kl_share": "|kl_loss| / (|pg_loss| + |kl_loss| + |entropy term|): how much of the loss VALUE is the KL penalty "
                "(0 when all three are 0, flagged).",
    "entropy": "TRL `entropy`: token mean over masked tokens of the entropy (nats) of the tempered policy distribution.",
    "grad_norm_pre_clip": "Global L2 norm of the total gradient before clip_grad_norm_ (TRL/HF `grad_norm`).",
    "grad_norm_post_clip": "Global L2 norm after clipping to max_grad_norm.",
    "frac_reward_zero_std": "TRL: fraction of rows whose group reward std is ≈ 0 (those rows get advantage 0).",
    "advantage_min": "Smallest advantage in the rollout (after normalisation/clip).",
    "advantage_max": "Largest advantage in the rollout.",
    "clip_ratio/low_mean": "TRL: fraction of masked tokens with r < 1 − ε_low and A < 0 (0 on-policy).",
    "clip_ratio/high_mean": "TRL: fraction of masked tokens with r > 1 + ε_high and A > 0 (0 on-policy).",
    "clip_ratio/region_mean": "TRL: fraction of masked tokens clipped either way.",
    "clip_ratio/low_min": "TRL: min over sequences of the per-sequence low-clip fraction.",
    "clip_ratio/high_max": "TRL: max over sequences of the per-sequence high-clip fraction.",
    "completions/mean_length": "TRL: mean of Σ_t m_it over the N sampled completions (tokens, EOS included).",
    "completions/clipped_ratio": "TRL: fraction of sampled completions with no EOS within max_new_tokens (truncated).",
    "format_valid": "Fraction of sampled completions whose parser found no format problem (P: M:/E:/B: fields; "
                    "A: 4 '+'-separated fields).",
    "corr_adv_delta_logp": "Pearson correlation over rows between A_i and the mean per-token change of ℓ on the "
                           "sampled tokens after the update (Δlogp). Positive = the update moved mass the right way.",
    "step0_invariants_ok": "Before any update: policy and reference log-probs bit-equal, every KL 0, ratio 1, "
                           "no dropout active.",
    "max_abs_logp_diff_recompute": "max |ℓ captured while sampling − ℓ from a fresh teacher-forced forward| "
                                   "(> 1e-4 flags padding / position-id / temperature bugs).",
    "heldout_n": "Number of held-out prompts in heldout_reward_before/after.",
}


def glossary_markdown(keys=None) -> str:
    keys = list(GLOSSARY) if keys is None else [k for k in keys if k in GLOSSARY]
    return "\n".join(f"- **{k}**: {GLOSSARY[k]}" for k in keys)
