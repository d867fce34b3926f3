"""`TRLCapture`: what a captured TRL `GRPOTrainer` step adds to a `StepTrace` (its `capture` field).

A captured step is an ordinary `StepTrace` (rollout, rewards, advantages, loss, update records built
from TRL's own tensors) whose `capture` says where it came from and what TRL itself logged, so views
render it like any step and can say what it lacks (no step-0 invariants, no greedy before/after eval).

Compatibility: the record's tensors and the recompute of its loss follow the GRPO math of the TRL
version that produced it. `check_compatible` refuses (IncompatibleTraceError, naming both versions)
a capture written by a TRL major.minor this package was not written against, or by a newer capture
format.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from rookworld_debug.errors import IncompatibleTraceError

CAPTURE_FORMAT = 1
SUPPORTED_TRL = ("1.16",)      # TRL major.minor whose GRPOTrainer hooks and loss math this capture mirrors


def trl_minor(version: str) -> str:
    return ".".join(str(version).split("+")[0].split(".")[:2])


@dataclass(frozen=True)
class TRLCapture:
    """TRL's side of one captured optimizer step (tensors in generation order: rows p·g, TRL's layout)."""
    global_step: int                        # the optimizer step as TRL logs it (state.global_step after it)
    trl_version: str
    transformers_version: str
    format: int
    trl_loss: float                         # Σ over the step's micro-batches of what compute_loss returned
    micro_batch_losses: tuple               # each micro-batch's returned loss, in execution order
    micro_batch_rows: tuple                 # rows (generation order) of each micro-batch
    recomputed_loss: float                  # the same sum recomputed by grpo.objective.loss.compute_loss per micro-batch
    loss_recompute_diff: float              # |recomputed_loss − trl_loss|
    advantages_recompute_diff: float        # max |A(ours, grpo.phases.advantages) − A(TRL)| over rows
    logged_metrics: Optional[dict]          # the dict TRL/transformers logged for this step (None: not a log step)
    step_metrics: dict                      # TRL's metric lists accumulated during this step (trainer._metrics)
    grad_norm: float                        # global grad L2 norm before clipping, as the Trainer computed it
    learning_rate: float
    num_items_in_batch: float               # Σ completion_mask over the generation batch (dapo's normalizer)
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_iterations: int
    generation_step: int                    # optimizer step whose start generated this batch (< global_step if reused)
    grpo_config: dict                       # GRPOConfig.to_dict(), verbatim
    unmapped: dict                          # GRPOConfig fields with no StepConfig counterpart, verbatim
    mapping_notes: tuple                    # how GRPOConfig was mapped onto StepConfig, and what could not be
    reward_func_names: tuple
    reward_weights: tuple
    old_per_token_logps: Optional[torch.Tensor]   # (N, T) stored old log-probs (None: TRL used ℓ.detach())
    sampling_per_token_logps: Optional[torch.Tensor]  # (N, T) vLLM sampling log-probs (None without vLLM)
    capture_seconds: float                  # wall time the capture spent on this step (copies + record + save)
    capture_bytes: int                      # bytes of tensors copied for this step
    dataset_columns: dict = field(default_factory=dict)  # extra dataset columns of the batch rows (e.g. label)
    # the policy's own generation_config (its generation_config.json) where it differs from transformers' defaults:
    # generate() fills in from it every key TRL's GenerationConfig leaves unset
    generation_config: dict = field(default_factory=dict)


def check_compatible(capture_payload: dict, path) -> None:
    """Refuse a serialized TRLCapture from an unsupported TRL version / capture format (before decoding)."""
    fields = capture_payload.get("fields", {}) if isinstance(capture_payload, dict) else {}
    version = fields.get("trl_version")
    fmt = fields.get("format")
    if not isinstance(version, str):
        raise IncompatibleTraceError(f"{path}: TRL capture without a TRL version: cannot tell whether its loss "
                                     "math matches this package (supported TRL: "
                                     f"{', '.join(SUPPORTED_TRL)}.x)")
    if trl_minor(version) not in SUPPORTED_TRL:
        raise IncompatibleTraceError(f"{path}: captured with TRL {version}; this rookworld_debug reads captures "
                                     f"from TRL {', '.join(s + '.x' for s in SUPPORTED_TRL)} only (the GRPO loss "
                                     "and its tensors differ between TRL versions)")
    if not isinstance(fmt, int) or fmt > CAPTURE_FORMAT:
        raise IncompatibleTraceError(f"{path}: capture format {fmt!r} is newer than this rookworld_debug "
                                     f"reads ({CAPTURE_FORMAT}); upgrade rookworld_debug")
