"""The value rules of `StepConfig`, in the order they are checked (after the type checks of
`rookworld_debug.settings.check`); cross-field rules sit with the field they name. An objective family's own
knobs are checked by its settings section's rules."""
from __future__ import annotations

from rookworld_debug.settings import Rule as _Rule
from rookworld_debug.settings import optional as _optional


def device_name(name: str, default: str) -> bool:
    return name in (default, "cpu", "cuda", "mps") or (name.startswith("cuda:") and name[5:].isdigit())


def _path_or_none(name: str) -> _Rule:
    return _Rule(name, _optional(name, lambda v: isinstance(v, str) and bool(v.strip())),
                 lambda c: f"must be a non-empty path string or None, got {getattr(c, name)!r}", False)


def is_number_pair(b) -> bool:
    return isinstance(b, tuple) and len(b) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in b)


def _is_truncate(c) -> bool:
    return c.vllm_importance_sampling_mode.endswith("truncate")


RULES: tuple[_Rule, ...] = (
    # ---- run / data
    _Rule("batch_size", lambda c: c.batch_size >= 1, "must be ≥ 1"),
    _Rule("num_generations", lambda c: c.num_generations >= 1, "must be ≥ 1"),
    _Rule("num_generations", lambda c: not (c.num_generations < 2 and c.scale_rewards != "none"),
          lambda c: f"G={c.num_generations} < 2: a group std needs at least two samples (scale_rewards="
                    f"{c.scale_rewards!r}); use G ≥ 2 or scale_rewards='none'", False),
    _Rule("prompt_indices", _optional("prompt_indices", lambda pi: isinstance(pi, tuple) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in pi)),
          lambda c: f"must be a list of integers, got {c.prompt_indices!r}", False),
    _Rule("prompt_indices", lambda c: c.prompt_indices is None or len(c.prompt_indices) == c.batch_size,
          lambda c: f"length must equal batch_size={c.batch_size}"),
    _Rule("prompt_indices", _optional("prompt_indices", lambda pi: all(i >= 0 for i in pi)), "indices must be ≥ 0"),
    _Rule("prompt_indices", _optional("prompt_indices", lambda pi: len(set(pi)) == len(pi)),
          "indices must be distinct (G already repeats each prompt num_generations times)"),
    _Rule("batch_size", lambda c: not (c.task == "mixed" and c.prompt_indices is None) or c.batch_size >= 2,
          "task='mixed' needs batch_size ≥ 2 to hold both tasks"),
    _Rule("seed", lambda c: c.seed >= 0, "must be ≥ 0"),
    # ---- sampling
    _Rule("max_new_tokens", lambda c: c.max_new_tokens > 0, "must be > 0"),
    _Rule("p_temperature", lambda c: c.p_temperature > 0, "must be > 0"),
    _Rule("a_temperature", lambda c: c.a_temperature > 0, "must be > 0"),
    _Rule("p_top_p", lambda c: 0 < c.p_top_p <= 1, "must be in (0, 1]"),
    _Rule("a_top_p", lambda c: 0 < c.a_top_p <= 1, "must be in (0, 1]"),
    _Rule("top_k", lambda c: c.top_k >= 0, "must be ≥ 0 (0 disables)"),
    # ---- objective
    _Rule("beta", lambda c: c.beta >= 0, "must be ≥ 0"),
    _Rule("epsilon_low", lambda c: c.epsilon_low >= 0, "must be ≥ 0"),
    _Rule("epsilon_high", lambda c: c.epsilon_high >= 0, "must be ≥ 0"),
    _Rule("delta", _optional("delta", lambda v: v > 0), "must be > 0 or None (recommended > 1 + epsilon_high)"),
    _Rule("adv_eps", lambda c: c.adv_eps >= 0, "must be ≥ 0"),
    _Rule("std_ddof", lambda c: c.std_ddof in (0, 1), "must be 0 or 1"),
    _Rule("adv_clip", _optional("adv_clip", lambda v: v > 0), "must be > 0 or None"),
    _Rule("sapo_temperature_pos", lambda c: c.sapo_temperature_pos > 0, "must be > 0"),
    _Rule("sapo_temperature_neg", lambda c: c.sapo_temperature_neg > 0, "must be > 0"),
    # the VESPO gate's λ ≤ 0 has no meaning (TRL's loss would clamp it to 1e-4 while the config said −1)
    _Rule("vespo_lambda_pos", lambda c: c.vespo_lambda_pos > 0, "must be > 0"),
    _Rule("vespo_lambda_neg", lambda c: c.vespo_lambda_neg > 0, "must be > 0"),
    _Rule("off_policy_mask_threshold", _optional("off_policy_mask_threshold", lambda v: v >= 0),
          "must be ≥ 0 or None"),
    _Rule("top_entropy_quantile", lambda c: 0 <= c.top_entropy_quantile <= 1, "must be in [0, 1]"),
    _Rule("vllm_importance_sampling_clip_min", _optional("vllm_importance_sampling_clip_min", lambda v: v >= 0),
          "must be ≥ 0 or None"),
    _Rule("vllm_importance_sampling_clip_max", lambda c: c.vllm_importance_sampling_clip_max is None or (
        c.vllm_importance_sampling_clip_max > 0 and (c.vllm_importance_sampling_clip_min is None or
                                                     c.vllm_importance_sampling_clip_max
                                                     >= c.vllm_importance_sampling_clip_min)),
          "must be > 0 and ≥ vllm_importance_sampling_clip_min, or None"),
    _Rule("vllm_importance_sampling_mode", lambda c: not (c.vllm_importance_sampling_correction and _is_truncate(c))
          or c.vllm_importance_sampling_clip_min is not None or c.vllm_importance_sampling_clip_max is not None,
          "a *_truncate mode needs clip_min or clip_max"),
    _Rule("entropy_coef_min", lambda c: 0 <= c.entropy_coef_min <= c.entropy_coef_max,
          "must be in [0, entropy_coef_max]"),
    _Rule("entropy_coef_delta", lambda c: c.entropy_coef_delta >= 0, "must be ≥ 0"),
    # ---- start policy and inner iterations
    _Rule("num_iterations", lambda c: c.num_iterations >= 1, "must be ≥ 1"),
    _Rule("warmup_steps", lambda c: c.warmup_steps >= 0, "must be ≥ 0"),
    _Rule("warmup_lr", _optional("warmup_lr", lambda v: v >= 0), "must be ≥ 0 or None"),
    _path_or_none("init_policy"),
    _path_or_none("init_optimizer"),
    _Rule("init_optimizer", lambda c: not (c.init_optimizer == "checkpoint" and c.init_policy is None),
          "'checkpoint' needs init_policy (a run_steps checkpoint folder)", False),
    _Rule("tiny_std_fraction", lambda c: 0 <= c.tiny_std_fraction < 1, "must be in [0, 1)"),
    # ---- optimizer
    _Rule("lr", lambda c: c.lr >= 0, "must be ≥ 0"),
    _Rule("adam_betas", lambda c: is_number_pair(c.adam_betas),
          lambda c: f"must be a pair of numbers, got {c.adam_betas!r}", False),
    _Rule("adam_betas", lambda c: all(0 <= x < 1 for x in c.adam_betas), "each β must be in [0, 1)"),
    _Rule("adam_eps", lambda c: c.adam_eps > 0, "must be > 0"),
    _Rule("weight_decay", lambda c: c.weight_decay >= 0, "must be ≥ 0"),
    _Rule("max_grad_norm", _optional("max_grad_norm", lambda v: v > 0), "must be > 0 or None"),
    _Rule("steps_per_generation", lambda c: c.steps_per_generation is None or (
        1 <= c.steps_per_generation <= c.num_completions and c.num_completions % c.steps_per_generation == 0),
          lambda c: f"must divide N = B·G = {c.num_completions}"),
    _Rule("micro_batch_size", lambda c: c.micro_batch_size is None
          or 1 <= c.micro_batch_size <= c.rows_per_optimizer_step,
          lambda c: f"must be in [1, {c.rows_per_optimizer_step}] (rows per optimizer step) or None"),
    _Rule("micro_batch_size", lambda c: c.micro_batch_size is None
          or c.rows_per_optimizer_step % c.micro_batch_size == 0,
          lambda c: f"must divide the {c.rows_per_optimizer_step} rows of an optimizer step"),
    # ---- rewards
    _Rule("engine_depth", lambda c: c.engine_depth >= 1, "must be ≥ 1"),
    _Rule("engine_multipv", lambda c: c.engine_multipv >= 1, "must be ≥ 1"),
    _Rule("engine_workers", lambda c: c.engine_workers >= 1, "must be ≥ 1"),
    _Rule("engine_timeout", lambda c: c.engine_timeout > 0, "must be > 0 seconds"),
    # ---- evaluation
    _Rule("heldout_n", lambda c: c.heldout_n >= 0, "must be ≥ 0"),
    _Rule("eval_max_new_tokens", lambda c: c.eval_max_new_tokens > 0, "must be > 0"),
    _Rule("top_k_alternatives", lambda c: c.top_k_alternatives >= 0, "must be ≥ 0"),
    # ---- hardware
    _Rule("device", lambda c: device_name(c.device, "auto"), "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    _Rule("reference_device", lambda c: device_name(c.reference_device, "same"),
          "must be 'same', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
)

