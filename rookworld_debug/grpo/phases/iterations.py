"""Inner PPO iterations, as TRL runs them: μ = num_iterations passes over ONE rollout, each pass split
into `steps_per_generation` optimizer steps (each micro-batched by micro_batch_size).

Shape legend: B prompts, G generations, N = B·G rows, T completion tokens.

Why it looks like this (TRL 1.16 `GRPOTrainer`):
- μ = 1 and one optimizer step per generation: old log-probs are NOT computed; `_compute_loss` uses
  ℓ.detach(), so the ratio is exactly 1 and clipping cannot bind. We do the same (old = None).
- μ > 1 or several optimizer steps per generation: TRL computes `old_per_token_logps` at sampling time
  and keeps them frozen for every later optimizer step over that rollout. Ours are the rollout's
  sampling-time policy log-probs (`Rollout.per_token_logps`, same θ as the first optimizer step), so from
  the second optimizer step on r = π_θ/π_old ≠ 1 and ε, δ, OPSM act.
- Each pass is recorded as an `IterationRecord`: its LossBreakdown on all N rows (the log-probs of the
  grad forwards, at the θ each row was trained at), and the UpdateResult of each optimizer step.
- Adaptive entropy (TRL `use_adaptive_entropy`): c_H is applied only while the previous optimizer step's
  token-mean entropy ≤ entropy_target (TRL starts that value at +inf, so never at the first step); after
  each optimizer step c_H ± entropy_coef_delta, clamped to [entropy_coef_min, entropy_coef_max].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from rookworld_debug.errors import ConfigError, NumericalError
from rookworld_debug.grpo.registry import family_of
from rookworld_debug.grpo.objective.loss import LossBreakdown, high_entropy_mask
from rookworld_debug.grpo.objective.params import Objective
from rookworld_debug.grpo.phases.generation import loss_mask
from rookworld_debug.grpo.phases.loss_inputs import loss_inputs
from rookworld_debug.grpo.phases.update import UpdateResult, update


@dataclass(frozen=True)
class IterationRecord:
    """One pass (PPO inner iteration) over the rollout."""
    index: int                          # 0-based: iteration index + 1 = TRL's μ counter
    loss: LossBreakdown                 # this pass's loss on all N rows vs the frozen old log-probs
    updates: tuple                      # UpdateResult of each optimizer step of the pass (steps_per_generation)
    per_token_logps: torch.Tensor       # (N, T) ℓ of the grad forwards (the θ each row was trained at), detached
    entropy_coef: float                 # c_H applied in the pass's last optimizer step

    @property
    def grad_norm_pre_clip(self) -> float:
        """Global grad norm of the pass's LAST optimizer step (TRL logs grad_norm per optimizer step)."""
        return self.updates[-1].grad_norm_pre_clip if self.updates else math.nan

    def metrics(self) -> dict:
        """TRL-named metrics of this pass: loss, kl, entropy, clip_ratio/*, grad_norm."""
        return {"loss": float(self.loss.loss), **self.loss.metrics, "grad_norm": self.grad_norm_pre_clip,
                "entropy_coef": self.entropy_coef}


class AdaptiveEntropy:
    """TRL's Skywork-OR1 entropy-coefficient controller, one optimizer step at a time."""

    def __init__(self, config):
        self.config = config
        self.coef = float(config.entropy_coef)
        self.last_entropy = math.inf                     # TRL: _last_world_entropy starts at +inf

    def applied(self) -> float:
        c = self.config
        if not c.use_adaptive_entropy:
            return float(c.entropy_coef)
        return self.coef if self.last_entropy <= c.entropy_target else 0.0

    def observe(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        """After an optimizer step: entropy (n, T) and mask (n, T) of its rows (entropy mask applied as TRL)."""
        c = self.config
        if not c.use_adaptive_entropy:
            return
        eff = mask.to(entropy.dtype)
        if c.top_entropy_quantile < 1.0:
            eff = eff * high_entropy_mask(entropy, eff, 1 - c.top_entropy_quantile)
        world = float((entropy * eff).sum() / eff.sum().clamp(min=1.0))
        if world <= c.entropy_target:
            self.coef = min(self.coef + c.entropy_coef_delta, c.entropy_coef_max)
        else:
            self.coef = max(self.coef - c.entropy_coef_delta, c.entropy_coef_min)
        self.last_entropy = world


def run_iterations(policy, optimizer, rollout, advantages, config, *, reference=None,
                   loss_record: Optional[LossBreakdown] = None, per_term_grads: bool = True,
                   flags: Optional[list] = None, objective: Optional[Objective] = None) -> tuple:
    """μ passes × steps_per_generation optimizer steps over `rollout`. Returns the IterationRecords done.
    A refused optimizer step (NumericalError) ends the loop with a flag appended to `flags`; if it is the
    very first step the error propagates (nothing was trained: the caller's 'update refused' path).
    `objective`: the config's, when the caller resolved it."""
    n = rollout.completion_ids.shape[0]
    steps = config.steps_per_generation or 1
    rows_per_step = n // steps
    freeze = config.freezes_old_logps
    old = rollout.per_token_logps.detach() if freeze else None             # (N, T) frozen at sampling
    mask = loss_mask(rollout, config)                                 # (N, T)
    # TRL: dapo-family normaliser = generation-batch tokens · g / (steps·g) = tokens per optimizer step on average
    num_items = float(mask.sum()) / steps if steps > 1 else None
    ent = AdaptiveEntropy(config)
    objective = Objective.from_config(config) if objective is None else objective
    records = []
    for i in range(config.num_iterations):
        ups: list[UpdateResult] = []
        for j in range(steps):
            rows = slice(j * rows_per_step, (j + 1) * rows_per_step)
            try:
                up = update(policy, optimizer, rollout, advantages,
                            loss_record if (i == 0 and steps == 1) else None, config,
                            per_term_grads=per_term_grads, reference=reference, rows=rows,
                            old_per_token_logps=old, num_items_in_batch=num_items, mask=mask,
                            objective=objective.replace(entropy_coef=ent.applied()))
            except NumericalError as err:
                if not records and not ups:
                    raise
                if flags is not None:
                    flags.append(f"iteration {i + 1}, optimizer step {j + 1} refused: {err}; iterations stopped")
                return tuple(records)
            ent.observe(up.per_token_entropy, mask[rows])
            ups.append(up)
        records.append(_record(i, ups, rollout, advantages, config, old, mask, objective))
    return tuple(records)


def _record(i, ups, rollout, advantages, config, old, mask, objective) -> IterationRecord:
    """The pass's LossBreakdown on all N rows, from the grad forwards' detached tensors (no extra forward)."""
    logps = torch.cat([u.per_token_logps for u in ups])                      # (N, T)
    entropy = torch.cat([u.per_token_entropy for u in ups])                  # (N, T)
    full_kl = torch.cat([u.per_token_full_kl for u in ups]) if ups[0].per_token_full_kl is not None else None
    objective = objective.replace(entropy_coef=ups[-1].entropy_coef)
    rec = loss_inputs(rollout, advantages, config, logps=logps, old=logps if old is None else old, entropy=entropy,
                      full_kl=full_kl, objective=objective, mask=mask).loss()
    return IterationRecord(index=i, loss=rec, updates=tuple(ups), per_token_logps=logps,
                           entropy_coef=ups[-1].entropy_coef)


def loss_for_iteration(rollout, advantages, config, it: IterationRecord) -> LossBreakdown:
    """Pass `it`'s loss record recomputed with (possibly new) loss knobs — no forward pass: its recorded
    log-probs against the frozen old log-probs (widgets' β/ε sliders on a drifted, off-policy pass)."""
    old = (rollout.per_token_logps if config.freezes_old_logps else it.per_token_logps).detach()   # (N, T)
    full_kl = None
    if config.kl_estimator == "full":
        if it.loss.kl_estimator != "full" or it.loss.per_token_kl is None:
            raise ConfigError("kl_estimator", "the exact KL of this pass was not recorded (run the step with "
                              "kl_estimator='full' and β > 0)")
        full_kl = it.loss.per_token_kl                                      # (N, T)
    return loss_inputs(rollout, advantages, config, logps=it.per_token_logps, old=old,
                       entropy=it.loss.per_token_entropy, full_kl=full_kl,
                       objective=Objective.from_config(config).replace(entropy_coef=it.entropy_coef)).loss()


@dataclass(frozen=True)
class LossTypeRow:
    """One loss type on the same tensors (see `compare_loss_types`)."""
    loss_type: str
    loss: LossBreakdown                 # the full record (PG / KL / entropy terms, definition)
    token_weight: torch.Tensor          # (N, T) −∂loss/∂ℓ_it: the weight each token's ∇logπ gets (0 masked)
    grad_norm_logps: float              # ‖∂loss/∂ℓ‖₂ over all tokens (w.r.t. log-probs, NOT the weights)


def compare_loss_types(rollout, advantages, config, *, iteration: Optional[IterationRecord] = None,
                       loss_types: Optional[tuple] = None) -> tuple:
    """The same rollout (or inner pass) under each loss type: terms, per-token weights, gradient norms.
    A pure recompute from recorded tensors (autograd on a detached copy of the log-probs, no forward pass)."""
    from rookworld_debug.settings import loss_types as registered
    out = []
    for lt in loss_types or registered():
        cfg = config.replace(loss_type=lt)
        if loss_types is None and _refused(cfg):
            continue                       # e.g. TRL refuses vespo with a sequence-level IS correction
        if family_of(lt).needs_reference and rollout.ref_per_token_logps is None:
            continue                       # e.g. the mini's ratio is against the reference: nothing to compare to
        base = iteration.per_token_logps if iteration is not None else rollout.per_token_logps
        leaf = base.detach().clone().requires_grad_(True)                  # (N, T)
        if iteration is not None:
            it = IterationRecord(iteration.index, iteration.loss, iteration.updates, leaf, iteration.entropy_coef)
            rec = loss_for_iteration(rollout, advantages, cfg, it)
        else:                              # the sampling-time record (step.loss_for), old = ℓ.detach()
            rec = loss_inputs(rollout, advantages, cfg, logps=leaf, old=base.detach()).loss()
        grad = torch.autograd.grad(rec.loss, leaf, allow_unused=True)[0] if rec.loss.requires_grad else None
        grad = torch.zeros_like(base) if grad is None else grad
        out.append(LossTypeRow(lt, _detached(rec), (-grad).detach(), float(grad.norm())))
    return tuple(out)


def _refused(config) -> bool:
    """Whether the loss type's own checks refuse this config's knobs (then it has nothing to compare)."""
    check = family_of(config.loss_type).rules[config.loss_type].check
    if check is None:
        return False
    try:
        check(Objective.from_config(config))
    except ConfigError:
        return True
    return False


def _detached(rec: LossBreakdown) -> LossBreakdown:
    import dataclasses
    return dataclasses.replace(rec, **{k: getattr(rec, k).detach() for k in
                                       ("loss", "pg_loss", "kl_loss", "entropy_loss", "entropy_term")})
