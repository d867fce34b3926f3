"""The debugged step's start: a loaded Setup moved to step 0, k warm-up steps, or a checkpoint.

`setup(config)` = `grpo.phases.setup.load_setup(config)` (models, data, engine, batch, step-0 invariants on the
base pair) followed by `grpo.multistep.drift.apply_start` (the drifted start, cached; `provenance["start"]` says how).
A drifted start is orchestration (k steps, then the debugged step), so it sits above the loading phase:
`grpo/phases/setup.py` does not import it.
"""
from __future__ import annotations

import dataclasses
import time

from rookworld_debug.config import StepConfig
from rookworld_debug.grpo.multistep.drift import apply_start
from rookworld_debug.grpo.phases.setup import Setup, load_setup


def setup(config: StepConfig, **kw) -> Setup:
    """Load everything (`load_setup`, same keywords), then move the policy to the configured start."""
    t0 = time.perf_counter()
    s = apply_start(load_setup(config, **kw))   # the invariants were checked on the BASE pair, before any move
    return dataclasses.replace(s, seconds=time.perf_counter() - t0) if s.provenance.get("start") else s
