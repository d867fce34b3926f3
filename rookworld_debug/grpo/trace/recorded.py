"""`RecordedStep`: what a step recorded from the user's own training loop adds to a `StepTrace` (its `recorded`
field).

A recorded step is an ordinary `StepTrace`: its rollout, rewards, advantages and loss records hold the tensors the
user's loop produced (the loss record's decomposition is recomputed by the project's loss for the declared
objective, so views can show its terms). `RecordedStep` keeps what the loop itself reported beside them: the loss
it backpropagated, the pieces it recorded and the ones it did not, and where the weights that make a replay
possible lie (`state/` next to trace.json).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

RECORD_FORMAT = 1
# the phases a loop can record, in the order a step produces them
PIECES = ("batch", "sampler_weights", "rollout", "sampling_logps", "rewards", "advantages", "old_logps", "ref_logps",
          "policy_logps", "loss", "per_token_loss", "weights_before", "reference_weights", "optimizer_state",
          "gradient", "weights_after")


@dataclass(frozen=True)
class RecordedStep:
    """The user's loop's side of one recorded optimizer step (rows in the loop's order: N = B·G, groups of G; under
    torch.distributed, the global step: every rank's rows in rank order, `rows_by_rank` saying whose)."""
    format: int
    trainer: str                            # the name the loop gave itself ("my GRPO loop")
    step: Optional[int]                     # the loop's optimizer step (1 = its first update; None: not said)
    recorded: tuple                         # the PIECES this step recorded
    missing: tuple                          # the PIECES it did not, each "piece: what cannot be checked without it"
    loss: float                             # the loss the loop backpropagated (NaN: not recorded)
    per_token_loss: Optional[torch.Tensor]  # (N, T) the loop's own per-token loss (None: not recorded)
    old_per_token_logps: Optional[torch.Tensor]  # (N, T) the loop's π_old log-probs (None: ratio against ℓ.detach())
    policy_training_mode: Optional[bool]    # model.training during the loss forward (None: not recorded)
    dtype: str                              # the precision the loop's forwards ran in ("float32", "bfloat16", ...)
    optimizer: str                          # the optimizer's class name ("AdamW"); "" when not recorded
    optimizer_settings: dict                # lr, betas, eps, weight_decay of its first parameter group
    max_grad_norm: Optional[float]          # the clip the loop applied between backward and step (None: none)
    gradient_accumulation_steps: int        # micro-batches summed into the recorded gradient
    weights: str                            # "state/" when the weights files were written, "" when not
    notes: tuple = ()                       # what the loop said about itself, verbatim
    iteration: int = 0                      # the optimizer pass over this rollout (0: the first, π_old = θ_before)
    sampler_dtype: str = ""                 # the precision the sampler ran in, when not `dtype` ("": `dtype`)
    rows_by_rank: tuple = ()                # ((start, stop), ...) in rank order: the rows each rank of a
                                            # torch.distributed loop held, whole groups; (): one process
    explicit: tuple = ()                    # the StepRecorder keywords the loop passed itself (the rest: defaults)
    scheduler: dict = field(default_factory=dict)   # last_epoch, last_lr, group_lr of the loop's learning-rate
                                                    # scheduler before the update, and its instance number
                                                    # (one per Python object and process) ({}: not recorded)
