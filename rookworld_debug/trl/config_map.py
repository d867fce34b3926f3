"""GRPOConfig → StepConfig: every TRL setting with a StepConfig counterpart is mapped; the rest is kept
verbatim (`unmapped`), with a note for each setting that changes the step's math in a way StepConfig
cannot express (the views then say so instead of showing a wrong recompute)."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from rookworld_debug.config import StepConfig
from rookworld_debug.settings import loss_types

# GRPOConfig field → StepConfig field (same meaning)
DIRECT = {"num_generations": "num_generations", "seed": "seed", "max_completion_length": "max_new_tokens",
          "beta": "beta", "epsilon": "epsilon_low", "delta": "delta",
          "importance_sampling_level": "importance_sampling_level", "scale_rewards": "scale_rewards",
          "mask_truncated_completions": "mask_truncated_completions",
          "use_bias_correction_kl": "use_bias_correction_kl", "entropy_coef": "entropy_coef",
          "learning_rate": "lr", "adam_epsilon": "adam_eps", "weight_decay": "weight_decay"}
# consumed by the mapping below (not 1:1)
DERIVED = ("temperature", "top_p", "top_k", "epsilon_high", "loss_type", "adam_beta1", "adam_beta2",
           "max_grad_norm", "per_device_train_batch_size", "gradient_accumulation_steps", "use_cpu", "bf16",
           "fp16", "model_init_kwargs")
# settings whose non-default value changes TRL's step in ways StepConfig does not model: (field, default)
MATH_CHANGING = (("top_entropy_quantile", 1.0), ("off_policy_mask_threshold", None), ("use_vllm", False),
                 ("multi_objective_aggregation", "sum_then_normalize"), ("use_liger_kernel", False),
                 ("repetition_penalty", 1.0), ("min_p", None), ("use_adaptive_entropy", False),
                 ("vllm_importance_sampling_correction", None))


def _plain(v: Any) -> Any:
    return getattr(v, "value", v)           # enums (e.g. lr_scheduler_type) → their value


def grpo_config_to_step_config(args, *, batch_size: int, task: str, model: str, reward_funcs: Sequence = (),
                               device: str = "cpu", dtype: str = "float32") -> tuple[StepConfig, dict, tuple]:
    """(StepConfig, unmapped GRPOConfig fields verbatim, notes). `batch_size` (B prompts per generation
    batch), `task`, `model`, reward settings and hardware come from the live trainer, not the config."""
    d = {k: _plain(v) for k, v in args.to_dict().items()}
    kw: dict = {StepConfig_field: d[trl] for trl, StepConfig_field in DIRECT.items() if trl in d}
    notes = []
    kw.update(p_temperature=d["temperature"], a_temperature=d["temperature"],
              p_top_p=d.get("top_p") or 1.0, a_top_p=d.get("top_p") or 1.0, top_k=d.get("top_k") or 0,
              epsilon_high=d.get("epsilon_high") if d.get("epsilon_high") is not None else d["epsilon"],
              adam_betas=(d["adam_beta1"], d["adam_beta2"]),
              max_grad_norm=d["max_grad_norm"] if d.get("max_grad_norm") else None,
              batch_size=batch_size, task=task, model=model, dataset="trl", heldout_n=0, kl_estimator="k3",
              adv_eps=1e-4, std_ddof=1, adv_clip=None, device=device, dtype=dtype)
    # same-name fields StepConfig gains over time (e.g. num_iterations, top_entropy_quantile) map 1:1
    same = {k: d[k] for k in StepConfig.field_names() if k in d and k not in kw and k not in DERIVED}
    kw.update(same)
    if "vllm_importance_sampling_correction" in kw:         # TRL applies it only with vLLM (default True)
        kw["vllm_importance_sampling_correction"] = bool(kw["vllm_importance_sampling_correction"]
                                                         and d.get("use_vllm"))
    ga = int(d.get("gradient_accumulation_steps") or 1)
    if ga > 1:
        kw["micro_batch_size"] = int(d["per_device_train_batch_size"])
    if d.get("loss_type") in loss_types():
        kw["loss_type"] = d["loss_type"]
    else:
        notes.append(f"loss_type={d.get('loss_type')!r} has no StepConfig counterpart in this version: the "
                     "loss record cannot be recomputed for it")
    kw.update(_p_reward_settings(reward_funcs, notes))
    for name, default in MATH_CHANGING:
        if name in kw:
            continue                                    # StepConfig models it
        v = d.get(name, default)
        if v != default and not (isinstance(v, float) and isinstance(default, float) and math.isclose(v, default)):
            if name == "vllm_importance_sampling_correction" and not d.get("use_vllm"):
                continue
            notes.append(f"{name}={v!r} (TRL default {default!r}) changes the step in a way StepConfig does not "
                         "model; recomputes with new β/ε ignore it")
    if kw.get("entropy_coef") is None:
        kw["entropy_coef"] = 0.0
    unmapped = {k: v for k, v in d.items() if k not in DIRECT and k not in DERIVED and k not in same}
    cfg = StepConfig(**kw)
    return cfg, unmapped, tuple(notes)


def task_of(prompts: Sequence[str]) -> str:
    tasks = {"A" if str(p).lstrip().startswith("A:") else "P" for p in prompts}
    return tasks.pop() if len(tasks) == 1 else "mixed"


def model_name(trainer) -> Optional[str]:
    m = trainer.accelerator.unwrap_model(trainer.model)
    return getattr(m.config, "_name_or_path", None) or "in-memory model"


def _p_reward_settings(reward_funcs, notes: list) -> dict:
    """The reward mode and engine settings of this package's P: reward among `reward_funcs` ({} without it). A
    function that only carries its name (a wrapper) is not read: its settings are unknown, said in `notes`."""
    from rookworld_debug.trl.rewards import PReward
    for f in reward_funcs:
        if isinstance(f, PReward):
            return dict(reward_mode=f.reward_mode, engine_depth=f.depth, engine_multipv=f.multipv,
                        engine_workers=f.workers)
        if getattr(f, "__name__", "") == "rookworld_p":
            notes.append(f"a reward function named 'rookworld_p' ({type(f).__name__}) is not rookworld_debug's "
                         "PReward: its reward mode and engine settings are unknown, so the defaults are assumed")
    return {}
