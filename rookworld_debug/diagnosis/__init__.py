"""Findings: what is likely wrong with a step or a run, with its evidence and a concrete fix.

Each check is a small pure function over a `StepTrace` (or a run's log) registered in one table
(`registry.STEP_CHECKS`, `registry.RUN_CHECKS`); it returns `Finding` records (see `findings.py`). Views render
findings; they never compute them.

    diagnose_trace(trace)          -> list[Finding]   ranked most likely first
    diagnose_step(trace, folder)   -> (list[Finding], Replay | None)   the checks and the step's replay, ranked
    diagnose_run(run_dir_or_log)   -> list[Finding]   from a run's log alone
    diagnose_path(path)            -> list[Finding]   a trace, a capture, a captures folder or a run folder
"""
from .findings import Evidence, Finding, Fix, rank
from .registry import RUN_CHECKS, STEP_CHECKS, diagnose_path, diagnose_run, diagnose_step, diagnose_trace

__all__ = ["Evidence", "Finding", "Fix", "rank", "diagnose_trace", "diagnose_step", "diagnose_run", "diagnose_path",
           "STEP_CHECKS", "RUN_CHECKS"]
