"""Update phase: backward of the GRPO loss on the SAMPLED ids, grad norms, clip, optimizer step.

Shape legend: B prompts, G generations, N = B·G rows, T completion tokens, P prompt tokens.

Why it looks like this:
- The loss is recomputed with grad from a fresh teacher-forced forward over the rollout's own token
  ids (never re-tokenized text) with the sampling temperature, exactly as TRL does.
- Micro-batches give true gradient accumulation: each micro-batch's loss is weighted so that the
  summed gradient equals the full-batch gradient for every loss_type (the normalizers are global).
- Per-term gradients (PG / KL / entropy) come from one backward per term (`torch.autograd.grad`);
  by linearity their sum IS the total gradient, so we write that sum into `.grad` and need no
  extra backward for the step itself.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from rookworld_debug.errors import ConfigError, NumericalError
from rookworld_debug.grpo.objective.params import Objective
from rookworld_debug.grpo.phases.generation import (auto_micro_batch_size, loss_mask, per_token_logps_and_entropy,
                                                    per_token_logps_entropy_full_kl)
from rookworld_debug.grpo.phases.loss_inputs import loss_inputs
from rookworld_debug.models import memory
from rookworld_debug.models.devices import model_device, on_device

TERMS = ("pg", "kl", "entropy")


@dataclass(frozen=True)
class UpdateResult:
    loss: float                         # total loss value from the grad path (must equal LossBreakdown.loss)
    loss_record_diff: float             # |loss(grad path) − loss(record)|: consistency of the two paths
    grad_norm_pre_clip: float           # global L2 norm of the total gradient before clipping
    grad_norm_post_clip: float          # after clip_grad_norm_(max_grad_norm)
    clip_coef: float                    # min(1, max_norm / (pre + 1e-6)), as torch applies it
    per_layer: dict                     # {layer: {"total": n, "pg": n, "kl": n, "entropy": n}} L2 norms
    per_term_global: dict               # {"pg": n, "kl": n, "entropy": n} global L2 norm of each term's grad
    lr: float
    micro_batches: int
    param_delta_norm: float             # ||θ_after − θ_before||_2 (NaN on the lean path: no snapshot kept)
    seconds: float
    counts: dict = field(default_factory=dict)
    grad_cosine: dict = field(default_factory=dict)  # {"pg_kl", "pg_entropy"}: cosine of the terms' gradients ({} lean)
    rows: tuple = ()                    # (start, stop) of the rollout rows this optimizer step trained on
    per_token_logps: Optional[torch.Tensor] = None   # (n_rows, T) log-probs of the grad forward, detached
    per_token_entropy: Optional[torch.Tensor] = None  # (n_rows, T) entropy of the same forward, detached
    per_token_full_kl: Optional[torch.Tensor] = None  # (n_rows, T) exact KL (kl_estimator='full' with β > 0)
    entropy_coef: float = math.nan      # c_H applied in this step (adaptive entropy: 0 while gated off)


def layer_name(param_name: str) -> str:
    """Group parameters by block: 'transformer.h.3.attn.c_attn.weight' -> 'h.3'."""
    parts = param_name.split(".")
    if "h" in parts:
        i = parts.index("h")
        return f"h.{parts[i + 1]}"
    for key in ("wte", "wpe", "ln_f", "lm_head"):
        if key in parts:
            return key
    return parts[0]


def _micro_slices(n: int, size: int | None) -> list[slice]:
    size = n if not size or size >= n else size
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def make_optimizer(policy: torch.nn.Module, config) -> torch.optim.Optimizer:
    return torch.optim.AdamW(policy.parameters(), lr=config.lr, betas=tuple(config.adam_betas),
                             eps=config.adam_eps, weight_decay=config.weight_decay)


@dataclass
class _Accumulated:
    """What the micro-batch loop leaves behind: per-term gradient buckets (only terms with a gradient: a term
    without one costs no parameter-sized buffer), the loss value, and the detached per-token tensors."""
    term_grads: dict = field(default_factory=dict)        # term -> [grad per parameter] (per_term_grads)
    loss_total: float = 0.0
    forwards: int = 0
    backwards: int = 0
    logps: list = field(default_factory=list)
    entropy: list = field(default_factory=list)
    full_kl: list = field(default_factory=list)


def _micro_batch_terms(policy, reference, rollout, advantages, g_rows, mask, old_rows, config,
                       objective: Objective, num_items, acc: _Accumulated):
    """Forward one micro-batch (rows `g_rows` of the rollout; mask (N, T) its loss mask) with grad and return
    its loss record (unweighted)."""
    ids = (rollout.prompt_ids[g_rows], rollout.prompt_mask[g_rows], rollout.completion_ids[g_rows], mask[g_rows],
           rollout.temperatures[g_rows])
    full_kl = None
    if config.kl_estimator == "full" and config.beta:
        logps, entropy, full_kl = per_token_logps_entropy_full_kl(policy, reference, *ids)   # (n_mb, T) each
        acc.forwards += 2
    else:
        # entropy in the graph only when its bonus is in the loss (TRL): saves 3 (n_mb, T, V) tensors
        logps, entropy = per_token_logps_and_entropy(policy, *ids, with_grad=True,
                                                     entropy_grad=objective.entropy_coef != 0)  # (n_mb, T) each
        acc.forwards += 1
    acc.logps.append(logps.detach())
    acc.entropy.append(entropy.detach())
    if full_kl is not None:
        acc.full_kl.append(full_kl.detach())
    need_entropy = objective.entropy_coef != 0 or objective.top_entropy_quantile < 1 or config.use_adaptive_entropy
    return loss_inputs(rollout, advantages, config, rows=g_rows, logps=logps, old=old_rows,
                       entropy=entropy if need_entropy else None, full_kl=full_kl, objective=objective,
                       num_items_in_batch=num_items, mask=mask).loss()


def _backward(terms: dict, params, per_term_grads: bool, acc: _Accumulated) -> None:
    """Per-term gradients: one backward per term that has a gradient (their sum is the total, by linearity);
    lean path: one .backward() of the total into .grad, as TRL does.

    Each term's backward accumulates into its own buffers through `.grad` (swapped in before, taken out after):
    autograd adds one parameter's gradient at a time in place, where `autograd.grad` would hold a whole
    parameter-sized set of gradients beside the buffers (0.5 GB on GPT-2 124M)."""
    if not per_term_grads:
        (terms["pg"] + terms["kl"] + terms["entropy"]).backward()
        acc.backwards += 1
        return
    live = [t for t in TERMS if terms[t].requires_grad]
    for i, t in enumerate(live):
        for (_, p), g in zip(params, acc.term_grads.get(t) or [None] * len(params)):
            p.grad = g
        terms[t].backward(retain_graph=i < len(live) - 1)
        acc.term_grads[t] = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in params]
    for _, p in params:
        p.grad = None
    acc.backwards += len(live)


def _term_stats(params, term_grads: dict) -> tuple[dict, dict, dict]:
    """Per-layer and global L2 norms of each term's gradient, and the PG–KL / PG–entropy cosines (a term without
    a bucket had no gradient: norm 0, cosine NaN)."""
    sq: dict[str, dict[str, float]] = {}
    for j, (name, _) in enumerate(params):
        layer = sq.setdefault(layer_name(name), {t: 0.0 for t in TERMS})
        for t, bucket in term_grads.items():
            layer[t] += float(bucket[j].pow(2).sum())
    glob = {t: math.sqrt(sum(float(g.pow(2).sum()) for g in term_grads[t])) if t in term_grads else 0.0
            for t in TERMS}
    per_layer = {k: {t: math.sqrt(v) for t, v in d.items()} for k, d in sq.items()}
    return per_layer, glob, _term_cosines(term_grads, glob)


def _set_total_grad(params, term_grads: dict) -> None:
    """.grad = Σ term gradients, summed IN PLACE into the first bucket (no extra parameter-sized copy)."""
    live = [t for t in TERMS if t in term_grads]
    if not live:
        for _, p in params:
            p.grad = torch.zeros_like(p)
        return
    total = term_grads[live[0]]
    for t in live[1:]:
        for a, b in zip(total, term_grads[t]):
            a.add_(b)
    for (_, p), g in zip(params, total):
        p.grad = g


def _global_norm(tensors) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in tensors])))


def _total_per_layer(params) -> dict:
    sq: dict[str, float] = {}
    for name, p in params:
        sq[layer_name(name)] = sq.get(layer_name(name), 0.0) + float(p.grad.pow(2).sum())
    return {k: math.sqrt(v) for k, v in sq.items()}


def update(policy, optimizer, rollout, advantages, loss_record, config, *, per_term_grads: bool = True,
           reference=None, rows: Optional[slice] = None, old_per_token_logps: Optional[torch.Tensor] = None,
           num_items_in_batch: Optional[float] = None, objective: Optional[Objective] = None,
           mask: Optional[torch.Tensor] = None) -> UpdateResult:
    """One optimizer step on `rollout` with `advantages`. Refuses (NumericalError) on a non-finite
    loss or gradient instead of stepping the optimizer. `reference` is needed for kl_estimator='full'
    (its exact KL needs the reference distribution again, with the policy side carrying grad).

    Inner iterations (grpo.phases.iterations) call it once per optimizer step with `rows` (the step's slice of the
    rollout, default all), `old_per_token_logps` (N, T) frozen at sampling (None → ℓ.detach(), ratio 1, TRL's
    on-policy case), `num_items_in_batch` (dapo family: TRL's generation-batch token count ÷ steps per
    generation; default Σ mask of `rows`) and `objective` (default `Objective.from_config(config)`; the inner
    iterations pass it with the adaptive controller's applied c_H); `mask` (N, T) the loss mask when the caller
    has it."""
    if config.kl_estimator == "full" and config.beta and reference is None:
        raise ConfigError("kl_estimator", "'full' needs the reference model in update() for its gradient")
    t0 = time.perf_counter()
    dev = model_device(policy)               # the records cross to the model's device here, and back at the end
    rollout, advantages, old_per_token_logps = (on_device(x, dev) for x in (rollout, advantages, old_per_token_logps))
    policy.train(False)                      # dropout stays off: train() would re-enable it
    params = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    step_rows = rows if rows is not None else slice(0, rollout.completion_ids.shape[0])
    n = step_rows.stop - step_rows.start
    full_mask = loss_mask(rollout, config) if mask is None else on_device(mask, dev)   # (N, T) the record's mask
    mask = full_mask[step_rows]                                            # (n, T)
    num_items = float(mask.sum()) if num_items_in_batch is None else float(num_items_in_batch)
    objective = Objective.from_config(config) if objective is None else objective
    family = objective.family
    if not per_term_grads:                   # lean path: .backward() accumulates into .grad in place, as TRL
        for _, p in params:
            p.grad = None
    acc = _Accumulated()
    # micro_batch_size None: all rows at once unless that would not fit the memory estimate (124M: 4 rows)
    slices = _micro_slices(n, config.micro_batch_size or auto_micro_batch_size(
        policy, n, rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]))
    with memory.update_memory(policy):       # large models: freed gradients go back to the OS (models/memory.py)
        for mb in slices:
            g_rows = slice(step_rows.start + mb.start, step_rows.start + mb.stop)   # rows of the rollout
            rec = _micro_batch_terms(policy, reference, rollout, advantages, g_rows, full_mask,
                                     None if old_per_token_logps is None else old_per_token_logps[g_rows],
                                     config, objective, num_items, acc)
            w = family.mb_weight(config.loss_type, mb, n, mask)          # the family's share of the batch loss
            w_ent = family.mb_weight(config.loss_type, mb, n, mask, entropy=True)
            terms = {"pg": rec.pg_loss * w, "kl": rec.kl_loss * w, "entropy": rec.entropy_term * w_ent}
            total = terms["pg"] + terms["kl"] + terms["entropy"]
            if not torch.isfinite(total):
                raise NumericalError(f"non-finite loss {float(total.detach())} in micro-batch rows "
                                     f"{mb.start}:{mb.stop}; optimizer step refused")
            acc.loss_total += float(total.detach())
            _backward(terms, params, per_term_grads, acc)
        result = _step(policy, optimizer, params, acc, config, loss_record, per_term_grads, len(slices), step_rows,
                       objective.entropy_coef, t0)
    return on_device(result, "cpu")


def _step(policy, optimizer, params, acc: _Accumulated, config, loss_record, per_term_grads: bool, n_slices: int,
          step_rows: slice, entropy_coef: float, t0: float) -> UpdateResult:
    """Norms (per term, per layer), clip, optimizer step, and the record of it."""
    per_layer_terms, per_term_global, grad_cosine = ({}, {}, {})
    if per_term_grads:                        # the terms' norms first: the sum below overwrites a bucket
        per_layer_terms, per_term_global, grad_cosine = _term_stats(params, acc.term_grads)
        _set_total_grad(params, acc.term_grads)
        acc.term_grads = {}
    else:                                     # parameters no micro-batch reached: zero gradient
        for _, p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    pre = _global_norm([p.grad for _, p in params])
    if not math.isfinite(pre):
        optimizer.zero_grad(set_to_none=True)
        raise NumericalError(f"non-finite gradient norm ({pre}); optimizer step refused")
    zeros = {t: 0.0 for t in TERMS}           # every layer lists every term (0: no gradient, or the lean path)
    per_layer = {k: {"total": v, **per_layer_terms.get(k, zeros)} for k, v in _total_per_layer(params).items()}
    # the snapshot costs one more copy of the weights (0.5 GB at 124M): only the instrumented path keeps it
    before = [p.detach().clone() for _, p in params] if per_term_grads else None
    if config.max_grad_norm is not None:                 # None = no clipping (documented in StepConfig)
        torch.nn.utils.clip_grad_norm_([p for _, p in params], config.max_grad_norm)
    post = _global_norm([p.grad for _, p in params])
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    delta = math.nan if before is None else \
        math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for (_, p), b in zip(params, before)))
    return UpdateResult(
        loss=acc.loss_total,
        loss_record_diff=abs(acc.loss_total - float(loss_record.loss)) if loss_record is not None else math.nan,
        grad_norm_pre_clip=pre, grad_norm_post_clip=post,
        clip_coef=1.0 if config.max_grad_norm is None else min(1.0, config.max_grad_norm / (pre + 1e-6)),
        per_layer=per_layer, per_term_global=per_term_global, lr=lr, micro_batches=n_slices, param_delta_norm=delta,
        seconds=time.perf_counter() - t0, counts={"forwards": acc.forwards, "backwards": acc.backwards},
        grad_cosine=grad_cosine, rows=(step_rows.start, step_rows.stop),
        per_token_logps=torch.cat(acc.logps), per_token_entropy=torch.cat(acc.entropy),
        per_token_full_kl=torch.cat(acc.full_kl) if acc.full_kl else None, entropy_coef=float(entropy_coef))


def _term_cosines(term_grads: dict, norms: dict) -> dict:
    """cos(∇PG, ∇other) over all parameters; NaN when either gradient is 0 (direction undefined)."""
    out = {}
    for other in ("kl", "entropy"):
        den = norms["pg"] * norms[other]
        dot = sum(float((a * b).sum()) for a, b in zip(term_grads["pg"], term_grads[other])) if den > 0 else 0.0
        out[f"pg_{other}"] = dot / den if den > 0 else math.nan
    return out
