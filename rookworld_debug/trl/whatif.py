"""What if, in TRL's own trainer: a captured GRPOTrainer step branched from the checkpoint saved before it.

- Self-check: from the `--before` checkpoint (weights + AdamW state) the captured step is replayed with TRL's
  forward and loss (`trl.verify`), stage by stage: rewards (the project's reward functions on the captured
  completions, when the run used them), advantages, log-probs (the captured tokens under the checkpoint's
  weights vs the captured log-probs), loss (vs TRL's), gradient (vs the Trainer's pre-clip norm) and update
  (vs the checkpoint saved after the step, when it sits next to `--before`: every layer within
  verify-capture's tolerance).
- One-step counterfactual: the same replay per arm with the arm's loss settings, learning rate and clip.
- k-step branches: TRL's GRPOTrainer resumed from `--before` (`train(resume_from_checkpoint=...)`, so the
  optimizer, scheduler and data position are the run's) with the arm's GRPOConfig; seeds are shared across
  arms by seeding torch at the start of every optimizer step with step_seed(seed, global_step); a learning-rate
  override also replaces the scheduler's base rates (a checkpoint's scheduler would otherwise restore the run's).
  Building the trainer needs the run's model, reward functions and data: `trainer_factory(GRPOConfig)`; the
  trl-demo run folder describes its own (demo.json).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import torch

from rookworld_debug.errors import CheckpointError, ConfigError, TraceError
from rookworld_debug.whatif.onestep import OneStepArm, update_to_weight
from rookworld_debug.whatif.overrides import Arm
from rookworld_debug.whatif.selfcheck import StageCheck, self_check, stage

# StepConfig field → GRPOConfig field, where the names differ
STEP_TO_GRPO = {"lr": "learning_rate", "epsilon_low": "epsilon", "max_new_tokens": "max_completion_length",
                "adam_eps": "adam_epsilon"}


@dataclass
class TRLState:
    trace: object                       # the captured StepTrace (capture: TRLCapture)
    before: Path
    after: Optional[Path]               # checkpoint-<step> next to --before, when there
    weights: dict = field(repr=False)   # the --before weights
    optimizer_state: dict = field(repr=False)
    model: object = field(repr=False)
    tokenizer: object = field(repr=False)
    history: dict = field(default_factory=dict)   # metric -> values logged before the branch (trainer_state.json)
    notes: tuple = ()
    greedy_before: object = field(default=None, repr=False)   # greedy at the --before weights: the same for every arm


def _history(before: Path) -> dict:
    from rookworld_debug.whatif.state import _read_json
    f = before / "trainer_state.json"
    if not f.is_file():
        return {}
    logs = [r for r in _read_json(f).get("log_history", []) if isinstance(r, dict) and "loss" in r]
    return {ours: [float(r[k]) for r in logs if isinstance(r.get(k), (int, float))] for ours, k in _LOGGED.items()}


# trajectory column (whatif.branch.TRAJECTORY) → the key TRL logs
_LOGGED = {"rollout_reward": "reward", "kl": "kl", "entropy": "entropy", "grad_norm_pre_clip": "grad_norm",
           "clip_ratio/region_mean": "clip_ratio/region_mean", "reward_std": "reward_std",
           "learning_rate": "learning_rate"}


def _tokenizer(folder: Path):
    """The checkpoint's tokenizer (the folder was refused by `_load_weights` if it asks for custom code)."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{folder}: the tokenizer cannot be loaded ({type(err).__name__}: "
                              f"{str(err)[:200]})") from None


def load_trl_state(capture, before) -> TRLState:
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.safeio import load_torch
    from rookworld_debug.trl.verify import _checkpoint_step, _load_weights
    trace = StepTrace.load(capture)
    cap = trace.capture
    if cap is None:
        raise TraceError(f"{capture} is a step of this project's own, not a TRL capture")
    before = Path(before)
    if not (before / "optimizer.pt").is_file():
        raise CheckpointError(f"--before {before}: no optimizer.pt (a Trainer checkpoint-N folder is needed)")
    step = _checkpoint_step(before)
    notes = [f"--before {before.name} is checkpoint step {step}; the captured step {cap.global_step} starts from "
             f"checkpoint {cap.global_step - 1}"] if step is not None and step != cap.global_step - 1 else []
    model = _load_weights(before)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) and cap.grpo_config.get("disable_dropout", True):
            m.p = 0.0
    model.train()
    after = before.parent / f"checkpoint-{cap.global_step}"
    tok = _tokenizer(before) if (before / "tokenizer_config.json").is_file() else None
    if tok is not None:
        tok.padding_side = "left"
        tok.pad_token = tok.pad_token or tok.eos_token
    return TRLState(trace, before, after if (after / "config.json").is_file() else None,
                    {n: p.detach().clone() for n, p in model.named_parameters()},
                    load_torch(before / "optimizer.pt", "--before"), model, tok, _history(before), tuple(notes))


def _restore(st: TRLState, lr: Optional[float]):
    """Weights and AdamW state of --before; `lr` None keeps the checkpoint's own learning rate (what the Trainer's
    next optimizer step used: a callback or scheduler may have changed it after the last logged value)."""
    from rookworld_debug.safeio import load_state_into
    from rookworld_debug.trl.verify import _optimizer
    with torch.no_grad():
        for n, p in st.model.named_parameters():
            p.copy_(st.weights[n])
            p.grad = None
    opt = _optimizer(st.model, dict(st.trace.capture.grpo_config), st.trace.capture.learning_rate)
    load_state_into(opt, copy.deepcopy(st.optimizer_state), "--before", st.before / "optimizer.pt")
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    return opt


def _replay_update(st: TRLState, arm: Arm):
    """The captured update under the arm: (pre-clip grad norm, loss, config, advantages)."""
    from rookworld_debug.grpo.families import advantages_from_config
    from rookworld_debug.trl.verify import replay
    tr, cap = st.trace, st.trace.capture
    cfg = arm.config(tr.config)
    adv = tr.advantages if not arm.overrides else advantages_from_config(tr.rewards.rewards, cfg)
    opt = _restore(st, cfg.lr if "lr" in arm.overrides else None)
    gnorm, loss = _replay(replace(tr, config=cfg, advantages=adv), st.model)
    clip = cfg.max_grad_norm if "max_grad_norm" in arm.overrides else cap.grpo_config.get("max_grad_norm")
    if clip:
        torch.nn.utils.clip_grad_norm_(st.model.parameters(), float(clip))
    post = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in st.model.parameters()
                                                       if p.grad is not None])))
    opt.step()
    return gnorm, post, loss, cfg, adv, opt.param_groups[0]["lr"]


def _replay(trace, model) -> tuple:
    """verify-capture's replay (TRL's forward and per-micro-batch loss, gradients accumulated in `model`), also
    returning the loss: (pre-clip grad norm, Σ micro-batch losses as TRL returned them)."""
    from rookworld_debug.trl.build import _loss
    from rookworld_debug.trl.verify import trl_logps_and_entropy
    r, cap, cfg = trace.rollout, trace.capture, trace.config
    old, ref = cap.old_per_token_logps, r.ref_per_token_logps
    temperature = float(cap.grpo_config.get("temperature", 1.0))
    total = 0.0
    for rows in cap.micro_batch_rows:
        idx = torch.tensor(rows, dtype=torch.long)
        logps, ent = trl_logps_and_entropy(model, r.prompt_ids[idx], r.prompt_mask[idx], r.completion_ids[idx],
                                           r.completion_mask[idx], temperature)               # (n, T) each
        loss = _loss(logps, logps.detach() if old is None else old[idx], None if ref is None else ref[idx],
                     trace.advantages.advantages[idx], r.completion_mask[idx], ent, cfg, cap.num_items_in_batch,
                     ga=cap.gradient_accumulation_steps, num_generations=cfg.num_generations)
        loss.loss.backward()
        total += float(loss.loss.detach())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))), total


def one_step_arm(st: TRLState, arm: Arm) -> OneStepArm:
    from rookworld_debug.grpo.phases.evaluation import _pearson
    from rookworld_debug.trl.verify import trl_logps_and_entropy
    t0 = time.perf_counter()
    tr, r = st.trace, st.trace.rollout
    gnorm, post, loss, cfg, adv, lr = _replay_update(st, arm)
    temp = float(tr.capture.grpo_config.get("temperature", 1.0))
    with torch.no_grad():
        lp, ent = trl_logps_and_entropy(st.model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                        temp)                                                  # (N, T) each
    m = r.completion_mask.to(lp.dtype)
    msum = m.sum().clamp(min=1)
    dl = (lp - r.per_token_logps) * m                                                          # (N, T)
    ratio, on = torch.exp(dl), m.bool()
    outside = ((ratio < 1 - cfg.epsilon_low) | (ratio > 1 + cfg.epsilon_high)) & on
    kl = math.nan
    if r.ref_per_token_logps is not None:
        d = (r.ref_per_token_logps - lp) * m
        kl = float(((torch.exp(d) - d - 1) * m).sum() / msum)
    delta, layers = update_to_weight(st.model, st.weights)
    before_g, after_g, changed = _greedy(st)
    per_row = dl.sum(1) / m.sum(1).clamp(min=1)
    return OneStepArm(arm.name, dict(arm.overrides), loss, gnorm, post, lr, 1, delta, layers, kl,
                      float(ratio[on].mean()), float(ratio[on].max()), float(outside.sum() / on.sum().clamp(min=1)),
                      float(dl.sum() / msum), _pearson(adv.advantages.to(per_row.dtype), per_row),
                      float((ent * m).sum() / msum), before_g, after_g, changed, time.perf_counter() - t0)


def _greedy(st: TRLState) -> tuple:
    """Greedy on the captured prompts before (the --before weights) and after the arm's update: mean built-in
    reward (dataset labels) and how many completions changed; NaN without the checkpoint's tokenizer."""
    from rookworld_debug.grpo.phases.evaluation import greedy_evals
    if st.tokenizer is None:
        return math.nan, math.nan, 0
    b = st.trace.setup.batch
    batch = (list(b.prompts), list(b.tasks), list(b.completions))
    n = int(st.trace.config.max_new_tokens)
    st.model.eval()
    after, _ = greedy_evals(st.model, st.tokenizer, batch, None, max_new_tokens=n, reward_mode="dataset")
    if st.greedy_before is None:
        saved = {k: p.detach().clone() for k, p in st.model.named_parameters()}
        with torch.no_grad():
            for k, p in st.model.named_parameters():
                p.copy_(st.weights[k])
        st.greedy_before, _ = greedy_evals(st.model, st.tokenizer, batch, None, max_new_tokens=n,
                                           reward_mode="dataset")
        with torch.no_grad():
            for k, p in st.model.named_parameters():
                p.copy_(saved[k])
    before = st.greedy_before
    st.model.train()
    return before.mean_reward, after.mean_reward, sum(a != c for a, c in zip(after.completions, before.completions))


def trl_self_check(st: TRLState, unchanged: OneStepArm):
    """Stages of the unchanged arm's replay vs the capture (module doc); the update vs checkpoint-<step>."""
    from rookworld_debug.grpo.families import advantages_from_config
    from rookworld_debug.trl.verify import compare, trl_logps_and_entropy
    from rookworld_debug.whatif.selfcheck import _max_diff
    tr, cap, r = st.trace, st.trace.capture, st.trace.rollout
    stages = [_rewards_stage(st)]
    d = _max_diff(advantages_from_config(tr.rewards.rewards, tr.config).advantages, tr.advantages.advantages)
    stages.append(stage("advantages", 0.0, d, "max |recomputed − TRL's| advantage over the N rows", diff=d))
    trained = torch.zeros(r.completion_ids.shape[0], dtype=torch.bool)
    for rows in cap.micro_batch_rows:
        trained[list(rows)] = True
    with torch.no_grad():
        for n, p in st.model.named_parameters():
            p.copy_(st.weights[n])
        lp, _ = trl_logps_and_entropy(st.model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                      float(cap.grpo_config.get("temperature", 1.0)))         # (N, T)
    mask = r.completion_mask.double() * trained[:, None]
    d = _max_diff(lp, r.per_token_logps, mask)
    stages.append(stage("log-probs", 0.0, d, "max |logπ(--before weights) − captured logπ| over the step's tokens",
                        diff=d))
    stages.append(stage("loss", cap.trl_loss, unchanged.loss, "Σ over micro-batches of the loss TRL returned"))
    stages.append(stage("gradient", cap.grad_norm, unchanged.grad_norm_pre_clip,
                        "global L2 grad norm before clipping (the Trainer's)"))
    if st.after is None:
        stages.append(StageCheck("update", math.nan, unchanged.param_delta_norm, math.nan, math.nan, None,
                                 "no checkpoint saved after the step next to --before"))
    elif cap.grad_norm == 0:
        stages.append(StageCheck("update", math.nan, unchanged.param_delta_norm, math.nan, math.nan, None,
                                 "the recorded gradient is exactly 0: Adam scales the replay's float noise (‖g‖ = "
                                 f"{unchanged.grad_norm_pre_clip:.2g}) to a full step, so the update is not comparable"))
    else:
        _replay_update(st, Arm("unchanged", {}))
        from rookworld_debug.trl.verify import _load_weights
        layers = compare(st.model, st.weights, _load_weights(st.after))
        worst = max(layers, key=lambda c: c.rel)
        stages.append(StageCheck("update", 0.0, worst.rel, worst.rel, 0.05, all(c.ok for c in layers),
                                 f"largest per-layer ‖θ_replayed − θ_after‖₂ / ‖θ_after − θ_before‖₂ ({worst.layer}) "
                                 f"vs {st.after.name}"))
    return self_check(stages, st.notes)


def _rewards_stage(st: TRLState) -> StageCheck:
    from rookworld_debug.grpo.phases.rewards import compute_rewards
    from rookworld_debug.whatif.selfcheck import _max_diff
    tr, cap, r = st.trace, st.trace.capture, st.trace.rollout
    names = tuple(cap.reward_func_names)
    labels = cap.dataset_columns.get("label") if isinstance(cap.dataset_columns, dict) else None
    if not set(names) <= {"rookworld_p", "rookworld_a"} or labels is None or len(labels) != len(r.completions):
        return StageCheck("rewards", math.nan, math.nan, math.nan, math.nan, None,
                          f"reward functions {list(names)} are not this package's (cannot recompute)")
    again = compute_rewards(r.prompts, r.completions, r.tasks, labels=list(labels), reward_mode=tr.config.reward_mode)
    d = _max_diff(again.rewards, tr.rewards.rewards)
    return stage("rewards", 0.0, d, "max |recomputed − captured| reward over the N rows", diff=d)


def grpo_overrides(arm: Arm, grpo_fields: Sequence[str]) -> dict:
    """The arm's StepConfig overrides as GRPOConfig fields (ConfigError for one TRL has no field for)."""
    out = {}
    for k, v in arm.overrides.items():
        name = STEP_TO_GRPO.get(k, k)
        if name not in grpo_fields:
            raise ConfigError(k, f"arm {arm.name!r}: no GRPOConfig counterpart; a TRL branch can change "
                              "GRPOConfig settings only")
        out[name] = v
    return out
