"""The weights a TRL capture keeps for the replay (`capture_steps(..., keep_weights=True)`): the model before the
step, the gradient the optimizer was handed (before clipping), the optimizer's state, the model after the step and
the reference — taken by the same `StepWatch` a `run_step` trace uses and written to `state/` as a recorded step's.

Rank 0 keeps them (after DDP's all-reduce every rank holds the same gradient; the weights are the same on every
rank), only for the steps named in advance (`steps=`, `every=`): a flight recorder's held steps keep no weights,
since copying the model every step to hold K of them would cost a model copy per step.
"""
from __future__ import annotations

from typing import Optional

from rookworld_debug.grpo.trace.keep import StepWatch, clip_factor
from rookworld_debug.grpo.trace.state import state_bytes


class WeightsKeeper:
    """One StepWatch per captured step in flight, on the trainer's model and optimizer (rank 0 only)."""

    def __init__(self, trainer, rank: int):
        self.trainer, self.rank = trainer, rank
        self.watches: dict[int, StepWatch] = {}

    def begin(self, step: int) -> None:
        t = self.trainer
        if self.rank != 0 or t.optimizer is None:
            return
        unwrap = t.accelerator.unwrap_model
        optimizer = getattr(t.optimizer, "optimizer", t.optimizer)     # accelerate's wrapper holds torch's optimizer
        ref = getattr(t, "ref_model", None)
        self.watches[step] = StepWatch(unwrap(t.model), optimizer, reference=unwrap(ref) if ref is not None else None,
                                       tokenizer=getattr(t, "processing_class", None))

    def end(self, step: int, grad_norm: float) -> tuple:
        """(the step's kept state — grpo.trace.state.RecordedState, None when it kept none —, the seconds its
        snapshots spent inside the optimizer's step, the bytes it holds)."""
        watch: Optional[StepWatch] = self.watches.pop(step, None)
        if watch is None:
            return None, 0.0, 0
        kept = watch.close(clip_coef=clip_factor(grad_norm, self.trainer.args.max_grad_norm))
        return kept, watch.hook_seconds, state_bytes(kept)

    def drop(self) -> None:
        for w in self.watches.values():
            w.remove()
        self.watches = {}
