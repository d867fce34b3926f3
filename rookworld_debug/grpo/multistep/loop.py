"""N GRPO steps with the SAME phase functions as `run_step`: batch cursor, β/LR schedules, checkpoints.

Shape legend: B prompts, G generations/prompt, N = B·G rows, T completion tokens.

Read `run_steps` top to bottom. Step k (0-based) does, in this order:

1. β_k  = `BetaController.beta_for(k)`   — computed BEFORE step k's loss, from steps < k only;
2. lr_k = `LRSchedule.lr_at(k)`           — written into the optimizer BEFORE step k's optimizer step;
3. batch_k = `BatchCursor.at(k)`          — explicit dataset indices (reported with epoch, cursor, hash);
4. seed_k  = `step_seed(config.seed, k)`  — sampling seed, a pure function of (seed, k);
5. `run_step(config.replace(beta=β_k, lr=lr_k, seed=seed_k), session=<one Setup, batch_k>)`;
6. the adaptive controller observes step k's RAW KL (`trace.loss.kl`, never β·KL) → β_{k+1}.

The optimizer (AdamW moments) and the policy persist across steps; the reference never changes.
Everything a step depends on is either in the checkpoint (weights, optimizer, controller value, RNG
states) or a pure function of (config, k), so resuming from a checkpoint reproduces the
uninterrupted run bit for bit on CPU.

The old tool's multi-step bugs this module is written against (rookworld-trl's manual debug scripts):
β updated one step late, LR schedule off by one (step k trained with lr(k−2)), adaptive β fed β·KL,
a batch cursor that reused prompts [0:B] once `start ≥ N`, Pre/Post measured on different batches.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.data.loaders import select_batch
from rookworld_debug.errors import ConfigError, DataError
from rookworld_debug.grpo.multistep.checkpoint import MODES  # noqa: F401 - batch modes, shared with the checkpoint schema
from rookworld_debug.grpo.phases.rewards import compute_rewards
from rookworld_debug.grpo.multistep.schedules import (BETA_KINDS, LR_KINDS, BetaController, BetaSchedule,  # noqa: F401
                                            LRSchedule, _as_beta, _as_lr)
from rookworld_debug.grpo.phases.shared import step_seed  # noqa: F401 - re-exported (run_steps' sampling seeds)
from rookworld_debug.grpo.phases.setup import Setup, load_samples
from rookworld_debug.grpo.multistep.start import setup as setup_phase
from rookworld_debug.grpo.step import StepTrace, run_step
from rookworld_debug.models.devices import cpu_state

CHECKPOINT_VERSION = 1




# ==================================================================================== batch cursor
@dataclass(frozen=True)
class BatchCursor:
    """Which dataset positions step k trains on. No hidden state: `at(k)` is pure.

    - 'overfit_single_batch': `order` IS the batch (the setup's B indices); every step returns it;
      epoch = k (each step is one pass over the batch), cursor = 0.
    - 'fresh': `order` = a fixed permutation (random.Random(seed).sample) of the M task-matching
      positions. Step k starts at c = (k·B) mod M and takes order[(c + j) mod M] for j < B — always
      exactly B prompts, wrapping inside the step if needed; epoch = ⌊k·B / M⌋ (passes started).
    """
    mode: str
    order: tuple
    batch_size: int

    def at(self, step: int) -> tuple[tuple, int, int]:
        """(indices, epoch, cursor) of step `step`."""
        if self.mode == "overfit_single_batch":
            return tuple(self.order), step, 0
        m, b = len(self.order), self.batch_size
        start = step * b
        c = start % m
        return tuple(self.order[(c + j) % m] for j in range(b)), start // m, c

    @staticmethod
    def fresh(samples: Sequence, task: str, batch_size: int, seed: int) -> "BatchCursor":
        cand = [i for i, s in enumerate(samples) if task == "mixed" or s.task == task]
        if len(cand) < batch_size:
            raise DataError(f"fresh batches need at least batch_size={batch_size} {task} samples, have {len(cand)}")
        return BatchCursor("fresh", tuple(random.Random(seed).sample(cand, len(cand))), batch_size)


# ==================================================================================== result
@dataclass(frozen=True)
class MultiStepResult:
    """`table`: one row per step (columns defined in `TABLE_COLUMNS`); `per_prompt`: one row per
    (step, prompt) with the greedy reward before/after and the mean sampled reward of its group."""
    config: StepConfig
    steps: int
    mode: str
    beta_schedule: BetaSchedule
    lr_schedule: LRSchedule
    table: object                       # pandas.DataFrame
    per_prompt: object                  # pandas.DataFrame
    traces: tuple                       # StepTrace per step run in THIS call (empty if keep_traces=False)
    checkpoints: tuple                  # folders written, in order
    resumed_from: Optional[str]
    session: Setup = field(repr=False, default=None)

    def summary(self) -> dict:
        return summary_stats(self.table)

    def save(self, out) -> Path:
        """`table.csv`, `per_prompt.csv`, `summary.json` (summary stats, config, schedules)."""
        from rookworld_debug.safeio import atomic_write_json
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.table.to_csv(out / "table.csv", index=False)
        self.per_prompt.to_csv(out / "per_prompt.csv", index=False)
        atomic_write_json(out / "summary.json", {
            "metrics": self.summary(), "steps": self.steps, "mode": self.mode,
            "beta_schedule": dataclasses.asdict(self.beta_schedule),
            "lr_schedule": dataclasses.asdict(self.lr_schedule), "config": self.config.to_dict(),
            "checkpoints": [str(p) for p in self.checkpoints], "resumed_from": self.resumed_from})
        return out


#: Definitions of the per-step table's columns (views and docs use these).
TABLE_COLUMNS = {
    "step": "0-based step index k",
    "epoch": "fresh: passes over the shuffled order started (⌊k·B/M⌋); overfit: = step",
    "cursor": "fresh: position in the shuffled order where this batch starts; overfit: 0",
    "batch_indices": "dataset positions of the B prompts (JSON list)",
    "batch_hash": "hash of the batch's prompts + labels (same hash = same prompts)",
    "n_prompts": "B of this step (always batch_size)",
    "seed": "sampling seed of this step = step_seed(config.seed, step)",
    "beta": "β used in THIS step's loss", "lr": "learning rate used by THIS step's optimizer step",
    "reward_before": "mean training reward of greedy completions on this batch BEFORE the update",
    "reward_after": "same prompts, greedy, AFTER the update",
    "delta_reward": "reward_after − reward_before (same batch, same decoding)",
    "reward_before_ci95": "95% CI half-width of reward_before over the B prompts (t·s/√B)",
    "reward_after_ci95": "95% CI half-width of reward_after over the B prompts (t·s/√B)",
    "builtin_reward_before": "built-in RookWorld reward of the greedy completions before (trace.before)",
    "builtin_reward_after": "built-in RookWorld reward of the greedy completions after",
    "heldout_reward_before": "greedy built-in reward on the held-out prompts before (NaN: not evaluated this step)",
    "heldout_reward_after": "same, after", "heldout_n": "number of held-out prompts evaluated",
    "rollout_reward": "mean training reward of the N sampled completions (what the advantages see)",
    "reward_std": "std of the N sampled rewards",
    "loss": "total loss", "pg_loss": "policy-gradient term", "kl": "raw KL(π‖π_ref), nats/token (TRL `kl`)",
    "kl_loss": "β·KL as it enters the loss",
    "kl_share": "loss-VALUE share |β·KL| / (|PG| + |β·KL| + |entropy term|); NaN on-policy (μ = 1: the PG value "
                "is −agg(A), fixed by group-centred advantages, so the share would read ~100%)",
    "kl_grad_share": "gradient share ‖∇β·KL‖ / (‖∇PG‖ + ‖∇β·KL‖ + ‖∇entropy term‖) of the update (NaN on the lean path)",
    "entropy": "mean token entropy of the tempered policy",
    "advantage_min": "min advantage over the N rows", "advantage_max": "max advantage over the N rows",
    "frac_reward_zero_std": "fraction of groups whose G rewards are all equal (no PG signal)",
    "grad_norm_pre_clip": "global L2 grad norm before clipping", "grad_norm_post_clip": "after clipping",
    "param_delta_norm": "‖θ_after − θ_before‖₂",
    "format_valid": "share of the N sampled completions with no format problem flagged",
    "corr_adv_delta_logp": "Pearson(A_i, mean Δℓ_i per token) over the N rows after the update (NaN: no evaluation)",
    "updated": "False when the step refused to update (NaN/inf)",
    "n_flags": "number of warnings raised by the step's phases",
}


# ==================================================================================== the loop
def run_steps(config: Optional[StepConfig], steps: int, *, mode: Optional[str] = None,
              beta_schedule=None, lr_schedule=None, checkpoint_every: Optional[int] = None,
              checkpoint_dir=None, resume_from=None, reward_funcs: Optional[Mapping] = None,
              reward_weights: Optional[Mapping] = None, on_step: Optional[Callable] = None,
              session: Optional[Setup] = None, samples: Optional[tuple] = None, loaded=None, engine=None,
              heldout_every: int = 1, keep_traces: bool = True) -> MultiStepResult:
    """Run steps 0..steps−1 (or resume at a checkpoint's next step) and return the per-step table.

    `mode`: 'overfit_single_batch' (default) or 'fresh' (see `BatchCursor`). Resuming: None takes the checkpoint's (else must match).
    `beta_schedule` / `lr_schedule`: a kind name, a dict of fields, or a `BetaSchedule`/`LRSchedule`.
    `reward_funcs` / `reward_weights`: as `run_step` (TRL signature); the table's reward_before/after is
    the same weighted training reward on the greedy completions. `samples` = (train, heldout) lists
    (default: `load_samples(config.dataset, config.task)`); `loaded` = a `LoadedModels` to reuse.
    `heldout_every`: evaluate the held-out prompts on steps k with k % heldout_every == 0 (and the last).
    `on_step(row: dict, trace: StepTrace)` is called after each step (CLI log, progress bars).
    """
    state = _read_checkpoint(resume_from) if resume_from is not None else None
    if state is not None:
        config, mode, beta_schedule, lr_schedule = _from_checkpoint(state, resume_from, config, mode, beta_schedule,
                                                                    lr_schedule)
    mode = "overfit_single_batch" if mode is None else mode
    _check_run_args(config, steps, mode, checkpoint_every, checkpoint_dir, heldout_every)
    beta_s, lr_s = _as_beta(beta_schedule, config), _as_lr(lr_schedule, config, steps)
    if state is not None:
        _check_same(state, steps=steps, mode=mode, beta=beta_s, lr=lr_s, where=resume_from)

    s0, samples, cursor = _session(config, mode, session, samples, loaded, engine)
    beta = BetaController(beta_s)
    rows, prompt_rows, start = [], [], 0
    if state is not None:
        _restore(state, Path(resume_from), s0, beta)
        rows, prompt_rows, start = list(state["rows"]), list(state["per_prompt"]), int(state["next_step"])
        if tuple(state["cursor_order"]) != cursor.order:
            raise DataError(f"the checkpoint's batch order differs from this dataset's ({resume_from})")

    traces, written = [], []
    for k in range(start, steps):
        indices, epoch, cur = cursor.at(k)
        batch = s0.batch if mode == "overfit_single_batch" else \
            select_batch(samples[0], task=config.task, batch_size=config.batch_size, indices=indices)
        trace = _step(k, config, s0, batch, beta, lr_s, k % heldout_every == 0 or k == steps - 1, reward_funcs,
                      reward_weights)
        row, prows = _rows(k, trace, batch, epoch, cur, reward_funcs, reward_weights)
        rows.append(row)
        prompt_rows.extend(prows)
        if keep_traces:
            traces.append(trace)
        if on_step is not None:
            on_step(row, trace)
        if checkpoint_every and (k + 1) % checkpoint_every == 0:
            written.append(save_checkpoint(
                Path(checkpoint_dir) / f"step_{k + 1:05d}", s0, beta, config=config, steps=steps, mode=mode,
                beta_schedule=beta_s, lr_schedule=lr_s, next_step=k + 1, cursor=cursor, rows=rows,
                per_prompt=prompt_rows))

    import pandas as pd
    return MultiStepResult(config=config, steps=steps, mode=mode, beta_schedule=beta_s, lr_schedule=lr_s,
                           table=pd.DataFrame(rows), per_prompt=pd.DataFrame(prompt_rows), traces=tuple(traces),
                           checkpoints=tuple(written), resumed_from=None if resume_from is None else str(resume_from),
                           session=s0)


def _session(config, mode: str, session, samples, loaded, engine) -> tuple:
    """One Setup for every step (models, engine, optimizer; the batch is replaced per step), the samples and
    the batch cursor of `mode`."""
    if samples is None and (session is None or mode == "fresh"):
        samples = load_samples(config.dataset, config.task)
    s0 = session if session is not None else setup_phase(config, loaded=loaded, samples=samples, engine=engine)
    cursor = BatchCursor.fresh(samples[0], config.task, config.batch_size, config.seed) if mode == "fresh" else \
        BatchCursor("overfit_single_batch", tuple(s0.batch.indices), config.batch_size)
    return s0, samples, cursor


def _step(k: int, config, s0: Setup, batch, beta: BetaController, lr_s: LRSchedule, eval_heldout: bool,
          reward_funcs, reward_weights) -> StepTrace:
    """Step k on `batch`: β_k and lr_k fixed BEFORE it, its own sampling seed; the controller then observes its
    RAW KL (→ β_{k+1})."""
    beta_k, lr_k = beta.beta_for(k), lr_s.lr_at(k)
    session_k = dataclasses.replace(s0, batch=batch, heldout=s0.heldout if eval_heldout else ())
    step_config = config.replace(beta=beta_k, lr=lr_k, seed=step_seed(config.seed, k))
    for group in s0.optimizer.param_groups:
        group["lr"] = lr_k
    trace = run_step(step_config, session=session_k, reward_funcs=reward_funcs, reward_weights=reward_weights)
    trace.counts["run/step"] = k            # a saved step says which step of the run it is (k > 0: after updates)
    beta.observe(k, trace.loss.kl)
    return trace


PLACEMENT = ("device", "reference_device")       # where a run computes, not what: a resume may move it


def _from_checkpoint(state: dict, resume_from, config, mode, beta_schedule, lr_schedule):
    """A resume takes the checkpoint's config, mode and schedules where none is given; a given config must match."""
    saved = StepConfig.from_dict(state["config"])
    if config is None:                    # the checkpoint's, placed on what this machine has (a GPU's run resumes here)
        from rookworld_debug.models.devices import usable
        config = saved if usable(saved.device) and usable(saved.reference_device) else \
            saved.replace(device="cpu", reference_device="same")
    diff = sorted(k for k in saved.field_names() if getattr(saved, k) != getattr(config, k) and k not in PLACEMENT)
    if diff:
        raise ConfigError(", ".join(diff), f"the checkpoint in {resume_from} was written for another config "
                          f"(fields {diff} differ); pass config=None to take the checkpoint's")
    return (config, state["mode"] if mode is None else mode,
            state["beta_schedule"] if beta_schedule is None else beta_schedule,
            state["lr_schedule"] if lr_schedule is None else lr_schedule)


def _check_run_args(config, steps, mode, checkpoint_every, checkpoint_dir, heldout_every) -> None:
    if config is None:
        raise ConfigError("config", "a StepConfig is required (or resume_from a checkpoint)")
    if mode not in MODES:
        raise ConfigError("mode", f"unknown mode {mode!r}; expected one of {list(MODES)}")
    if mode == "fresh" and config.prompt_indices is not None:
        raise ConfigError("prompt_indices", "fresh mode draws every batch from the cursor over the whole task "
                          "subset; prompt_indices only pins the overfit_single_batch batch")
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", f"must be an integer ≥ 1, got {steps!r}")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ConfigError("checkpoint_every", f"must be ≥ 1 or None, got {checkpoint_every!r}")
    if checkpoint_every and checkpoint_dir is None:
        raise ConfigError("checkpoint_dir", "checkpoint_every needs a checkpoint_dir")
    if heldout_every < 1:
        raise ConfigError("heldout_every", f"must be ≥ 1, got {heldout_every!r}")


def _greedy_training_reward(ge, labels, config, engine, reward_funcs, reward_weights) -> list:
    """Per-prompt training reward (built-in + user functions, weighted) of a GreedyEval's completions."""
    if not reward_funcs and not reward_weights:
        return [float(x) for x in ge.rewards]
    r = compute_rewards(ge.prompts, ge.completions, ge.tasks, labels=labels, reward_mode=config.reward_mode,
                        engine=engine, reward_funcs=reward_funcs, reward_weights=reward_weights)
    return [float(x) for x in r.rewards]


def _rows(k, trace: StepTrace, batch, epoch, cur, reward_funcs, reward_weights) -> tuple[dict, list]:
    cfg, s, ev = trace.config, trace.setup, trace.evaluation
    labels = list(batch.completions)
    before = _greedy_training_reward(trace.before, labels, cfg, s.engine, reward_funcs, reward_weights)
    after = _greedy_training_reward(ev.batch_after, labels, cfg, s.engine, reward_funcs, reward_weights) \
        if ev is not None else [math.nan] * len(before)
    summ = trace.summary()
    rb, ra = _mean_ci(before), _mean_ci(after)
    row = {
        "step": k, "epoch": epoch, "cursor": cur, "batch_indices": json.dumps(list(batch.indices)),
        "batch_hash": batch.batch_hash, "n_prompts": len(batch), "seed": cfg.seed,
        "beta": cfg.beta, "lr": trace.update.lr if trace.update else cfg.lr,
        "reward_before": rb[0], "reward_after": ra[0], "delta_reward": ra[0] - rb[0],
        "reward_before_ci95": rb[1], "reward_after_ci95": ra[1],
        "builtin_reward_before": summ["reward_before"], "builtin_reward_after": summ["reward_after"],
        "heldout_reward_before": summ["heldout_reward_before"], "heldout_reward_after": summ["heldout_reward_after"],
        "heldout_n": summ["heldout_n"], "rollout_reward": summ["rollout_reward"], "reward_std": summ["reward_std"],
        "loss": summ["loss"], "pg_loss": summ["pg_loss"], "kl": summ["kl"], "kl_loss": summ["kl_loss"],
        "kl_share": summ["kl_share"], "kl_grad_share": summ.get("kl_grad_share", math.nan), "entropy": summ["entropy"],
        "advantage_min": summ["advantage_min"], "advantage_max": summ["advantage_max"],
        "frac_reward_zero_std": summ["frac_reward_zero_std"],
        "grad_norm_pre_clip": summ["grad_norm_pre_clip"], "grad_norm_post_clip": summ["grad_norm_post_clip"],
        "param_delta_norm": trace.update.param_delta_norm if trace.update else math.nan,
        "format_valid": sum(map(bool, trace.rewards.format_valid)) / max(len(trace.rewards.format_valid), 1),
        "corr_adv_delta_logp": ev.corr_adv_delta_logp if ev is not None else math.nan,
        "updated": trace.update is not None, "n_flags": len(trace.flags),
    }
    row.update({f"sec/{phase}": v for phase, v in trace.timings.items()})
    row["sec/total"] = sum(trace.timings.values())
    g = cfg.num_generations
    sampled = trace.rewards.rewards.reshape(len(batch), g)                 # (B, G)
    prows = [{"step": k, "slot": j, "dataset_index": int(idx), "prompt": p, "reward_before": before[j],
              "reward_after": after[j], "rollout_reward_mean": float(torch.nanmean(sampled[j]))}
             for j, (idx, p) in enumerate(zip(batch.indices, batch.prompts))]
    return row, prows


# ==================================================================================== statistics
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df: int) -> float:
    """Two-sided 95% Student-t quantile t_{0.975, df} (table; between entries the next smaller df's
    value, i.e. conservative; 1.96 beyond 120)."""
    if df < 1:
        return math.nan
    if df in _T975:
        return _T975[df]
    smaller = [d for d in _T975 if d < df]
    return _T975[max(smaller)] if df <= 120 else 1.96


def _mean_ci(values) -> tuple[float, float]:
    """(mean, t_{0.975,n−1}·s/√n) over the finite values; CI NaN when n < 2."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    n = len(v)
    if n == 0:
        return math.nan, math.nan
    m = sum(v) / n
    if n < 2:
        return m, math.nan
    s = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    return m, t975(n - 1) * s / math.sqrt(n)


def _ols(x, y) -> tuple[float, float]:
    """Least-squares slope of y on x and its 95% CI half-width (t_{n−2}·SE)."""
    pts = [(a, b) for a, b in zip(x, y) if math.isfinite(b)]
    n = len(pts)
    if n < 2:
        return math.nan, math.nan
    mx, my = sum(a for a, _ in pts) / n, sum(b for _, b in pts) / n
    sxx = sum((a - mx) ** 2 for a, _ in pts)
    if sxx == 0:
        return math.nan, math.nan
    slope = sum((a - mx) * (b - my) for a, b in pts) / sxx
    if n < 3:
        return slope, math.nan
    resid = sum((b - my - slope * (a - mx)) ** 2 for a, b in pts)
    return slope, t975(n - 2) * math.sqrt(resid / (n - 2) / sxx)


def summary_stats(table) -> dict:
    """Headline numbers of a per-step table. Definitions (r_b/r_a = reward_before/after, Δ = r_a − r_b):

    - start_reward = r_b at the first step (± its CI over the B prompts); end_reward = r_a at the last step;
    - pos_steps / neg_steps / zero_steps = #steps with Δ > 0 / Δ < 0 / Δ = 0 (NaN steps not counted);
    - mean_delta ± mean_delta_ci95 = mean Δ over steps, t_{n−1}·s/√n;
    - ma{w}_first / ma{w}_last = mean r_a over the first / last w steps (± t·s/√w), ma{w}_slope =
      (ma_last − ma_first)/(n − w) in reward per step (the two window centres are n − w steps apart;
      NaN when n ≤ w);
    - slope ± slope_ci95 = least-squares slope of r_a on step (t_{n−2}·SE);
    - best/worst_step = argmax/argmin r_a (first on ties) with its value and CI over the B prompts;
    - mean_kl, mean_kl_share (finite steps only: NaN on-policy), mean_kl_grad_share, mean_grad_norm_pre_clip,
      final β/lr, seconds_per_step (mean of sec/total).
    """
    n = len(table)
    out: dict = {"n_steps": n}
    if n == 0:
        return out
    ra = [float(x) for x in table["reward_after"]]
    d = [float(x) for x in table["delta_reward"]]
    first, last = table.iloc[0], table.iloc[-1]
    out.update(start_reward=float(first["reward_before"]), start_reward_ci95=float(first["reward_before_ci95"]),
               end_reward=float(last["reward_after"]), end_reward_ci95=float(last["reward_after_ci95"]))
    out["end_minus_start"] = out["end_reward"] - out["start_reward"]
    out["pos_steps"] = sum(x > 0 for x in d if math.isfinite(x))
    out["neg_steps"] = sum(x < 0 for x in d if math.isfinite(x))
    out["zero_steps"] = sum(x == 0 for x in d if math.isfinite(x))
    out["mean_delta"], out["mean_delta_ci95"] = _mean_ci(d)
    for w in (10, 20):
        f, fc = _mean_ci(ra[:w])
        l, lc = _mean_ci(ra[-w:])
        out.update({f"ma{w}_first": f, f"ma{w}_first_ci95": fc, f"ma{w}_last": l, f"ma{w}_last_ci95": lc,
                    f"ma{w}_slope": (l - f) / (n - w) if n > w else math.nan})
    out["slope"], out["slope_ci95"] = _ols([float(s) for s in table["step"]], ra)
    finite = [(v, i) for i, v in enumerate(ra) if math.isfinite(v)]
    if finite:
        best = max(finite, key=lambda t: (t[0], -t[1]))[1]
        worst = min(finite, key=lambda t: (t[0], t[1]))[1]
        for name, i in (("best", best), ("worst", worst)):
            r = table.iloc[i]
            out.update({f"{name}_step": int(r["step"]), f"{name}_reward": float(r["reward_after"]),
                        f"{name}_reward_ci95": float(r["reward_after_ci95"])})
    for col, key in (("kl", "mean_kl"), ("kl_share", "mean_kl_share"), ("kl_grad_share", "mean_kl_grad_share"),
                     ("grad_norm_pre_clip", "mean_grad_norm_pre_clip")):
        if col in table:                # kl_grad_share: absent from tables saved before it existed
            out[key], out[key + "_ci95"] = _mean_ci(table[col])
    out["final_beta"], out["final_lr"] = float(last["beta"]), float(last["lr"])
    if "sec/total" in table:
        out["seconds_per_step"] = float(table["sec/total"].mean())
    return out


# ==================================================================================== checkpoints
def save_checkpoint(path, s: Setup, beta: BetaController, *, config, steps, mode, beta_schedule, lr_schedule,
                    next_step, cursor: BatchCursor, rows, per_prompt) -> Path:
    """Folder with policy.pt (state_dict), optimizer.pt, rng.pt (torch/python/numpy) and state.json
    (config, schedules, controller value, cursor order, step index, the table so far). state.json is
    written last: its presence marks a complete checkpoint."""
    import numpy as np
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(cpu_state(s.policy.state_dict()), path / "policy.pt")
    torch.save(cpu_state(s.optimizer.state_dict()), path / "optimizer.pt")
    torch.save(_rng_state(), path / "rng.pt")
    state = {"version": CHECKPOINT_VERSION, "next_step": next_step, "completed_steps": next_step, "steps": steps,
             "mode": mode, "config": config.to_dict(), "beta_schedule": dataclasses.asdict(beta_schedule),
             "lr_schedule": dataclasses.asdict(lr_schedule), "beta_state": beta.state_dict(),
             "cursor_order": list(cursor.order), "cursor_next": list(cursor.at(next_step)[1:]),
             "rows": rows, "per_prompt": per_prompt, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = path / ".state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))         # NaN kept as NaN: floats round-trip exactly
    os.replace(tmp, path / "state.json")
    return path


def _rng_state() -> dict:
    """torch/python/numpy generator states as tensors and plain values (loadable with weights_only=True)."""
    import numpy as np
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": [version, torch.tensor(mt, dtype=torch.int64), gauss],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}


def _set_rng_state(rng, path) -> None:
    import numpy as np
    from rookworld_debug.errors import CheckpointError
    try:
        version, mt, gauss = rng["python"]
        name, keys, pos, has_gauss, cached = rng["numpy"]
        torch.set_rng_state(rng["torch"])
        random.setstate((version, tuple(int(x) for x in mt.tolist()), gauss))
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise CheckpointError(f"resume: {path} is not a generator state this version wrote ({err})") from None


def _read_checkpoint(path) -> dict:
    f = Path(path) / "state.json"
    if not f.exists():
        raise DataError(f"{path} is not a complete checkpoint (no state.json)")
    try:
        state = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{f} is not valid JSON ({err})") from None
    except RecursionError:
        raise DataError(f"{f} is nested too deeply to be a checkpoint") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise DataError(f"checkpoint {path} has version {found}, expected {CHECKPOINT_VERSION}")
    from rookworld_debug.grpo.multistep.checkpoint import built, check_state
    built(check_state(state, path), path)          # its config and schedules pass their own rules
    return state


def _check_same(state, *, steps, mode, beta, lr, where):
    for name, mine, theirs in (("steps", steps, state["steps"]), ("mode", mode, state["mode"]),
                               ("beta_schedule", dataclasses.asdict(beta), state["beta_schedule"]),
                               ("lr_schedule", dataclasses.asdict(lr), state["lr_schedule"])):
        if mine != theirs:
            raise ConfigError(name, f"resuming {where}: {mine!r} differs from the checkpoint's {theirs!r}")


def _restore(state, path: Path, s: Setup, beta: BetaController) -> None:
    from rookworld_debug.safeio import check_fits, load_state_into, load_torch
    policy = load_torch(path / "policy.pt", "resume")
    check_fits(s.policy, policy, "resume", path / "policy.pt")
    load_state_into(s.optimizer, load_torch(path / "optimizer.pt", "resume"), "resume", path / "optimizer.pt")
    load_state_into(s.policy, policy, "resume", path / "policy.pt")
    _set_rng_state(load_torch(path / "rng.pt", "resume"), path / "rng.pt")
    beta.load_state_dict(state["beta_state"])
