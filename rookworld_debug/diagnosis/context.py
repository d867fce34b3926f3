"""The step a diagnosis is about, for checks whose meaning depends on it (before any update the policy must
equal the reference). Set by `diagnose_trace(trace, step=...)`; checks keep the `check(trace)` signature."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Optional

_STEP: contextvars.ContextVar = contextvars.ContextVar("rookworld_diagnosis_step", default=None)


def current_step() -> Optional[int]:
    return _STEP.get()


@contextmanager
def at_step(step: Optional[int]):
    token = _STEP.set(step)
    try:
        yield
    finally:
        _STEP.reset(token)
