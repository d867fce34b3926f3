"""A recorded step's pieces → a `StepTrace` whose records hold the loop's own tensors.

Shape legend: N rows (B prompts × G, the loop's order), T completion tokens, P prompt tokens, K reward functions.
The loop's values are kept as they are (rewards, advantages, log-probs, mask); the project's functions build
what the loop did not record (group statistics, the loss decomposition of the declared objective), and every
place where the two may part ways is a flag, not a silent substitution.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math

import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.data.loaders import Batch
from rookworld_debug.errors import DataError
from rookworld_debug.grpo.families import advantages_from_config
from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.phases.generation import Rollout, rollout_of
from rookworld_debug.grpo.phases.rewards import (BUILTIN_REWARDS, LABEL_REWARD_MODES, builtin_breakdowns,
                                                 compute_rewards, with_breakdowns)
from rookworld_debug.grpo.phases.setup import Setup
from rookworld_debug.grpo.phases.update import UpdateResult, layer_name
from rookworld_debug.grpo.step import StepTrace, rewards_flags, zero_std_flags

SOURCE = "your own training loop (rookworld_debug.record.StepRecorder)"
NO_EVAL_FLAG = ("recorded step: no greedy before/after evaluation and no step-0 invariants (the loop recorded the "
                "step it took; the replay checks each phase against the declared objective)")


def rows_of(values, n: int, g: int, what: str) -> tuple:
    """B values (one per prompt) repeated G times, or N values as given."""
    values = tuple(values)
    if len(values) == n:
        return values
    if len(values) * g == n:
        return tuple(v for v in values for _ in range(g))
    raise DataError(f"{what}: {len(values)} values for {n} rows (give B = {n // max(g, 1)} or N = {n})")


def _disagree(keyword: str, declared, recorded, how: str) -> DataError:
    return DataError(f"{keyword}: declared {declared!r}, but the step recorded {recorded} ({how}); declare the "
                     "number the loop used")


def check_sizes(rec, n: int, prompts_b) -> None:
    """Each size the loop declared against the one its recorded step shows, refused by name where they disagree
    (the trace's config is built from the recorded rows: a declared number that differs would be dropped)."""
    d, g = rec.declared, rec.declared["num_generations"]
    if n % g:
        raise _disagree("num_generations", g, f"{n} rows", f"not whole groups of {g}")
    b = len(prompts_b) if prompts_b is not None else n // g
    if b not in (n, n // g) and b and n % b == 0:
        raise _disagree("num_generations", g, f"{n // b} completions per prompt", f"{b} prompts for {n} rows")
    if "batch_size" in d and d["batch_size"] != n // g:
        raise _disagree("batch_size", d["batch_size"], f"{n // g} prompts", f"{n} rows in groups of {g}")
    k = rec.gradient_accumulation_steps
    # the declared count is the divisor of each micro-batch's loss: torch.chunk may make fewer micro-batches of
    # ⌈N/k⌉ rows (6 rows, k = 4: 3 of 2, each ÷ 4, as a loop that chunks its rows computes), never more than N
    if n and k > n:
        raise _disagree("gradient_accumulation_steps", k, f"{n} rows",
                        f"{k} micro-batches need at least {k} rows")
    if "micro_batch_size" in d and d["micro_batch_size"] is not None and n % d["micro_batch_size"] == 0 \
            and n // d["micro_batch_size"] != k:
        raise DataError(f"micro_batch_size: declared {d['micro_batch_size']}, so {n} recorded rows make "
                        f"{n // d['micro_batch_size']} micro-batches, but gradient_accumulation_steps is {k}; "
                        "declare the numbers the loop used")
    longest = _longest(rec.pieces["rollout"]["completion_mask"])
    if "max_new_tokens" in d and longest > d["max_new_tokens"]:
        raise _disagree("max_new_tokens", d["max_new_tokens"], f"a completion of {longest} tokens",
                        "the longest, counted through its last token in the loss mask")


def _longest(mask: torch.Tensor) -> int:
    """The longest completion: the last position any row's loss mask keeps, + 1 (0 when none is kept)."""
    kept = mask.bool().any(0).nonzero()
    return int(kept.max()) + 1 if kept.numel() else 0


def _check_shape(name: str, x, shape: tuple) -> None:
    if x is not None and tuple(x.shape) != shape:
        raise DataError(f"{name}: shape {tuple(x.shape)}, but the rollout's completions are {shape}")


def _config(rec, n: int, t: int) -> StepConfig:
    kind, settings, *_ = rec.pieces.get("optimizer_state", ("", {}, None, (), ()))
    opt = {}
    if "lr" in settings:
        opt["lr"] = float(settings["lr"])
    if isinstance(settings.get("betas"), list) and len(settings["betas"]) == 2:
        opt["adam_betas"] = tuple(settings["betas"])
    for k, field in (("eps", "adam_eps"), ("weight_decay", "weight_decay")):
        if isinstance(settings.get(k), (int, float)):
            opt[field] = float(settings[k])
    prompts = rec.pieces.get("batch", ((), None, None))[0]
    task = "A" if prompts and all(p.lstrip().startswith("A:") for p in prompts) else \
        "P" if all(p.lstrip().startswith("P:") for p in prompts) else "mixed"
    g = rec.declared["num_generations"]
    # a declared max_new_tokens is the loop's budget (checked against the longest completion); else the row width
    return StepConfig(**{**rec.declared, **opt, "batch_size": n // g,
                         "max_new_tokens": rec.declared.get("max_new_tokens", t), "model": "tiny",
                         "dtype": rec.pieces.get("dtype", "float32"),
                         "task": task})


def _rollout(rec, config: StepConfig, prompts: tuple, tasks: tuple) -> Rollout:
    r, tok = rec.pieces["rollout"], rec.tokenizer
    ids, mask = r["completion_ids"], r["completion_mask"]                                 # (N, T)
    n, t = ids.shape
    g = config.num_generations
    nan = torch.full((n, t), math.nan)
    logps = rec.pieces.get("policy_logps", rec.pieces.get("old_logps"))
    for name in ("sampling_logps", "policy_logps", "old_logps", "ref_logps"):
        _check_shape(name, rec.pieces.get(name), (n, t))
        x = rec.pieces.get(name)
        if x is not None and not bool((torch.isfinite(x) | (mask == 0)).all()):
            raise DataError(f"{name}: non-finite log-probs on tokens the loss mask keeps (−inf or NaN is allowed "
                            "only where completion_mask is 0)")
    _check_shape("prompt_mask", r["prompt_mask"], tuple(r["prompt_ids"].shape))
    if r["prompt_ids"].shape[0] != n:
        raise DataError(f"prompt_ids: {r['prompt_ids'].shape[0]} rows for {n} completion rows")
    ref = rec.pieces.get("ref_logps")
    return rollout_of(
        tok, prompt_ids=r["prompt_ids"], prompt_mask=r["prompt_mask"], completion_ids=ids, completion_mask=mask,
        prompts=prompts, tasks=tasks, completions=r["completions"],
        per_token_logps=(logps if logps is not None else nan).masked_fill(mask == 0, 0.0),
        ref_per_token_logps=None if ref is None else ref.masked_fill(mask == 0, 0.0),
        per_token_entropy=nan.masked_fill(mask == 0, 0.0),
        sampling_per_token_logps=rec.pieces["sampling_logps"].masked_fill(mask == 0, 0.0)
        if "sampling_logps" in rec.pieces else nan, temperature=config.p_temperature,
        top_p=config.p_top_p, top_k=config.top_k, num_generations=g, max_new_tokens=t, seed=config.seed,
        warnings=("log-probs are the loop's own; entropy is not recorded by a loop (shown as NaN)",))


def _rewards(rec, config, rollout: Rollout, labels):
    total, cols = rec.pieces["rewards"]
    n = len(rollout.prompts)
    for name, col in cols.items():
        if col.numel() != n:
            raise DataError(f"rewards[{name!r}]: {col.numel()} values for {n} rows")
    funcs = {name: (lambda c: (lambda **_: [None if math.isnan(v) else v for v in c.tolist()]))(col)
             for name, col in cols.items()}
    rw = compute_rewards(rollout.prompts, rollout.completions, rollout.tasks, labels=list(labels or ()),
                         reward_mode=config.reward_mode, engine=None, reward_funcs=funcs, use_builtin=False)
    if total.numel() != n:
        raise DataError(f"rewards: {total.numel()} values for {n} rows")
    rw = dataclasses.replace(rw, rewards=total)       # the loop's own total (its weighting, not ours)
    if rec.reward in BUILTIN_REWARDS and labels and config.reward_mode in LABEL_REWARD_MODES:
        # the components and format checks behind a RookWorld reward, for the views (values stay the loop's)
        rw = with_breakdowns(rw, builtin_breakdowns(rollout.prompts, rollout.completions, labels,
                                                    reward_mode=config.reward_mode))
    return rw


def _update(rec, config, loss_value: float, record_loss: float, n_mb: int):
    p = rec.pieces
    grad, before, after = p.get("gradient"), p.get("weights_before"), p.get("weights_after")
    if grad is None and after is None:
        return None
    norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in grad.values())) if grad else math.nan
    clip = config.max_grad_norm
    coef = min(1.0, clip / (norm + 1e-6)) if clip and math.isfinite(norm) else 1.0
    per_layer: dict = {}
    for name, v in (grad or {}).items():
        per_layer.setdefault(layer_name(name), 0.0)
        per_layer[layer_name(name)] += float(v.double().pow(2).sum())
    delta = math.sqrt(sum(float((after[k].double() - before[k].double()).pow(2).sum()) for k in after)) \
        if before is not None and after is not None else math.nan
    return UpdateResult(loss=loss_value, loss_record_diff=abs(loss_value - record_loss), grad_norm_pre_clip=norm,
                        grad_norm_post_clip=norm * coef, clip_coef=coef,
                        per_layer={k: {"total": math.sqrt(v)} for k, v in per_layer.items()}, per_term_global={},
                        lr=config.lr, micro_batches=n_mb, param_delta_norm=delta, seconds=math.nan,
                        counts={"backward": n_mb})


def build_trace(rec) -> StepTrace:
    p = rec.pieces
    if "rollout" not in p:
        raise DataError("a recorded step needs at least its rollout (StepRecorder.rollout): the completion ids "
                        "and the loss mask every other record refers to")
    ids = p["rollout"]["completion_ids"]
    n, t = ids.shape
    g = rec.declared["num_generations"]
    prompts_b, labels, tasks = p.get("batch", (None, None, None))
    check_sizes(rec, n, prompts_b)
    if prompts_b is None:
        texts = rec.tokenizer.batch_decode(p["rollout"]["prompt_ids"], skip_special_tokens=True)
        prompts_b = tuple(texts)
    prompts = rows_of(prompts_b, n, g, "batch prompts")
    labels_n = rows_of(labels, n, g, "batch labels") if labels is not None else None
    tasks = rows_of(tasks, n, g, "batch tasks") if tasks is not None else \
        tuple("A" if x.lstrip().startswith("A:") else "P" for x in prompts)
    config = _config(rec, n, t)
    rollout = _rollout(rec, config, prompts, tasks)
    flags = [NO_EVAL_FLAG, *rec.rank_flags]
    if "rewards" in p:
        rewards = _rewards(rec, config, rollout, labels_n)
    else:
        rewards = _rewards_missing(config, rollout, labels_n)
        flags.append("rewards not recorded: shown as NaN")
    ours = advantages_from_config(rewards.rewards, config)
    recorded_adv = p.get("advantages")
    if recorded_adv is not None and recorded_adv.numel() != n:
        raise DataError(f"advantages: {recorded_adv.numel()} values for {n} rows")
    advantages = dataclasses.replace(ours, advantages=recorded_adv) if recorded_adv is not None else ours
    if recorded_adv is None:
        flags.append("advantages not recorded: the record shows the declared objective's advantages of the "
                     "recorded rewards")
    mask = rollout.completion_mask
    objective = Objective.from_config(config)
    if objective.beta and rollout.ref_per_token_logps is None:     # the KL term cannot be shown without them
        objective = objective.replace(beta=0.0)
        flags.append(f"reference log-probs not recorded: the loss record shows the declared objective without its "
                     f"β = {config.beta:g} KL term")
    loss = compute_loss(rollout.per_token_logps, p.get("old_logps"), rollout.ref_per_token_logps,
                        advantages.advantages, mask, objective,
                        LossBatch(num_items_in_batch=mask.sum(), num_generations=g))
    loss = dataclasses.replace(loss, definition=loss.definition + " — recomputed by the project's loss for the "
                               "declared objective from the loop's recorded log-probs, advantages and mask")
    loss_value = p.get("loss", math.nan)
    update = _update(rec, config, loss_value, float(loss.loss), rec.gradient_accumulation_steps)
    flags += [*rollout.warnings, *rewards_flags(rewards), *ours.flags,
              *zero_std_flags(advantages, rollout.prompts, rewards), *loss.flags]
    setup = _setup(rec, config, rollout, labels_n)
    return StepTrace(config=config, setup=setup, before=None, before_heldout=None, rollout=rollout, rewards=rewards,
                     advantages=advantages, loss=loss, update=update, evaluation=None, timings={},
                     counts={"generation/tokens": int(mask.sum())}, flags=tuple(flags),
                     recorded=rec.recorded_record(config, loss_value))


def _rewards_missing(config, rollout, labels):
    n = len(rollout.prompts)
    funcs = {"not recorded": lambda **_: [None] * n}
    return compute_rewards(rollout.prompts, rollout.completions, rollout.tasks, labels=list(labels or ()),
                           reward_mode=config.reward_mode, engine=None, reward_funcs=funcs, use_builtin=False)


def _setup(rec, config, rollout, labels) -> Setup:
    g = config.num_generations
    prompts_b = tuple(rollout.prompts[::g])
    provenance = {"source": SOURCE, "trainer": rec.trainer, "model": "recorded weights (state/)"
                  if "weights_before" in rec.pieces else "not recorded", "weights_sha256": None,
                  "dtype": rec.pieces.get("dtype", "float32"), "reward": rec.reward,
                  "precision": {role: {"dtype": dt, "device": "cpu", "autocast": None, "compute": dt}
                                for role, dt in (("policy", rec.pieces.get("dtype", "float32")),
                                                 ("sampler", rec.sampler_precision or rec.pieces.get("dtype",
                                                                                                     "float32")))}}
    batch = Batch(prompts=prompts_b, completions=tuple(labels[::g]) if labels else tuple("" for _ in prompts_b),
                  tasks=tuple(rollout.tasks[::g]), indices=tuple(range(len(prompts_b))), task_filter=config.task,
                  seed=config.seed, batch_hash=hashlib.sha256("\n".join(prompts_b).encode()).hexdigest(),
                  source=f"recorded by {rec.trainer}")
    return Setup(config=config, policy=None, reference=None, tokenizer=None, engine=None, optimizer=None,
                 provenance=provenance, batch=batch, heldout=(), invariants=None, seconds=math.nan)
