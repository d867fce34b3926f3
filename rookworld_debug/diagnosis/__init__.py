"""Findings: what is likely wrong with a step or a run, with its evidence and a concrete fix.

Each check is a small pure function over a `StepTrace` (or a run's log) registered in one table; it returns
`Finding` records (see `findings.py`). Views render findings; they never compute them."""
from .findings import Evidence, Finding, Fix

__all__ = ["Evidence", "Finding", "Fix"]
