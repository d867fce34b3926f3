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

import math
from dataclasses import dataclass

from rookworld_debug import settings

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
    "kl_share": "Loss-VALUE share |kl_loss| / (|pg_loss| + |kl_loss| + |entropy term|), reported only off-policy "
                "(some ratio ≠ 1). On-policy the PG value is −agg(A), fixed by group-centred advantages (0 for "
                "grpo, ~0 otherwise) whatever the policy, so the value share would read ~100%: n/a there; use "
                "kl_grad_share.",
    "snr": "Gradient signal-to-noise across the B groups (McCandlish et al. 2018): |G|²_est / (tr Σ̂ / B), with "
           "ḡ = mean of the group gradients g_b (each the loss restricted to the group's rows, the batch's own "
           "normalizers), tr Σ̂ = Σ_b |g_b − ḡ|² / (B − 1) and |G|²_est = |ḡ|² − tr Σ̂ / B (unbiased). 0 when "
           "|G|²_est ≤ 0 (pure noise). Batch: the sampled rollout at the step's start.",
    "b_simple": "Noise scale B_simple = tr Σ̂ / |G|²_est: the number of groups per step at which SNR reaches 1 "
                "(inf when |G|²_est ≤ 0). Same estimators and batch as snr.",
    "delta_reward_ci": "Paired bootstrap 95 % interval of mean(after − before) of the greedy rewards of the same "
                       "prompts (pairs resampled with replacement); 'within noise' when it covers 0.",
    "group_cos_step": "cos(g_b, Σ_b g_b): how well group b's gradient points along the step's gradient.",
    "group_size_cos": "What if G were smaller: cos(g_G′, g_G) between the gradient from G′ < G completions per group and "
                      "the step's full-G gradient. Estimator: per G′, seeded draws keep G′ of each group's G rows "
                      "(uniform, without replacement); advantages recomputed from the kept rewards with the step's "
                      "advantage function; the step's loss with the kept rows' normalizers; same forward (step start, "
                      "ratio 1). Shown: mean ± sd (n − 1) over the draws. Batch: the sampled rollout.",
    "entropy_cov": "Cov(log π, A) = Σ m(ℓ_it − ℓ̄)(A_i − Ā)/n over the n masked sampled tokens, ℓ̄, Ā token means "
                   "(Cui et al. 2025's batch-centred token covariance); ℓ from the trainer's fp32 forward at the "
                   "step's start. Batch: the sampled rollout.",
    "predicted_delta_entropy": "First-order entropy change −η·Cov(log π, A) (Cui et al. 2025: softmax policy, natural "
                               "policy gradient with step η), η = the learning rate. Adam on shared weights is not "
                               "that update: read the sign, and the implied η_eff = −measured/Cov.",
    "measured_delta_entropy": "Σ m(H_after − H_before)/n: token-mean change of the tempered policy's entropy (nats) on "
                              "the SAME sampled tokens, before = the step's start; after one optimizer step (next "
                              "inner pass's forward, μ > 1) or after the whole update (the evaluation's forward).",
    "clip_events": "Tokens of an inner pass by bound crossed × sign of A, counts and shares of the n masked tokens: "
                   "clip-low = r < 1 − ε_low with A < 0 (binding; the entropy-raising side), clip-high = r > 1 + ε_high "
                   "with A > 0 (binding; the entropy-lowering side); the other two cells cross a bound without "
                   "binding (PPO's min keeps the unclipped term).",
    "sampler_gap": "Δ_it = log π_sampler(y_it) − log π_trainer(y_it) on the masked sampled tokens: the decoding "
                   "loop's log-prob of the token it drew vs the trainer's fp32 teacher-forced forward at the same θ. "
                   "Quantiles, mean |Δ| (TRL sampling/sampling_logp_difference/mean), max |Δ|. Batch: the rollout.",
    "is_ess": "Effective sample size of the truncated IS weights, ESS = (Σw)²/Σw², shown as ESS/n: per token w_it = "
              "min(e^(−Δ_it), C) over the n masked tokens; per sequence w_i = min(e^(−Σ_t Δ_it), C) over the rows. "
              "C = vllm_importance_sampling_clip_max (TRL 1.16 default 3.0). 1 = uniform weights (no gap).",
    "kl_grad_share": "Gradient share of the KL penalty: ‖∇(β·KL)‖ / (‖∇PG‖ + ‖∇(β·KL)‖ + ‖∇entropy term‖), global L2 "
                     "norms of each term's gradient before clipping (update phase; n/a on the lean path).",
    "pg_grad_share": "Gradient share of the PG term: ‖∇PG‖ / (‖∇PG‖ + ‖∇(β·KL)‖ + ‖∇entropy term‖).",
    "grad_cos_pg_kl": "Cosine between the PG and β·KL gradients (all parameters): −1 = the KL penalty pulls straight "
                      "against the policy gradient, 0 = orthogonal, +1 = same direction.",
    "num_tokens": "TRL `num_tokens`: prompt + completion tokens (attention-mask sum) processed so far; here this step's "
                  "B·G prompt+completion tokens (rollout).",
    "completions/min_length": "TRL: shortest sampled completion Σ_t m_it (tokens, EOS included; rollout).",
    "completions/max_length": "TRL: longest sampled completion (rollout).",
    "completions/mean_terminated_length": "TRL: mean length of the sampled completions that ended with EOS "
                                          "(NaN if none did; rollout).",
    "completions/min_terminated_length": "TRL: shortest EOS-terminated sampled completion (rollout).",
    "completions/max_terminated_length": "TRL: longest EOS-terminated sampled completion (rollout).",
    "learning_rate": "TRL/HF `learning_rate`: the optimizer's lr used for this step's update.",
    "tiny_std_groups": "Number of groups whose reward std σ_g > 0 is below tiny_std_fraction × the batch reward std: "
                       "their advantages (r − μ_g)/σ_g blow small reward gaps up to ±1 or more (rollout).",
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


#: definitions of keys with a variable part (TRL logs one pair per reward function)
PATTERNS: dict[str, str] = {
    "rewards/{func}/mean": "TRL: nanmean over the N sampled completions of reward component {func} (unweighted; rollout).",
    "rewards/{func}/std": "TRL: nanstd (n−1) over the N sampled completions of reward component {func} (rollout).",
}


#: the batch a metric is measured on (views label every number with it); keys not listed: see batch_of
BATCH_OF: dict[str, str] = {
    "reward_before": "greedy · this batch · before", "reward_after": "greedy · this batch · after",
    "delta_reward": "greedy · this batch · after − before",
    "heldout_reward_before": "greedy · held-out · before", "heldout_reward_after": "greedy · held-out · after",
    "heldout_n": "held-out", "grad_norm_pre_clip": "update (sampled rollout)",
    "grad_norm_post_clip": "update (sampled rollout)", "learning_rate": "update",
    "kl_grad_share": "update (sampled rollout)", "pg_grad_share": "update (sampled rollout)",
    "grad_cos_pg_kl": "update (sampled rollout)", "corr_adv_delta_logp": "sampled rollout · after vs before",
    "step0_invariants_ok": "dataset tokens · before any update",
    "max_abs_logp_diff_recompute": "sampled rollout",
    "snr": "sampled rollout · step start · across groups", "b_simple": "sampled rollout · step start · across groups",
    "group_cos_step": "sampled rollout · step start", "delta_reward_ci": "greedy · same prompts · after − before",
}


def batch_of(key: str) -> str:
    """Which batch `key` is measured on: greedy this batch before/after, greedy held-out, the sampled
    rollout, or the update; every other TRL key (loss, kl, rewards/*, completions/*, clip_ratio/*, …)
    is a statistic of the sampled rollout."""
    return BATCH_OF.get(key, "sampled rollout · this batch")


#: the objective families' own metrics (registered with each family: grpo.registry.register)
FAMILY_DEFINITIONS: dict[str, str] = {}


def define(definitions: dict) -> None:
    """Add an objective family's metric definitions (its metrics' keys → what they mean)."""
    FAMILY_DEFINITIONS.update(definitions)


def _all_definitions() -> dict:
    settings.load_builtin()                         # the built-in families' definitions
    return {**GLOSSARY, **FAMILY_DEFINITIONS}


def definition(key: str) -> str:
    """The definition of a metric key: GLOSSARY, the families' own, then the per-reward-function patterns; '' if
    unknown."""
    settings.load_builtin()                         # the built-in families' definitions
    for table in (FAMILY_DEFINITIONS, GLOSSARY):     # (a family's own wins, as in glossary_markdown)
        if key in table:
            return table[key]
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "rewards" and parts[2] in ("mean", "std"):
        return PATTERNS[f"rewards/{{func}}/{parts[2]}"].format(func=parts[1])
    return ""


@dataclass(frozen=True)
class TermBalance:
    """How the loss terms weigh against each other, in words a reader can trust (see GLOSSARY kl_share)."""
    on_policy: bool                 # every masked ratio is exactly 1 (PG value = −agg(A), policy-independent)
    kl_value_share: float           # NaN when on_policy (not meaningful) or undefined (all terms 0)
    grad_norms: dict                # {"pg", "kl", "entropy"} global L2 norms of each term's gradient (may be {})
    kl_grad_share: float            # NaN without per-term gradients
    pg_grad_share: float
    grad_cos_pg_kl: float           # NaN when unavailable or a term's gradient is 0
    headline: str                   # one sentence for banners and summaries

    @property
    def value_share_meaningful(self) -> bool:
        return not math.isnan(self.kl_value_share)


def term_balance(loss, update=None) -> TermBalance:
    """Balance of PG vs β·KL vs entropy from the loss record and (optionally) the update record.
    Never reports a loss-value share on-policy, where the PG value is fixed by construction."""
    mask = loss.completion_mask.bool()
    ratio = loss.per_token_ratio[mask]
    on_policy = bool(ratio.numel() == 0 or (ratio == 1).all())
    value_share = math.nan if (on_policy or loss.kl_share_undefined) else float(loss.kl_share)
    norms = dict(getattr(update, "per_term_global", None) or {})
    den = sum(norms.values()) if norms else 0.0
    kl_gs = norms.get("kl", 0.0) / den if den > 0 else math.nan
    pg_gs = norms.get("pg", 0.0) / den if den > 0 else math.nan
    cos = float((getattr(update, "grad_cosine", None) or {}).get("pg_kl", math.nan))
    if float(loss.beta) == 0.0:
        head = "β = 0: no KL penalty; the gradient is the policy gradient (plus any entropy term)."
    elif not math.isnan(kl_gs):
        head = (f"KL penalty = {kl_gs:.0%} of the gradient (‖∇β·KL‖ {norms.get('kl', 0):.3g} vs ‖∇PG‖ "
                f"{norms.get('pg', 0):.3g}" + ("" if math.isnan(cos) else f", cos {cos:+.2f}") + ").")
    elif norms:
        head = "every term's gradient is 0 (no PG signal and KL 0): no share to report."
    else:
        head = "per-term gradients not recorded (lean update path or no update): gradient share n/a."
    if on_policy:
        head += (" On-policy (ratio ≡ 1) the PG loss VALUE is −agg(A), fixed by group-centred advantages, "
                 "so a loss-value share is not reported.")
    elif not math.isnan(value_share):
        head += f" Loss-value share of β·KL: {value_share:.0%}."
    return TermBalance(on_policy, value_share, norms, kl_gs, pg_gs, cos, head)


def tiny_std_groups(group_std, batch_std: float, fraction: float) -> tuple:
    """Groups with 0 < σ_g < fraction·σ_batch (σ_g NaN or 0 are the zero-std/degenerate cases, flagged
    elsewhere). `group_std` is the (B,) per-group reward std the advantages were scaled by."""
    if not fraction or not batch_std or not math.isfinite(batch_std):
        return ()
    return tuple(b for b, sd in enumerate(float(x) for x in group_std)
                 if math.isfinite(sd) and 0 < sd < fraction * batch_std and not math.isclose(sd, 0.0, abs_tol=1e-8))


def glossary_markdown(keys=None) -> str:
    defs = _all_definitions()
    keys = list(defs) if keys is None else [k for k in keys if k in defs]
    return "\n".join(f"- **{k}**: {defs[k]}" for k in keys)
