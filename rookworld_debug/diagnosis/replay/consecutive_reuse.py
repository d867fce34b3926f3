"""Step k+1 trains step k's rollout again: its prompts and completion ids are step k's, exactly, row for row, while its
declaration says it is a rollout's first optimizer pass (iteration 0), so no later pass over one rollout explains it.
A buffered rollout restored at a resume (or a generation batch kept for one step too many) is trained again in place
of a new one, with its rewards, advantages and log-probs, sampled by weights two updates old. Checked before the
sampler: a reused rollout makes the sampler look stale (its recorded weights are the ones that sampled k).

    rollout_reuse_check(trace_k, trace_k1) -> PhaseCheck (phase "batch": DISAGREE where the loop said it takes
                                              one pass per rollout, else SUSPECT) or None
"""
from __future__ import annotations

from typing import Optional

import torch

from .records import DISAGREE, SUSPECT, PhaseCheck

QUESTION = "batch: step k+1 trains a rollout of its own (not step k's again)"
MEASURE = "rows of step k+1 whose prompt and completion ids equal step k's row, exactly"


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
        bool(torch.equal(a, b))


def rollout_reused(tk, tk1) -> bool:
    """Step k+1's prompts and completion ids are step k's, row for row, and its declaration (a recorded loop's
    iteration) names it a rollout's first pass: a reuse the declaration does not explain."""
    rec = tk1.recorded
    if rec is None or int(getattr(rec, "iteration", 0) or 0) > 0:
        return False
    r0, r1 = tk.rollout, tk1.rollout
    return len(r0.completion_ids) > 0 and _same(r0.completion_ids, r1.completion_ids) and \
        _same(r0.prompt_ids, r1.prompt_ids) and list(r0.prompts) == list(r1.prompts)


def rollout_reuse_check(tk, tk1) -> Optional[PhaseCheck]:
    """The reuse as a disagreement naming which of step k's records step k+1 holds again, or None."""
    if not rollout_reused(tk, tk1):
        return None
    r0, r1 = tk.rollout, tk1.rollout
    n = int(r1.completion_ids.shape[0])
    records = ["prompts", "completion ids"]
    for name, a, b in (("rewards", tk.rewards.rewards, tk1.rewards.rewards),
                       ("advantages", tk.advantages.advantages, tk1.advantages.advantages),
                       ("sampling log-probs", r0.sampling_per_token_logps, r1.sampling_per_token_logps),
                       ("old log-probs", r0.per_token_logps, r1.per_token_logps)):
        if _same(a, b) or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                           and bool(torch.equal(a.nan_to_num(-9e9), b.nan_to_num(-9e9)))):
            records.append(name)
    tokens = int(r1.completion_mask.sum()) if isinstance(r1.completion_mask, torch.Tensor) else 0
    mu = int(getattr(tk1.config, "num_iterations", 1) or 1)
    why = (f"step k+1 trains step k's rollout again: its {n} rows ({tokens} completion tokens) are step k's row for "
           f"row, identical in {', '.join(records)}, while it is declared a rollout's first pass (iteration 0 of "
           f"num_iterations = {mu}): no later optimizer pass explains it. The rollout of the step before was kept "
           "(a buffered rollout or generation batch restored at a resume, or a buffer not cleared) and trained in "
           "place of a new one, its completions sampled by weights two updates old")
    # one pass per rollout said by the loop itself: the reuse contradicts it; else a later pass the loop did not
    # declare may be all it is (a warning naming the keyword, never an error on an under-declared loop)
    said = mu == 1 and "num_iterations" in (getattr(tk1.recorded, "explicit", ()) or ())
    if not said:
        why += (". If the loop takes several optimizer passes over one rollout, declare them: StepRecorder(..., "
                "num_iterations=μ) and iteration= on each pass")
    return PhaseCheck("batch", QUESTION, DISAGREE if said else SUSPECT, float(n), 0.0, f"all {n} rows",
                      f"{n} rows of step k",
                      "a new rollout", "rollout_reused", why, measure=MEASURE,
                      fit={"kind": "same_rollout", "params": {"rows": n, "identical": ", ".join(records)},
                           "residual": 0.0, "sentence": why})
