"""The learning rate the update reads, against the scheduler that should set it: in one step (the optimizer's rate is
the one its scheduler last set) and between two steps (the scheduler stepped as often as the optimizer did).

Each step's own update check holds the update to the learning rate the optimizer held, so a rate that progresses
wrongly from step to step passes it; these checks read the scheduler's own count and rate, which the loop records
with `rec.model_before(model, optimizer, scheduler=scheduler)`.

    schedule_check(trace)               -> PhaseCheck   (phase "update")
    scheduler_carried(trace_k, trace_k1, steps_between, optimizer_steps_k) -> PhaseCheck   (phase "scheduler")
"""
from __future__ import annotations

import math
from typing import Optional

from .compare import skipped
from .records import AGREE, DISAGREE, SUSPECT, PhaseCheck

# python floats of one rate: a scheduler's rate and the optimizer's group rate are the same number, or not
RATE_REL_TOL = 1e-9
NOT_RECORDED = ("no learning-rate scheduler was recorded (rec.model_before(model, optimizer, scheduler=scheduler) "
                "records its count and rate)")


def _scheduler(trace) -> dict:
    s = getattr(trace.recorded, "scheduler", None)
    return s if isinstance(s, dict) and {"last_epoch", "last_lr", "group_lr"} <= set(s) else {}


def schedule_check(trace) -> Optional[PhaseCheck]:
    """The optimizer's learning rate against the rate its scheduler last set (None: not a loop's recorded step, or
    a loop that recorded no scheduler: a constant rate is the update check's, and the pair of steps says what a
    scheduler recorded at both would show)."""
    s = _scheduler(trace) if trace.recorded is not None else {}
    if not s:
        return None
    q = "learning rate: the optimizer's, against the rate its scheduler last set"
    group, last = float(s["group_lr"]), float(s["last_lr"])
    tol = RATE_REL_TOL * max(abs(last), 1e-30)
    diff = abs(group - last)
    if diff <= tol:
        return PhaseCheck("update", q, AGREE, diff, tol, measure="|lr_optimizer − lr_scheduler|")
    ratio = group / last if last else math.inf
    why = (f"the optimizer steps with lr {group:.4g} while its scheduler last set {last:.4g} ({ratio:.4g} ×): "
           "something other than the scheduler set the rate (a rate written into param_groups by hand, a second "
           "scheduler, or a scheduler built on another optimizer)")
    return PhaseCheck("update", q, DISAGREE, diff, tol, "the first parameter group", f"lr = {group:.6g}",
                      f"lr = {last:.6g}", "lr_not_from_scheduler", why, measure="|lr_optimizer − lr_scheduler|",
                      fit={"kind": "scaled", "params": {"lr_factor": ratio}, "residual": 0.0, "sentence": why})


def _another_object(a: dict, b: dict) -> bool:
    """Whether two records of a scheduler name two objects (the recorder's per-process instance numbers; a loop
    resumed in a new process records another number, and its loaded count carries over)."""
    return "instance" in a and "instance" in b and a["instance"] != b["instance"]


def scheduler_carried(trace_k, trace_k1, gap: int, optimizer_steps_k: Optional[int],
                      micro_batches: int = 1) -> PhaseCheck:
    """The scheduler's count from step k to k+1 against the optimizer steps between them (`gap`)."""
    q = "scheduler: its count at k+1 is k's plus the optimizer steps between (its rate follows from the count)"
    a, b = _scheduler(trace_k), _scheduler(trace_k1)
    if not a or not b:
        return skipped("scheduler", q, NOT_RECORDED + " at both steps")
    e0, e1 = int(a["last_epoch"]), int(b["last_epoch"])
    moved, where = e1 - e0, f"last_epoch {e0} → {e1} over {gap} optimizer step(s)"
    rec, due = f"{moved} scheduler step(s)", f"{gap}"

    def off(cause: str, why: str) -> PhaseCheck:
        return PhaseCheck("scheduler", q, DISAGREE, abs(moved - gap), 0.0, where, rec, due, cause, why,
                          measure="|scheduler steps − optimizer steps| between k and k+1")
    if e1 < e0:
        return off("scheduler_reset", f"the scheduler's count went back from {e0} to {e1}: it was re-created (or "
                                      "restored from an earlier state) between the steps, so its warm-up or decay "
                                      "starts over while the optimizer goes on")
    if moved > gap:
        per = (f": once per micro-batch ({micro_batches} micro-batches)" if micro_batches > 1 and
               moved == gap * micro_batches else ": scheduler.step() called more than once per optimizer step"
               if moved % gap == 0 else "")
        return off("scheduler_stepped_extra", f"the scheduler stepped {moved} times over {gap} optimizer step(s)"
                                              f"{per}: the rate runs through its schedule {moved / gap:.3g}× as fast "
                                              "as the optimizer steps")
    if moved == 0 and optimizer_steps_k is not None and e0 == optimizer_steps_k > 0:
        return off("scheduler_not_stepped", f"up to step k the scheduler stepped once per optimizer step (last_epoch "
                                            f"= {e0} = the optimizer's step count), then not once over the {gap} "
                                            "step(s) to k+1: the rate stopped following its schedule")
    if moved < gap and _another_object(a, b):
        return off("scheduler_reset", f"the scheduler recorded at k+1 is another object than the one recorded at k, "
                                      f"and its count did not carry over ({where}, not {e0} + {gap}): it was "
                                      "re-created between the steps without its state, so its warm-up or decay "
                                      f"starts over at every re-creation (the rate {float(b['last_lr']):.4g} at k+1 "
                                      f"against {float(a['last_lr']):.4g} at k)")
    if moved == 0 and gap > 0 and optimizer_steps_k == e0 == 0:
        return PhaseCheck("scheduler", q, SUSPECT, float(gap), 0.0, where, rec, due, "scheduler_not_stepped",
                          f"the scheduler did not step over the {gap} optimizer step(s) after the run's first: a "
                          "schedule stepped per epoch does this; one stepped per optimizer step (as TRL's and "
                          "transformers' Trainer step it) was skipped, and its rate stopped following its schedule",
                          measure="|scheduler steps − optimizer steps| between k and k+1")
    return PhaseCheck("scheduler", q, AGREE, float(abs(moved - gap)) if moved else 0.0, 0.0, where,
                      measure="the scheduler's step count, exact",
                      explanation="" if moved == gap else "the scheduler did not step between these steps (a "
                                                          "schedule stepped per epoch)")
