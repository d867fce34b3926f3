"""A consecutive-step replay as findings: each quantity that did not carry over is an error (a warning when the
quantity it depends on did not carry over either, which may explain it), with its evidence and the fix; steps that
cannot be compared are a named note."""
from __future__ import annotations

from rookworld_debug.diagnosis.findings import Evidence, Finding, Fix

from .consecutive import DEPENDS, ConsecutiveReplay
from .records import AGREE, DISAGREE, SKIPPED, SUSPECT

# what to change in a loop when a quantity does not carry over from one step to the next
FIXES = {
    "weights": "Keep one policy across steps: no reload of its start checkpoint or re-initialisation between steps, "
               "and the optimizer stepping the parameters of the model the next step samples and trains (not a "
               "copy's).",
    "optimizer": "Create the optimizer once, before the loop, and keep it across steps (when the model is rebuilt, "
                 "carry its state over with optimizer.load_state_dict).",
    "scheduler": "Create the learning-rate scheduler once, on the optimizer it schedules, and call scheduler.step() "
                 "exactly once after each optimizer.step() (never per micro-batch, never before the optimizer's step); "
                 "on resume, load its state_dict with the optimizer's.",
    "sampler": "Copy the policy's weights into the sampler after every optimizer step, before the next rollout "
               "(sampler.load_state_dict(policy.state_dict()), or the rollout engine's weight sync).",
    "reference": "Freeze the reference: a separate copy of the start weights, requires_grad False, never assigned "
                 "or mixed from the policy (unless the objective means it, as TRL's sync_ref_model: then declare it).",
    "gradient": "Call optimizer.zero_grad() at the start of every step, before the first micro-batch's backward.",
    "rewards": "Make the reward a function of (prompt, completion, label) only: no counter, running statistic or "
               "cache carried from one call to the next (a cache keyed by the whole input is fine).",
    "batch": "Create the data iterator once and keep it across steps; on resume, skip the batches already trained "
             "(accelerate's skip_first_batches, or the sampler's saved state).",
}
# where a cause is named and its fix is not the quantity's
CAUSE_FIXES = {
    "sampling_seed_repeated": "Seed the sampler's generator once per run (or with seed + step), never again with "
                              "the same seed before each rollout; an engine's per-call seed must change per call.",
}
# what the evidence cannot tell from the cause: a change between steps that is meant
ALTERNATIVES = {
    "reference_tracks_policy": ("a reference synced on purpose (TRL's sync_ref_model): then it is the objective",),
    "scheduler_stepped_extra": ("a schedule written in micro-batches on purpose: then its horizon counts them",),
    "reward_has_memory": ("a reward meant to change over training (a curriculum, a schedule): then it is by design",),
}
SCORE = 100.0


def _evidence(c, steps) -> tuple:
    batch = f"steps {steps[0]} and {steps[1]}"
    out = (Evidence(name=f"replay/consecutive/{c.phase}/difference", value=float(c.max_abs_diff),
                    definition=f"{c.measure} of {c.quantity}; tolerance {c.tolerance:.3g} "
                               f"({'exact' if c.tolerance == 0 else 'from the recorded precision'}); recorded "
                               f"{c.recorded or '—'}, due {c.recomputed or '—'}",
                    batch=batch, where=c.where or ""),)
    if c.fit:
        params = ", ".join(f"{k} = {v:.4g}" if isinstance(v, float) else f"{k} = {v}"
                           for k, v in c.fit.get("params", {}).items())
        out += (Evidence(name=f"replay/consecutive/{c.phase}/fit", value=float(c.fit.get("residual", 0.0)),
                         definition=f"residual of the fit ({c.fit.get('kind')}: {params})", batch=batch),)
    return out


def _finding(c, pair: ConsecutiveReplay, follows: str) -> Finding:
    k, k1 = pair.steps
    what = c.explanation or "no known mechanism reproduces it; the quantity is the finding"
    size = f"{c.max_abs_diff:.4g} (tolerance {c.tolerance:.3g})"
    if follows:
        cause = (f"Between steps {k} and {k1} (k and k+1), {c.quantity} differs from what is due by {size}; the "
                 f"{follows} did not carry over either, which may explain it. {what}.")
    else:
        cause = (f"Between steps {k} and {k1} (k and k+1), {c.quantity} does not carry over: it differs from what "
                 f"is due by {size} at {c.where or 'the whole'}. {what}.")
    return Finding(code=c.cause or f"consecutive_{c.phase}",
                   severity="warning" if follows or c.status == SUSPECT else "error", cause=cause,
                   evidence=_evidence(c, pair.steps), fix=Fix(CAUSE_FIXES.get(c.cause, FIXES[c.phase]),
                                                              code_change=CAUSE_FIXES.get(c.cause, FIXES[c.phase])),
                   alternatives=ALTERNATIVES.get(c.cause, ()) + ((f"another change to the {c.phase} between the "
                                                                  "steps that happens to give the same values",)
                                                                 if c.cause else ()),
                   score=SCORE / 2 if follows else SCORE, step=k1)


def consecutive_findings(pair: ConsecutiveReplay) -> list[Finding]:
    """The pair's findings, each at the later step: one per cause (a cause named by two checks keeps the first)."""
    k, k1 = pair.steps
    if pair.note:
        return [Finding(code=pair.note_code or "steps_not_one_run", severity="warning",
                        cause=f"Steps {k} and {k1} were not compared: {pair.note}.", evidence=(),
                        fix=Fix("Diagnose a folder holding consecutive steps of one run (one StepRecorder save per "
                                "step, each in a folder of its own)."), score=1.0, step=k1)]
    failed = {c.phase for c in pair.checks if c.status == DISAGREE}
    out, codes = [], set()
    for c in sorted(pair.checks, key=lambda c: c.status == SUSPECT):      # an error before a warning
        if c.status not in (DISAGREE, SUSPECT):
            continue
        f = _finding(c, pair, DEPENDS.get(c.phase, "") if DEPENDS.get(c.phase) in failed else "")
        if f.code not in codes:
            codes.add(f.code)
            out.append(f)
    if not out:
        agreed = [c.phase for c in pair.checks if c.status == AGREE]
        out.append(Finding(code="consecutive_agrees", severity="info",
                           cause=f"Steps {k} and {k1} carry over: {', '.join(agreed) or 'nothing could be checked'}"
                                 f"{' agree' if agreed else ''}.",
                           evidence=tuple(e for c in pair.checks if c.status == AGREE
                                          for e in _evidence(c, pair.steps)),
                           fix=Fix("Nothing to fix between these steps."), score=0.0, step=k1))
    skipped = [c for c in pair.checks if c.status == SKIPPED]
    if skipped:
        out.append(Finding(code="consecutive_incomplete", severity="info",
                           cause=f"Not checked between steps {k} and {k1}: "
                                 + "; ".join(f"{c.phase} ({c.explanation})" for c in skipped) + ".",
                           evidence=(Evidence("replay/consecutive/seconds", pair.seconds, "wall time of the pair's "
                                              "checks", f"steps {k} and {k1}"),),
                           fix=Fix("Record the missing pieces at both steps (rookworld_debug.record.StepRecorder)."),
                           score=0.0, step=k1))
    return out
