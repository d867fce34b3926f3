"""A long TRL GRPOTrainer log, built deterministically from a seed: the input of the triage-at-scale benchmark
(`benchmarks/triage_scale.py`) and of `rookworld-debug bench`'s (h) variant (diagnosing a 10,000-step log).

One `log_history` entry per optimizer step, with TRL's metric names: a slow drift plus noise, KL and grad-norm
jumps at known steps (the run checks' and the flight recorder's triggers fire there). Optionally:

- `kl_runaway_from=s`: from step s on, the logged KL rises quadratically on top of its noise, to
  `kl_runaway_to` (nats/token) at the last step (a run whose β is too small for its learning rate);
- `trl_keys=True`: every other metric TRL 1.16's GRPOTrainer logs at β > 0 without vLLM or tools
  (`num_tokens`, completion length min/max and terminated lengths, the reward function's std, the clip ratios
  low/high), drawn from a second generator so the base entries stay the same, plus the closing summary entry
  (`train_runtime`, `train_loss`, …) that `Trainer.train()` appends.
"""
from __future__ import annotations

import random

JUMPS = (1_200, 2_500, 4_000, 6_100, 8_800)          # KL / grad-norm jumps: the triggers fire here
REWARD = "rewards/rookworld_p_reward"                # TRL's per-function keys: rewards/<reward function name>/…


def _base_entry(rng: random.Random, step: int, n: int, reward: float, kl: float, jump: bool) -> dict:
    return {"step": step, "epoch": step / n, "loss": rng.gauss(0, 0.01) + 0.04 * kl,
            "reward": reward + rng.gauss(0, 0.05), "reward_std": 0.2 + rng.gauss(0, 0.01),
            "kl": kl, "entropy": 1.2 - step * 2e-5 + rng.gauss(0, 0.02),
            "clip_ratio/region_mean": max(0.0, rng.gauss(0.01, 0.005)) + (0.3 if jump else 0),
            "grad_norm": abs(rng.gauss(1.0, 0.1)) * (8 if jump else 1),
            "frac_reward_zero_std": min(1.0, max(0.0, rng.gauss(0.1, 0.05))),
            "completions/mean_length": 60 + rng.gauss(0, 3), "completions/clipped_ratio": max(0, rng.gauss(0.02, 0.01)),
            "learning_rate": 1e-6, "step_time": 1.0 + rng.gauss(0, 0.05),
            f"{REWARD}/mean": reward + rng.gauss(0, 0.05)}


def _trl_extras(rng: random.Random, e: dict, tokens: int) -> dict:
    """The rest of TRL 1.16's per-step GRPO metrics, consistent with the entry's own values."""
    mean_len = e["completions/mean_length"]
    region = e["clip_ratio/region_mean"]
    low = region * rng.uniform(0.3, 0.7)
    return {"num_tokens": float(tokens), "completions/min_length": max(1.0, mean_len - 20 + rng.gauss(0, 3)),
            "completions/max_length": mean_len + 40 + rng.gauss(0, 5),
            "completions/mean_terminated_length": mean_len - 2 + rng.gauss(0, 1),
            "completions/min_terminated_length": max(1.0, mean_len - 21 + rng.gauss(0, 3)),
            "completions/max_terminated_length": mean_len + 30 + rng.gauss(0, 5),
            f"{REWARD}/std": abs(e["reward_std"] + rng.gauss(0, 0.01)),
            "clip_ratio/low_mean": low, "clip_ratio/low_min": low * rng.uniform(0, 0.5),
            "clip_ratio/high_mean": region - low, "clip_ratio/high_max": min(1.0, (region - low) * rng.uniform(1, 3))}


def log_history(n: int = 10_000, seed: int = 0, *, jumps=JUMPS, kl_runaway_from: int | None = None,
                kl_runaway_to: float = 1.0, trl_keys: bool = False) -> list[dict]:
    """TRL `trainer.state.log_history` of an n-step run (module doc); the same list for the same arguments."""
    rng, extra = random.Random(seed), random.Random(seed + 1)
    start = n if kl_runaway_from is None else kl_runaway_from
    out, reward, kl, tokens = [], 0.30, 0.002, 0
    for step in range(1, n + 1):
        reward += rng.gauss(0, 0.002)
        jump = step in jumps
        kl = max(1e-5, kl * (1 + rng.gauss(0, 0.05)) + (0.2 if jump else 0)) if not jump else kl + 0.2
        kl = kl if jump or kl < 0.05 else 0.002                  # a jump lasts one step
        grown = kl + kl_runaway_to * ((step - start) / max(1, n - start)) ** 2 if step > start else kl
        e = _base_entry(rng, step, n, reward, grown, jump)
        if trl_keys:
            tokens += int(e["completions/mean_length"] * 32 + 60 * 4)      # B·G = 32 completions, 4 prompts
            e.update(_trl_extras(extra, e, tokens))
        out.append(e)
    if trl_keys:
        runtime = sum(e["step_time"] for e in out)
        out.append({"train_runtime": runtime, "train_samples_per_second": 32 * n / runtime,
                    "train_steps_per_second": n / runtime, "total_flos": 0.0,
                    "train_loss": sum(e["loss"] for e in out) / n, "epoch": 1.0, "step": n})
    return out
