"""The one path from a rollout's records to the loss: `loss_inputs` builds what `compute_loss` reads.

Shape legend: N rows of the rollout, n the rows selected (`rows`, a slice or an index tensor; all N by default),
T completion tokens. The step's displayed loss, the update's micro-batches, the inner iterations' records, the
signal diagnostics, the widgets and the objective comparisons all build their inputs here, so the mask, the
reference side, the sampler's log-probs and the batch's normalisers are chosen by one set of rules:

- mask: `generation.loss_mask(rollout, config)` (the completion mask; the family's layout faults included);
- ref: the rollout's reference log-probs, unless kl_estimator="full" has no exact KL to read (then None, for a
  loss that does not read ℓ_ref itself);
- sampling log-probs: the sampler's, when the config asks for them (OPSM, the sampling-time IS correction);
- num_generations: only when every group is whole (all rows), so per-group values are defined.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from rookworld_debug.grpo.registry import checked
from rookworld_debug.grpo.objective.loss import LossBreakdown, compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.phases.generation import loss_mask, sampling_logps_for

Rows = Union[slice, torch.Tensor, None]
ROLLOUT = object()           # a tensor argument left at this: the rollout's own, for the selected rows


@dataclass(frozen=True)
class LossInputs:
    """Everything one `compute_loss` call reads, for n rows of a rollout."""
    per_token_logps: torch.Tensor                   # (n, T) ℓ (carries the gradient in an update)
    old_per_token_logps: Optional[torch.Tensor]     # (n, T) ℓ_old; None → ℓ.detach() (on-policy, ratio 1)
    ref_per_token_logps: Optional[torch.Tensor]     # (n, T) ℓ_ref; None without a reference side
    advantages: torch.Tensor                        # (n,)
    completion_mask: torch.Tensor                   # (n, T) the loss mask
    objective: Objective
    batch: LossBatch

    def loss(self) -> LossBreakdown:
        return compute_loss(self.per_token_logps, self.old_per_token_logps, self.ref_per_token_logps,
                            self.advantages, self.completion_mask, self.objective, self.batch)


def _take(x: Optional[torch.Tensor], rows: Rows) -> Optional[torch.Tensor]:
    return x if x is None or rows is None else x[rows]


def loss_inputs(rollout, advantages, config, *, rows: Rows = None, logps=ROLLOUT, old: Optional[torch.Tensor] = None,
                entropy=ROLLOUT, full_kl=ROLLOUT, objective: Optional[Objective] = None,
                num_items_in_batch: Optional[float] = None, num_generations=ROLLOUT,
                mask: Optional[torch.Tensor] = None, prepare: bool = False) -> LossInputs:
    """The loss inputs of `rows` of `rollout` under `config`.

    `logps`/`entropy`/`full_kl` (n, T): this pass's own (an update's forward, an inner iteration's; None = none);
    default the rollout's. `old` (n, T): the old log-probs (default None: on-policy). `advantages`: an Advantages
    record or an (N,) tensor. `objective`: default `Objective.from_config(config)`. `num_generations`: default
    the config's when every row is selected, else none (a micro-batch holds no whole group). `mask` (N, T): the
    loss mask, when the caller already built it. `prepare`: run the family's once-per-step preparation (the
    rlvr mini's KL controller and values): the displayed record does; the update reuses its β."""
    mask = loss_mask(rollout, config) if mask is None else mask                          # (N, T)
    adv = getattr(advantages, "advantages", advantages)                                  # (N,)
    logps = _take(rollout.per_token_logps, rows) if logps is ROLLOUT else logps        # (n, T)
    entropy = _take(rollout.per_token_entropy, rows) if entropy is ROLLOUT else entropy      # (n, T) | None
    full_kl = _take(rollout.per_token_full_kl, rows) if full_kl is ROLLOUT else full_kl      # (n, T) | None
    if num_generations is ROLLOUT:
        num_generations = config.num_generations if rows is None else None
    objective = Objective.from_config(config) if objective is None else objective
    family = objective.family
    # exact KL asked for but not computed: no reference side (KL needs the exact one), unless the loss reads ℓ_ref
    no_ref = config.kl_estimator == "full" and full_kl is None and not family.needs_reference
    ref = None if no_ref else _take(rollout.ref_per_token_logps, rows)                  # (n, T) | None
    extra = {}
    if prepare and family.prepare is not None:
        objective, extra = checked(family, "prepare", family.prepare(rollout, advantages, objective, mask), tuple,
                                   "an (Objective, dict) pair")
    batch = LossBatch(entropy=entropy, per_token_full_kl=full_kl,
                      sampling_per_token_logps=sampling_logps_for(rollout, config, slice(None) if rows is None else rows),
                      num_items_in_batch=num_items_in_batch, num_generations=num_generations, **extra)
    return LossInputs(logps, old, ref, _take(adv, rows).to(logps.dtype), _take(mask, rows), objective, batch)
