"""The phases a step and a warm-up step share: generation → rewards → advantages → loss, no update.

`run_step` (grpo/step.py) and the warm-up of a drifted start (grpo/multistep/drift.py) both call `sample_and_score`;
it lives here, below both, so neither imports the other's module.
"""
from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Mapping, Optional

import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.grpo.registry import checked, family_advantages
from rookworld_debug.grpo.objective.loss import LossBreakdown
from rookworld_debug.grpo.phases.advantages import Advantages
from rookworld_debug.grpo.phases.generation import Rollout, generate_with_greedy, inject_completions
from rookworld_debug.grpo.phases.loss_inputs import loss_inputs
from rookworld_debug.grpo.phases.rewards import compute_rewards
from rookworld_debug.grpo.phases.setup import Setup, check_inject, objective_of


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of step `step`: first 31 bits of sha256(f"{seed}/{step}"). A pure function of
    (config.seed, step), so a resumed run samples exactly what the uninterrupted one did."""
    return int(hashlib.sha256(f"{seed}/{step}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


class PhaseTimer:
    """Seconds per phase. `PhaseTimer.current` names the phase running now (a memory sampler's label).
    Running out of device memory in a phase becomes DeviceMemoryError naming the phase, with `advice(phase)`
    (set once the models are loaded: `memory_advice`) saying which setting would fit."""
    current: Optional[str] = None

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.advice = lambda phase: "lower batch_size or num_generations"

    @contextmanager
    def __call__(self, phase: str):
        t0, outer = time.perf_counter(), PhaseTimer.current
        PhaseTimer.current = phase
        try:
            yield
        except torch.OutOfMemoryError as err:
            from rookworld_debug.errors import DeviceMemoryError
            raise DeviceMemoryError(phase, self.advice(phase), str(err)) from None
        finally:
            PhaseTimer.current = outer
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


def memory_advice(s: Setup, config: StepConfig, phase: str) -> str:
    """What would fit after running out of device memory in `phase`, from the project's own estimate
    (`scoring.train_bytes_per_row`) and the memory free on the policy's device now."""
    from rookworld_debug.grpo.phases.scoring import TRAIN_BUDGET_BYTES, auto_micro_batch_size, train_bytes_per_row
    from rookworld_debug.models.memory import memory_budget
    n = config.batch_size * config.num_generations
    seq = max(len(s.tokenizer(p).input_ids) for p in s.batch.prompts) + config.max_new_tokens
    per_row = train_bytes_per_row(s.policy, seq)
    budget = memory_budget(next(s.policy.parameters()).device, TRAIN_BUDGET_BYTES)
    fit = auto_micro_batch_size(s.policy, n, seq, budget)
    now = config.micro_batch_size or n          # what ran out of memory
    tips = []
    if phase in ("update", "diagnostics", "loss") and fit < now:      # advice that is smaller than what failed
        tips.append(f"micro_batch_size={fit} (estimated {per_row / 2**30:.2f} GiB per row of {seq} tokens, "
                    f"{budget / 2**30:.1f} GiB to plan for)")
    elif phase in ("update", "diagnostics", "loss"):
        tips.append(f"micro_batch_size={now} already holds at most what the estimate fits ({per_row / 2**30:.2f} GiB "
                    f"per row of {seq} tokens): fewer tokens per row or more free memory is what helps")
    if config.reference_device == "same" and next(s.policy.parameters()).device.type != "cpu":
        tips.append("reference_device=cpu (or another GPU) frees the reference's weights and activations")
    tips.append("or a smaller batch_size × num_generations / max_new_tokens")
    return "; ".join(tips)


def rows(values, g: int) -> list:
    """Per-prompt values → per-row values (each repeated G times, TRL order)."""
    return [v for v in values for _ in range(g)]


def loss_for(rollout: Rollout, advantages: Advantages, config: StepConfig, *,
             old_per_token_logps: Optional[torch.Tensor] = None, objective=None) -> LossBreakdown:
    """The loss record from the rollout's tensors — no forward pass (widgets recompute it per slider move).
    On-policy (μ = 1) the old log-probs ARE the rollout's, so ratio = 1 exactly as in TRL; a saved off-policy
    step (e.g. a TRL capture with num_iterations > 1) passes its stored `old_per_token_logps` (N, T).
    `objective`: the config's, when the caller resolved it."""
    old = rollout.per_token_logps if old_per_token_logps is None else old_per_token_logps             # (N, T)
    return loss_inputs(rollout, advantages, config, old=old, prepare=True, objective=objective).loss()


def sample_and_score(s: Setup, config: StepConfig, *, reward_funcs=None, reward_weights=None,
                     inject: Optional[Mapping[int, str]] = None, timer: Optional[PhaseTimer] = None,
                     greedy_prompts=()):
    """generation → rewards → advantages → loss on the setup's (current) policy; no update.
    `inject` = {row: completion text} replaces sampled rows (see `inject_completions`).
    Returns (rollout, rewards, advantages, loss); with `greedy_prompts`, also their greedy completions (up to
    `config.eval_max_new_tokens`), decoded in the sampling loop (`generate_with_greedy`): the before-update
    evaluation without a decode loop of its own."""
    timer = timer or PhaseTimer()
    objective = objective_of(s, config)        # what its family cannot run, or another family's knob: refused
    b, g, family = s.batch, config.num_generations, objective.family
    if inject:
        check_inject(inject, s, config)        # bad text / too long for the context: ConfigError, before sampling
    with timer("generation"):
        rollout, greedy = generate_with_greedy(
            s.policy, s.reference, s.tokenizer, list(b.prompts), list(b.tasks), num_generations=g,
            max_new_tokens=config.max_new_tokens, sampling={t: config.sampling_for(t) for t in set(b.tasks)},
            seed=config.seed, top_k_alternatives=config.top_k_alternatives, greedy_prompts=greedy_prompts,
            greedy_max_new_tokens=config.eval_max_new_tokens,
            sampling_autocast=config.sampling_autocast,
            decode_options=checked(family, "sampler_options", family.sampler_options(config), dict, "a dict"))
        if inject:
            rollout = inject_completions(rollout, inject, s.policy, s.reference, s.tokenizer)
        if family.rollout_transform is not None:       # what the family's loss trains (e.g. the mini's layout)
            rollout = checked(family, "rollout_transform", family.rollout_transform(
                rollout, config, s.policy, s.reference, s.tokenizer), Rollout, "a Rollout")
    if config.sampling_autocast:
        rollout = replace(rollout, warnings=rollout.warnings + (
            f"sampling_autocast={config.sampling_autocast!r}: the sampling loop (samples and greedy rows) ran under "
            "bf16 autocast, as a bf16 sampler (vLLM) would; the rollout's scoring forwards and the update are the "
            "trainer's fp32 — sampling_per_token_logps vs per_token_logps is the sampler–trainer gap",))
    with timer("rewards"):
        rewards = compute_rewards(rollout.prompts, rollout.completions, rollout.tasks, labels=rows(b.completions, g),
                                  reward_mode=config.reward_mode, engine=s.engine, reward_funcs=reward_funcs,
                                  reward_weights=reward_weights, completion_ids=rollout.completion_ids)
    with timer("advantages"):
        advantages = family_advantages(family, rewards.rewards, config)
    with timer("loss"):
        loss = loss_for(rollout, advantages, config, objective=objective)
    return (rollout, rewards, advantages, loss, greedy) if greedy_prompts else (rollout, rewards, advantages, loss)
