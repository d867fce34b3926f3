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
from rookworld_debug.grpo.generation import (auto_micro_batch_size, per_token_logps_and_entropy,
                                             per_token_logps_entropy_full_kl)
from rookworld_debug.grpo.loss import compute_loss, loss_kwargs

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


def _mb_weight(loss_type: str, rows: slice, n: int, mask: torch.Tensor) -> float:
    """Weight that turns a micro-batch loss into its share of the full-batch loss."""
    n_mb = rows.stop - rows.start
    if loss_type in ("grpo", "dr_grpo", "sapo", "luspo", "manual"):  # means over sequences → weight by rows
        return n_mb / n
    if loss_type == "bnpo":                               # token mean → weight by tokens
        return float(mask[rows].sum().clamp(min=1)) / float(mask.sum().clamp(min=1))
    return 1.0                                            # dapo/cispo/vespo: global token count passed in


def make_optimizer(policy: torch.nn.Module, config) -> torch.optim.Optimizer:
    return torch.optim.AdamW(policy.parameters(), lr=config.lr, betas=tuple(config.adam_betas),
                             eps=config.adam_eps, weight_decay=config.weight_decay)


def update(policy, optimizer, rollout, advantages, loss_record, config, *, per_term_grads: bool = True,
           reference=None, rows: Optional[slice] = None, old_per_token_logps: Optional[torch.Tensor] = None,
           num_items_in_batch: Optional[float] = None, entropy_coef: Optional[float] = None) -> UpdateResult:
    """One optimizer step on `rollout` with `advantages`. Refuses (NumericalError) on a non-finite
    loss or gradient instead of stepping the optimizer. `reference` is needed for kl_estimator='full'
    (its exact KL needs the reference distribution again, with the policy side carrying grad).

    Inner iterations (grpo.iterations) call it once per optimizer step with `rows` (the step's slice of the
    rollout, default all), `old_per_token_logps` (N, T) frozen at sampling (None → ℓ.detach(), ratio 1, TRL's
    on-policy case), `num_items_in_batch` (dapo family: TRL's generation-batch token count ÷ steps per
    generation; default Σ mask of `rows`) and `entropy_coef` (the adaptive controller's applied c_H)."""
    if config.kl_estimator == "full" and config.beta and reference is None:
        raise ConfigError("kl_estimator", "'full' needs the reference model in update() for its gradient")
    t0 = time.perf_counter()
    policy.train(False)                      # dropout stays off: train() would re-enable it
    params = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    step_rows = rows if rows is not None else slice(0, rollout.completion_ids.shape[0])
    n = step_rows.stop - step_rows.start
    adv = advantages.advantages.to(rollout.per_token_logps.dtype)[step_rows]  # (n,)
    mask = rollout.completion_mask                                         # (N, T)
    if config.mask_truncated_completions:              # as step.loss_for: the record and the step agree
        mask = mask * (~rollout.is_truncated)[:, None]                     # (N, T)
    mask = mask[step_rows]                                                 # (n, T)
    ref_all = None if rollout.ref_per_token_logps is None else rollout.ref_per_token_logps[step_rows]  # (n, T)
    old_all = None if old_per_token_logps is None else old_per_token_logps[step_rows]                # (n, T)
    num_items = float(mask.sum()) if num_items_in_batch is None else float(num_items_in_batch)
    kw = loss_kwargs(config)
    if entropy_coef is not None:
        kw["entropy_coef"] = float(entropy_coef)
    need_entropy = kw["entropy_coef"] != 0 or config.top_entropy_quantile < 1 or config.use_adaptive_entropy
    kept_logps, kept_entropy, kept_full_kl = [], [], []
    buckets = TERMS if per_term_grads else ("pg",)     # one bucket = the plain total gradient (less memory)
    # lean path: .backward() accumulates into .grad in place, as TRL does — no zeros bucket, no second full
    # gradient per micro-batch (autograd.grad returns one): ~1 GB less at the peak at 124M
    term_grads = {t: [torch.zeros_like(p) for _, p in params] for t in buckets} if per_term_grads else {}
    if not per_term_grads:
        for _, p in params:
            p.grad = None
    loss_total = 0.0
    forwards = 0
    # micro_batch_size None: all rows at once unless that would not fit the memory estimate (124M: 4 rows)
    slices = _micro_slices(n, config.micro_batch_size or auto_micro_batch_size(
        policy, n, rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]))
    for rows in slices:
        g_rows = slice(step_rows.start + rows.start, step_rows.start + rows.stop)   # rows of the rollout
        ids = (rollout.prompt_ids[g_rows], rollout.prompt_mask[g_rows], rollout.completion_ids[g_rows], mask[rows],
               rollout.temperatures[g_rows])
        full_kl = None
        if config.kl_estimator == "full" and config.beta:
            logps, entropy, full_kl = per_token_logps_entropy_full_kl(policy, reference, *ids)   # (n_mb, T) each
            forwards += 2
        else:
            # entropy in the graph only when its bonus is in the loss (TRL): saves 3 (n_mb, T, V) tensors
            logps, entropy = per_token_logps_and_entropy(policy, *ids, with_grad=True,
                                                         entropy_grad=kw["entropy_coef"] != 0)  # (n_mb, T) each
            forwards += 1
        kept_logps.append(logps.detach())
        kept_entropy.append(entropy.detach())
        if full_kl is not None:
            kept_full_kl.append(full_kl.detach())
        rec = compute_loss(
            logps, None if old_all is None else old_all[rows], None if ref_all is None else ref_all[rows],
            adv[rows], mask[rows], entropy=entropy if need_entropy else None,
            per_token_full_kl=full_kl, num_items_in_batch=num_items, **kw)
        w = _mb_weight(config.loss_type, rows, n, mask)
        # TRL's entropy bonus is a token mean of the micro-batch for every loss type → weight by token share
        w_ent = w if config.loss_type == "manual" else _mb_weight("bnpo", rows, n, mask)
        terms = {"pg": rec.pg_loss * w, "kl": rec.kl_loss * w, "entropy": rec.entropy_term * w_ent}
        total = terms["pg"] + terms["kl"] + terms["entropy"]
        if not torch.isfinite(total):
            raise NumericalError(f"non-finite loss {float(total.detach())} in micro-batch rows {rows.start}:{rows.stop}; "
                                 "optimizer step refused")
        loss_total += float(total.detach())
        if per_term_grads:
            live = [t for t in TERMS if terms[t].requires_grad]
            for i, t in enumerate(live):
                gs = torch.autograd.grad(terms[t], [p for _, p in params], retain_graph=i < len(live) - 1,
                                         allow_unused=True)
                for acc, g in zip(term_grads[t], gs):
                    if g is not None:
                        acc.add_(g)
        else:
            total.backward()                                # the single bucket (.grad) holds the total
    if not per_term_grads:                                  # parameters no micro-batch reached: zero gradient
        term_grads["pg"] = [torch.zeros_like(p) if p.grad is None else p.grad for _, p in params]

    # total grad = Σ term grads (linearity) → write into .grad for the optimizer
    for j, (_, p) in enumerate(params):   # one bucket: alias it (a sum would copy every gradient once more)
        p.grad = term_grads[buckets[0]][j] if len(buckets) == 1 else sum(term_grads[t][j] for t in buckets)
    grads = [p.grad for _, p in params]
    pre = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    if not math.isfinite(pre):
        optimizer.zero_grad(set_to_none=True)
        raise NumericalError(f"non-finite gradient norm ({pre}); optimizer step refused")

    per_layer: dict[str, dict[str, float]] = {}
    sq: dict[str, dict[str, float]] = {}
    for j, (name, p) in enumerate(params):
        layer = sq.setdefault(layer_name(name), {k: 0.0 for k in ("total", *TERMS)})
        layer["total"] += float(p.grad.pow(2).sum())
        if per_term_grads:
            for t in TERMS:
                layer[t] += float(term_grads[t][j].pow(2).sum())
    for layer, d in sq.items():
        per_layer[layer] = {k: math.sqrt(v) for k, v in d.items()}
    per_term_global = {t: math.sqrt(sum(float(g.pow(2).sum()) for g in term_grads[t])) for t in TERMS} \
        if per_term_grads else {}
    grad_cosine = _term_cosines(term_grads, per_term_global) if per_term_grads else {}

    # the snapshot costs one more copy of the weights (0.5 GB at 124M): only the instrumented path keeps it
    before = [p.detach().clone() for _, p in params] if per_term_grads else None
    if config.max_grad_norm is not None:                 # None = no clipping (documented in StepConfig)
        torch.nn.utils.clip_grad_norm_([p for _, p in params], config.max_grad_norm)
    post = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for _, p in params])))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    delta = math.nan if before is None else \
        math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for (_, p), b in zip(params, before)))
    return UpdateResult(
        loss=loss_total, loss_record_diff=abs(loss_total - float(loss_record.loss)) if loss_record is not None else math.nan,
        grad_norm_pre_clip=pre, grad_norm_post_clip=post,
        clip_coef=1.0 if config.max_grad_norm is None else min(1.0, config.max_grad_norm / (pre + 1e-6)),
        per_layer=per_layer,
        per_term_global=per_term_global, lr=lr, micro_batches=len(slices), param_delta_norm=delta,
        seconds=time.perf_counter() - t0, counts={"forwards": forwards, "backwards": forwards * (3 if per_term_grads else 1)},
        grad_cosine=grad_cosine, rows=(step_rows.start, step_rows.stop),
        per_token_logps=torch.cat(kept_logps), per_token_entropy=torch.cat(kept_entropy),
        per_token_full_kl=torch.cat(kept_full_kl) if kept_full_kl else None, entropy_coef=kw["entropy_coef"])


def _term_cosines(term_grads: dict, norms: dict) -> dict:
    """cos(∇PG, ∇other) over all parameters; NaN when either gradient is 0 (direction undefined)."""
    out = {}
    for other in ("kl", "entropy"):
        den = norms["pg"] * norms[other]
        dot = sum(float((a * b).sum()) for a, b in zip(term_grads["pg"], term_grads[other]))
        out[f"pg_{other}"] = dot / den if den > 0 else math.nan
    return out
