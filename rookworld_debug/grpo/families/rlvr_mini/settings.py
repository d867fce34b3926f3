"""rookworld-rlvr's mini's own knobs: the `rlvr_mini` section of StepConfig (set flat: `rlvr_kl_type="reverse"`)."""
from __future__ import annotations

from rookworld_debug.grpo.families.rlvr_mini.baselines import BASELINES
from rookworld_debug.grpo.families.rlvr_mini.objective import KL_TYPES
from rookworld_debug.settings import Rule, section, setting

PITFALLS = ("prompt_mask_left_pad", "pad_first_token", "kv_cache_positions", "train_past_eos")


@section("rlvr_mini")
class MiniSettings:
    """The mini's KL surrogate and controller, baselines, values and the data-pipeline faults it can reproduce."""
    rlvr_kl_type: str = setting("forward", "rlvr_mini: KL surrogate per row on the sampled tokens: 'forward' "
                                "Σ e^p(p−q), 'reverse' Σ e^q(q−p), 'symmetric' their mean (can be < 0).",
                                choices=KL_TYPES)
    rlvr_adaptive_kl: bool = setting(True, "rlvr_mini: a fresh adaptive KL controller sets the step's kl_coef from "
                                     "β: k1 = mean_i Σ_t (p − q), ×1.5 if > 2·target, ×0.8 if < 0.5·target, clamp "
                                     "[0.001, 1].")
    rlvr_kl_target: float = setting(0.01, "rlvr_mini: the KL controller's target.")
    rlvr_kl_horizon: int = setting(10000, "rlvr_mini: its history (mean of ≤ 100).")
    rlvr_baseline: str = setting("group_mean", "rlvr_mini: advantage baseline per group of G, then ONE global "
                                 "normalisation (A − mean)/(std + 1e-8) over the batch: 'group_mean'; 'ema' (α 0.1, "
                                 "fresh each step); 'learned' (mean of the values); 'adaptive' (lower median if "
                                 "std_g > 0.1).", choices=BASELINES)
    rlvr_values: str = setting("none", "rlvr_mini: values for its baselines/value loss; 'rewards' = its training "
                               "script's values = targets = rewards.", choices=("none", "rewards"))
    rlvr_use_gae: bool = setting(False, "rlvr_mini: raw advantages → reverse λ-sum per group (with values).")
    rlvr_gae_lambda: float = setting(0.95, "rlvr_mini: λ of that sum.")
    rlvr_value_loss_coef: float = setting(0.1, "rlvr_mini: coefficient of mean (v − v̂)².")
    rlvr_length_normalize: bool = setting(False, "rlvr_mini: average log-ratio, KL and entropy over a row's tokens "
                                          "(the mini sums: long rows dominate).")
    rlvr_pitfalls: tuple = setting((), "rlvr data-pipeline faults to reproduce: 'prompt_mask_left_pad' (a "
                                   "right-padding prompt mask on left-padded rows trains their last min(pads, L) "
                                   "prompt tokens), 'pad_first_token' (also the first prompt token predicted from a "
                                   "pad), 'kv_cache_positions' (cached sampling steps at position P_max + j), "
                                   "'train_past_eos' (tokens sampled after EOS trained).", rollout=True)

    RULES = (
        Rule("rlvr_pitfalls", lambda c: all(isinstance(x, str) for x in c.rlvr_pitfalls)
             and set(c.rlvr_pitfalls) <= set(PITFALLS),
             lambda c: f"must be names from {list(PITFALLS)}, got {c.rlvr_pitfalls!r}", False),
        Rule("rlvr_pitfalls", lambda c: "pad_first_token" not in c.rlvr_pitfalls
             or "prompt_mask_left_pad" in c.rlvr_pitfalls,
             "'pad_first_token' reaches the loss only through 'prompt_mask_left_pad' (add both)", False),
        Rule("rlvr_kl_target", lambda c: c.rlvr_kl_target > 0, "must be > 0"),
        Rule("rlvr_kl_horizon", lambda c: c.rlvr_kl_horizon >= 1, "must be ≥ 1"),
        Rule("rlvr_gae_lambda", lambda c: 0 <= c.rlvr_gae_lambda <= 1, "must be in [0, 1]"),
        Rule("rlvr_value_loss_coef", lambda c: c.rlvr_value_loss_coef >= 0, "must be ≥ 0"),
    )
