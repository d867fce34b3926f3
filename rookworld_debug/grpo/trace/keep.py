"""The weights a step keeps for its replay, taken while it runs: the policy and its optimizer's state before the
update, the gradient the first optimizer step was handed (before clipping), the weights after that step, and the
reference — the pieces `StepRecorder` records from a hand-written loop, snapshotted by the same functions
(`grpo.trace.state`) and written by the same `write_state`, so the three writers of a step keep one format.

    watch = StepWatch(policy, optimizer, reference=ref, tokenizer=tok)    # before the update
    ... the trainer's own backward, clip and optimizer.step() ...          # hooks on the optimizer's first step
    kept = watch.close(clip_coef=clip_factor(norm_before_clip, max_grad_norm))   # a RecordedState, in memory

The optimizer's step hooks see the gradient AFTER any clipping; the gradient before it is recovered by the clip's
own factor, min(1, max_grad_norm / (‖g‖ + 1e-6)) with ‖g‖ the norm the trainer logged before clipping (torch's
`clip_grad_norm_` and TRL's use this factor), exact to a rounding.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import torch

from rookworld_debug.grpo.trace import state as S

# 'auto' keeps the weights of a policy this small: the embedded model (4.9 M parameters) keeps ~120 MB per step
KEEP_AUTO_MAX_PARAMETERS = 20_000_000


def keeps_weights(keep: str, policy: torch.nn.Module) -> bool:
    """Whether a step under the `keep_weights` setting keeps its weights ('auto': small models only)."""
    if keep == "never" or policy is None:
        return False
    return keep == "always" or sum(p.numel() for p in policy.parameters()) <= KEEP_AUTO_MAX_PARAMETERS


def optimizer_steps(optimizer) -> int:
    """The optimizer steps `optimizer` has taken (the largest per-parameter step count; 0 for a fresh one): with
    the start record, what says whether the policy has left the weights it was loaded with."""
    steps = [st.get("step", 0) for st in getattr(optimizer, "state", {}).values() if isinstance(st, dict)]
    return int(max((float(s) for s in steps), default=0))


def clip_factor(pre_clip_norm: float, max_grad_norm: Optional[float]) -> float:
    """min(1, max_grad_norm / (‖g‖ + 1e-6)): the factor torch's clip_grad_norm_ multiplies the gradient by."""
    if max_grad_norm is None or not math.isfinite(pre_clip_norm):
        return 1.0
    return min(1.0, max_grad_norm / (pre_clip_norm + 1e-6))


class StepWatch:
    """Snapshots around the first optimizer step of `optimizer` over `policy` (the hooks remove themselves)."""

    def __init__(self, policy: torch.nn.Module, optimizer, *, reference: Optional[torch.nn.Module] = None,
                 tokenizer=None):
        self.policy, self.tokenizer = policy, tokenizer
        self.model_config = policy.config.to_dict()
        self.before = S.snapshot(policy)
        self.optimizer = S.optimizer_snapshot(policy, optimizer)
        self.reference = S.snapshot(reference) if reference is not None else None
        self.gradient: Optional[dict] = None
        self.after: Optional[dict] = None
        self.hook_seconds = 0.0                 # spent inside the optimizer's step (the caller times the rest)
        self._hooks = [optimizer.register_step_pre_hook(self._pre), optimizer.register_step_post_hook(self._post)]

    def _pre(self, optimizer, args, kwargs) -> None:
        t0 = time.perf_counter()
        if self.gradient is None:
            self.gradient = S.gradient_of(self.policy)
        self.hook_seconds += time.perf_counter() - t0

    def _post(self, optimizer, args, kwargs) -> None:
        t0 = time.perf_counter()
        if self.after is None:
            self.after = S.snapshot(self.policy)
        self.remove()
        self.hook_seconds += time.perf_counter() - t0

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def close(self, *, clip_coef: float = 1.0, whole_batch: bool = True) -> S.RecordedState:
        """The kept state. `clip_coef`: what clipping multiplied the gradient by (see `clip_factor`). `whole_batch`
        False (the first optimizer step trained on a slice of the rows): the gradient and the weights after are not
        the step's; only the weights before, the optimizer's state and the reference are kept."""
        self.remove()
        gradient, after = (self.gradient, self.after) if whole_batch else (None, None)
        if gradient is not None and math.isfinite(clip_coef) and 0.0 < clip_coef < 1.0:
            gradient = {k: v / clip_coef for k, v in gradient.items()}
        kind, settings, opt_state, trainable, groups = self.optimizer
        return S.RecordedState(
            model_type=str(self.model_config.get("model_type", "")), model_config=self.model_config,
            before=self.before, after=after, gradient=gradient, reference=self.reference,
            optimizer_state=opt_state, optimizer=kind if kind in S.OPTIMIZERS else "",
            optimizer_settings=dict(settings), trainable=trainable or tuple(self.before), tokenizer_dir=None,
            tokenizer=self.tokenizer, optimizer_groups=groups)
