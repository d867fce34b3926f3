"""Captured TRL tensors → a `StepTrace` whose records are built from what TRL computed.

Shape legend: N rows of the generation batch (B prompts × G, generation order), T completion tokens,
P prompt tokens, K reward functions. TRL's values are kept as they are (advantages, log-probs, mask,
rewards); the project's functions recompute what TRL does not record (group statistics, the loss
decomposition) and each recompute is checked against TRL's number in the record.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Optional

import torch

from rookworld_debug.data.loaders import Batch
from rookworld_debug.errors import FormatError
from rookworld_debug.grpo.families import advantages_from_config
from rookworld_debug.grpo.phases.generation import Rollout, rollout_of
from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.phases.rewards import compute_rewards, with_breakdowns
from rookworld_debug.grpo.phases.setup import Setup
from rookworld_debug.grpo.step import StepTrace, rewards_flags, zero_std_flags
from rookworld_debug.grpo.phases.update import UpdateResult
from rookworld_debug.trl.config_map import grpo_config_to_step_config, model_name, task_of
from rookworld_debug.trl.record import CAPTURE_FORMAT, TRLCapture

LOSS_TOLERANCE = 1e-5          # |recomputed − TRL| of the step loss
ADVANTAGE_TOLERANCE = 1e-5     # max |A(ours) − A(TRL)|; TRL works in float32

NO_EVAL_FLAG = ("TRL capture: no greedy before/after evaluation and no step-0 invariants (GRPOTrainer computes "
                "neither); every number here is the step TRL took")


def _in_generation_order(micro_batches: list, n: int, key: str, fill: Optional[torch.Tensor] = None
                         ) -> Optional[torch.Tensor]:
    """Scatter the micro-batches' (rows, T) tensors back to (N, T) generation order. Every row once, except
    when the step reads a slice of its generation batch (steps_per_generation > gradient_accumulation_steps):
    then rows this step did not train take `fill`'s values, or 0 where TRL kept none for them (the caller flags
    it; those rows are outside the step's loss either way)."""
    parts = [(mb["rows"], mb[key]) for mb in micro_batches if mb.get(key) is not None]
    if not parts:
        return None
    t = parts[0][1]
    out = torch.zeros((n, *t.shape[1:]), dtype=t.dtype)                                 # (N, T)
    if fill is not None:
        out[:] = fill[:, :out.shape[1]] if fill.shape[1] >= out.shape[1] else torch.nn.functional.pad(
            fill, (0, out.shape[1] - fill.shape[1]))
    seen = torch.zeros(n, dtype=torch.long)                                              # (N,)
    for rows, x in parts:
        out[rows] = x
        seen[rows] += 1
    if bool((seen > 1).any()):
        raise RuntimeError(f"{key}: rows seen {seen.tolist()} times by the step's micro-batches (expected at most "
                           "once each)")
    return out


def _step_rows(micro_batches: list, n: int) -> torch.Tensor:
    """(N,) bool: the rows of the generation batch this optimizer step trained on."""
    seen = torch.zeros(n, dtype=torch.bool)
    for mb in micro_batches:
        seen[mb["rows"]] = True
    return seen


def _texts(prompts) -> list[str]:
    bad = next((p for p in prompts if not isinstance(p, str)), None)
    if bad is not None:
        raise FormatError(f"conversational prompts are not supported by the capture views (got {bad!r:.80})")
    return list(prompts)


def _rollout(tok, gen: dict, logps, entropy, temperature, top_p, top_k, g: int, max_new: int, seed: int) -> Rollout:
    ids, mask = gen["completion_ids"], gen["completion_mask"]                            # (N, T)
    prompts = _texts(gen["prompts"])
    sampling = gen.get("sampling_per_token_logps")
    return rollout_of(
        tok, prompt_ids=gen["prompt_ids"], prompt_mask=gen["prompt_mask"], completion_ids=ids, completion_mask=mask,
        prompts=prompts, tasks=tuple("A" if p.lstrip().startswith("A:") else "P" for p in prompts),
        completions=gen["completions"], per_token_logps=torch.nan_to_num(logps) * mask,
        ref_per_token_logps=gen["ref_per_token_logps"] * mask if "ref_per_token_logps" in gen else None,
        per_token_entropy=torch.nan_to_num(entropy) * mask,
        sampling_per_token_logps=sampling if sampling is not None else torch.full(ids.shape, float("nan")),
        temperature=temperature, top_p=top_p, top_k=top_k, num_generations=g, max_new_tokens=max_new, seed=seed,
        warnings=("log-probs and entropies are TRL's loss forward (fused LM head, logits ÷ T); TRL keeps no "
                  "sampling-time log-probs without vLLM and no top-k alternatives",))


def _rewards(gen: dict, names, weights, prompts, completions, tasks, config):
    per_func = gen["rewards_per_func"].double()                                          # (N, K)
    funcs = {name: (lambda k: (lambda **_: [None if math.isnan(v) else v for v in per_func[:, k].tolist()]))(k)
             for k, name in enumerate(names)}
    labels = gen.get("columns", {}).get("label") or ()
    rw = compute_rewards(prompts, completions, tasks, labels=list(labels) if labels else (),
                         reward_mode=config.reward_mode, engine=None, reward_funcs=funcs,
                         reward_weights=dict(zip(names, weights)), use_builtin=False)
    # the components behind each value, from the project's reward functions (None: another function's row)
    per_row = [None] * len(prompts)
    for bds in gen.get("breakdowns") or ():
        if bds is not None and len(bds) == len(prompts):
            per_row = [a if a is not None else b for a, b in zip(per_row, bds)]
    return with_breakdowns(rw, per_row)


def _mb_items(mb: dict, default):
    """The num_items_in_batch TRL passed with this micro-batch (its generation batch's), else the step's."""
    v = mb.get("num_items_in_batch")
    return float(v) if v is not None else default


def _loss(logps, old, ref, adv, mask, entropy, config, num_items, ga: int = 1, num_generations=None,
          spg: Optional[int] = None):
    """grpo.objective.loss.compute_loss with the config's objective."""
    return compute_loss(logps, old, ref, adv, mask, Objective.from_config(config),
                        LossBatch(entropy=entropy, num_items_in_batch=num_items, gradient_accumulation_steps=ga,
                                  steps_per_generation=spg, num_generations=num_generations))


def _step_rows_loss(rollout, old, adv, step_mask, config, num_items, g: int, mb_records: list, num_processes: int,
                    *, ga: int, spg: int):
    """The loss record of the rows one optimizer step trained, on the generation batch's N rows: per-token values,
    KL/entropy/clip metrics over the step's tokens (`step_mask` (N, T) = 0 on the other rows); the totals and each
    row's contribution are TRL's per-micro-batch losses (`mb_records`: (rows, record) pairs), summed as TRL logs
    them, so `loss` is the step's loss whatever the loss type's aggregation."""
    whole = _loss(rollout.per_token_logps, old, rollout.ref_per_token_logps, adv, step_mask, rollout.per_token_entropy,
                  config, num_items / num_processes, ga=ga, num_generations=g, spg=spg)
    n = step_mask.shape[0]
    total = {k: sum(getattr(rec, k).detach() for _, rec in mb_records) / num_processes
             for k in ("loss", "pg_loss", "kl_loss", "entropy_loss", "entropy_term")}
    rows = {}
    for k in ("per_seq_pg", "per_seq_kl_loss", "per_seq_entropy_term", "per_seq_loss"):
        t = torch.zeros(n, dtype=getattr(whole, k).dtype)                                   # (N,) 0: not trained
        for r, rec in mb_records:
            t[r] = getattr(rec, k).detach().to(t.dtype) / num_processes
        rows[k] = t
    groups = {f"per_group_{k}": rows[f"per_seq_{k}"].reshape(-1, g).sum(1) if whole.per_group_pg is not None else None
              for k in ("pg", "kl_loss", "loss")}                                           # (B,) each
    den = sum(abs(float(total[k])) for k in ("pg_loss", "kl_loss", "entropy_term"))
    return dataclasses.replace(
        whole, **total, **rows, **groups, kl_share=abs(float(total["kl_loss"])) / den if den > 0 else 0.0,
        kl_share_undefined=den == 0,
        definition=whole.definition + " — on the rows this optimizer step trained (the sum of its micro-batch "
                                      "losses as TRL logs it); the generation batch's other rows have mask 0")


def _update(trl_loss, record_loss, grad_norm, per_layer_post, max_grad_norm, lr, n_mb) -> UpdateResult:
    coef = min(1.0, max_grad_norm / (grad_norm + 1e-6)) if max_grad_norm and math.isfinite(grad_norm) else 1.0
    return UpdateResult(loss=trl_loss, loss_record_diff=abs(trl_loss - record_loss), grad_norm_pre_clip=grad_norm,
                        grad_norm_post_clip=grad_norm * coef, clip_coef=coef,
                        per_layer={k: {"total": v / coef} for k, v in per_layer_post.items()}, per_term_global={},
                        lr=lr, micro_batches=n_mb, param_delta_norm=math.nan, seconds=math.nan,
                        counts={"backward": n_mb})


def _capture_flags(args, gen, trained, notes, rollout, rewards, ours, advantages, loss, *, recomputed: float,
                   trl_loss: float, adv_diff: float, logs: Optional[dict]) -> list:
    """The captured step's flags: the phases' own, then where the record and TRL's step may part ways."""
    n = gen["completion_ids"].shape[0]
    flags = [NO_EVAL_FLAG, *notes, *rollout.warnings, *rewards_flags(rewards), *ours.flags,
             *zero_std_flags(advantages, rollout.prompts, rewards), *loss.flags]
    if not bool(trained.all()):
        flags.append(f"steps_per_generation {args.steps_per_generation} > gradient_accumulation_steps "
                     f"{args.gradient_accumulation_steps}: this step trained {int(trained.sum())} of the generation "
                     f"batch's {n} rows (capture.micro_batch_rows); the loss, its terms and the loss mask describe "
                     "those rows; the other rows are context (their generation-time log-probs: ratio 1, entropy 0)")
    if len(gen.get("generation_batches", ())) > 1:
        flags.append(f"steps_per_generation {args.steps_per_generation} < gradient_accumulation_steps "
                     f"{args.gradient_accumulation_steps}: this step read {len(gen['generation_batches'])} generation "
                     f"batches ({gen['generation_batches']} rows), stacked in generation order")
    if abs(recomputed - trl_loss) > LOSS_TOLERANCE:
        flags.append(f"recomputed loss {recomputed:.8g} differs from TRL's {trl_loss:.8g} by "
                     f"{abs(recomputed - trl_loss):.3g} (> {LOSS_TOLERANCE:g}): views may not describe TRL's step")
    if not adv_diff <= ADVANTAGE_TOLERANCE:
        flags.append(f"grpo.phases.advantages differs from TRL's advantages by up to {adv_diff:.3g}; the record shows TRL's")
    if logs is not None and "loss" in logs and abs(float(logs["loss"]) - trl_loss) > LOSS_TOLERANCE:
        flags.append(f"TRL logged loss {logs['loss']} ≠ this step's loss {trl_loss:.8g}: logging_steps > 1 averages "
                     "several steps")
    return flags


def _precision(trainer, policy) -> dict:
    """The precision of each forward of TRL's step (policy, reference, sampler = the policy without vLLM)."""
    args = trainer.args
    auto = "bfloat16" if getattr(args, "bf16", False) else "float16" if getattr(args, "fp16", False) else None

    def one(model):
        p = next(model.parameters())
        dtype = str(p.dtype).removeprefix("torch.")
        return {"device": str(p.device), "dtype": dtype, "autocast": auto, "compute": auto or dtype}
    ref = getattr(trainer, "ref_model", None)
    out = {"policy": one(policy), "sampler": one(policy)}
    if ref is not None:
        out["reference"] = one(ref)
    return out


def _capture_setup(trainer, policy, config, prompts, rollout, gen, names, weights, *, step: int, reasons: tuple,
                   weights_sha256: Optional[str], num_processes: int) -> Setup:
    """The Setup record of a captured step: provenance (versions, weights hash, ranks) and the batch it trained on."""
    import transformers
    import trl

    args = trainer.args
    n, g = gen["completion_ids"].shape[0], int(trainer.num_generations)
    provenance = {"source": "trl.GRPOTrainer capture", "model": config.model, "weights_sha256": weights_sha256,
                  "num_parameters": sum(p.numel() for p in policy.parameters()), "dtype": config.dtype,
                  "model_type": getattr(policy.config, "model_type", None),
                  "weights_sha256_at": (f"start of step {step} (before its update)" if weights_sha256 else
                                        "not hashed"),
                  "capture_reasons": list(reasons),
                  "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                               "torch": torch.__version__}, "global_step": step,
                  "output_dir": str(args.output_dir), "reward_funcs": list(names), "reward_weights": list(weights),
                  "num_processes": num_processes,
                  "rows_per_process": list(gen.get("local_rows", [n])), "precision": _precision(trainer, policy),
                  "trl_logprob_path": trl_logprob_path(policy, args)}
    batch_prompts = tuple(prompts[::g])
    batch = Batch(prompts=batch_prompts, completions=tuple(gen.get("columns", {}).get("label", [""] * n)[::g]),
                  tasks=tuple(rollout.tasks[::g]), indices=tuple(range(len(batch_prompts))), task_filter=config.task,
                  seed=int(args.seed), batch_hash=hashlib.sha256("\n".join(batch_prompts).encode()).hexdigest(),
                  source=f"TRL train_dataset, step {step}")
    return Setup(config=config, policy=None, reference=None, tokenizer=None, engine=None, optimizer=None,
                 provenance=provenance, batch=batch, heldout=(), invariants=None, seconds=math.nan)


def model_generation_config(policy) -> dict:
    """The policy's generation_config keys that differ from transformers' defaults, plain values only (what
    generate() fills in where TRL's own GenerationConfig leaves a key unset)."""
    gc = getattr(policy, "generation_config", None)
    try:
        diff = gc.to_diff_dict() if gc is not None else {}
    except (AttributeError, TypeError, ValueError):
        return {}
    return {k: v for k, v in diff.items() if k != "transformers_version" and _plain(v)}


def _plain(v, depth: int = 0) -> bool:
    """A JSON value of numbers, strings and lists of them (bad_words_ids: a list of lists), two levels deep."""
    if isinstance(v, (bool, int, float, str, type(None))):
        return True
    return isinstance(v, (list, tuple)) and depth < 2 and all(_plain(x, depth + 1) for x in v)


def trl_logprob_path(policy, args) -> str:
    """How TRL's GRPOTrainer computed the captured step's log-probs, and what that means for the comparison with the
    record (which recomputes them with one full-vocabulary fp32 log-softmax per position)."""
    try:
        from trl.kernels.chunked_logprob import _use_triton
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as chunk
    except ImportError:                  # a TRL without the fused head: the logits path
        return "TRL's logits path (log-softmax of the full logits, gathered): the record's own computation"
    dev = next(policy.parameters()).device
    kernel = ("Triton kernels on the valid positions only" if _use_triton(dev) else
              "PyTorch on every position (no Triton for this device)")
    lm_fp32 = " with the LM head cast to fp32" if getattr(args, "cast_lm_head_to_fp32", False) else ""
    amp = " under bf16 autocast" if getattr(args, "bf16", False) and dev.type == "cuda" else ""
    return (f"TRL's fused LM head on {dev.type}: log-probs and entropy from the hidden states in vocabulary chunks of "
            f"{chunk}, {kernel}{lm_fp32}{amp}; the (N, T, V) logits are never built. The record's full log-softmax "
            "sums in another order: expect agreement to float32 rounding in fp32, to bf16 rounding under autocast")


def build_captured_trace(trainer, *, gen: dict, micro_batches: list, logs: Optional[dict], step: int,
                         grad_norm: float, per_layer_post_clip: dict, step_metrics: dict, learning_rate: float,
                         weights_sha256: Optional[str], cost: dict, reasons: tuple = (),
                         num_processes: int = 1) -> StepTrace:
    import transformers
    import trl

    args = trainer.args
    n = gen["completion_ids"].shape[0]
    g = int(trainer.num_generations)
    trained = _step_rows(micro_batches, n)                                              # (N,)
    # a slice of the generation batch (steps_per_generation > grad. acc. steps): TRL computed the old log-probs
    # of every row at generation; rows this step did not train show those (ratio 1) and entropy 0, flagged
    gen_old = gen.get("old_per_token_logps") if not bool(trained.all()) else None       # (N, T) | None
    logps = _in_generation_order(micro_batches, n, "per_token_logps", gen_old)         # (N, T)
    entropy = _in_generation_order(micro_batches, n, "entropy",
                                   None if gen_old is None else torch.zeros_like(gen_old))  # (N, T)
    old = _in_generation_order(micro_batches, n, "old_per_token_logps", gen_old)        # (N, T) | None
    prompts = _texts(gen["prompts"])
    policy = trainer.accelerator.unwrap_model(trainer.model)
    config, unmapped, notes = grpo_config_to_step_config(
        args, batch_size=n // g, task=task_of(prompts), model=str(model_name(trainer)),
        reward_funcs=trainer.reward_funcs, device=str(trainer.accelerator.device.type),
        dtype=str(next(policy.parameters()).dtype).removeprefix("torch."))
    tok = trainer.processing_class
    rollout = _rollout(tok, gen, logps, entropy, args.temperature, args.top_p, args.top_k, g,
                       int(args.max_completion_length), int(args.seed))
    names, weights = tuple(trainer.reward_func_names), tuple(float(w) for w in trainer.reward_weights.tolist())
    rewards = _rewards(gen, names, weights, prompts, list(rollout.completions), list(rollout.tasks), config)
    ours = advantages_from_config(rewards.rewards, config)
    trl_adv = gen["advantages"]                                                         # (N,) as TRL computed it
    adv_diff = float((ours.advantages.double() - trl_adv.double()).abs().max())
    advantages = dataclasses.replace(ours, advantages=trl_adv)

    mask = rollout.completion_mask
    num_items = gen["num_items_in_batch"]
    # TRL's own per-micro-batch scaling, summed like its log; with P processes each rank normalizes by
    # num_items / P (dapo) and the logged loss is the mean over ranks
    mb_records = [(mb["rows"], _loss(
        rollout.per_token_logps[mb["rows"]], None if old is None else old[mb["rows"]],
        None if rollout.ref_per_token_logps is None else rollout.ref_per_token_logps[mb["rows"]],
        trl_adv[mb["rows"]], mask[mb["rows"]], rollout.per_token_entropy[mb["rows"]], config,
        _mb_items(mb, num_items) / num_processes, ga=mb["gradient_accumulation_steps"],
        spg=int(args.steps_per_generation))) for mb in micro_batches]
    recomputed = sum(float(rec.loss) for _, rec in mb_records) / num_processes
    if bool(trained.all()):
        loss = _loss(rollout.per_token_logps, old, rollout.ref_per_token_logps, trl_adv, mask,
                     rollout.per_token_entropy, config, num_items, num_generations=g)
    else:                  # one generation batch feeds several optimizer steps: the record is THIS step's rows
        loss = _step_rows_loss(rollout, old, trl_adv, mask * trained[:, None], config, num_items, g, mb_records,
                               num_processes, ga=int(args.gradient_accumulation_steps),
                               spg=int(args.steps_per_generation))
    trl_loss = float(sum(mb["loss"] for mb in micro_batches)) / num_processes
    update = _update(trl_loss, float(loss.loss), grad_norm, per_layer_post_clip, config.max_grad_norm,
                     learning_rate, len(micro_batches))

    flags = _capture_flags(args, gen, trained, notes, rollout, rewards, ours, advantages, loss, recomputed=recomputed,
                           trl_loss=trl_loss, adv_diff=adv_diff, logs=logs)
    if gen_old is None and not bool(trained.all()):
        flags.append(f"TRL kept no log-probs of the {int((~trained).sum())} generation rows this optimizer step did "
                     "not train (old_per_token_logps is None at generation): the record shows 0 for them, and they "
                     "are outside this step's loss")
    setup = _capture_setup(trainer, policy, config, prompts, rollout, gen, names, weights, step=step, reasons=reasons,
                           weights_sha256=weights_sha256, num_processes=num_processes)
    capture = TRLCapture(
        global_step=step, trl_version=trl.__version__, transformers_version=transformers.__version__,
        format=CAPTURE_FORMAT, trl_loss=trl_loss, micro_batch_losses=tuple(mb["loss"] for mb in micro_batches),
        micro_batch_rows=tuple(tuple(mb["rows"].tolist()) for mb in micro_batches), recomputed_loss=recomputed,
        loss_recompute_diff=abs(recomputed - trl_loss), advantages_recompute_diff=adv_diff, logged_metrics=logs,
        step_metrics=step_metrics, grad_norm=grad_norm, learning_rate=learning_rate,
        num_items_in_batch=float(num_items), gradient_accumulation_steps=int(args.gradient_accumulation_steps),
        steps_per_generation=int(args.steps_per_generation), num_iterations=int(trainer.num_iterations),
        generation_step=int(gen["generation_step"]), grpo_config={k: getattr(v, "value", v)
                                                                  for k, v in args.to_dict().items()},
        unmapped=unmapped, mapping_notes=notes, reward_func_names=names, reward_weights=weights,
        old_per_token_logps=old, sampling_per_token_logps=gen.get("sampling_per_token_logps"),
        capture_seconds=float(cost.get("seconds", math.nan)), capture_bytes=int(cost.get("bytes", 0)),
        dataset_columns={k: list(v) for k, v in gen.get("columns", {}).items()},
        generation_config=model_generation_config(policy))
    return StepTrace(config=config, setup=setup, before=None, before_heldout=None, rollout=rollout, rewards=rewards,
                     advantages=advantages, loss=loss, update=update, evaluation=None,
                     timings={"capture": float(cost.get("seconds", math.nan))},
                     counts={"generation/tokens": int(mask.sum()), "update/micro_batches": len(micro_batches)},
                     flags=tuple(flags), capture=capture)
