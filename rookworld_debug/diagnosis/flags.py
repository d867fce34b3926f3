"""The phases' free-text flags as findings: a flag a catalogued check already explains from the records is
covered by that check's finding; any other flag becomes a `phase_note` finding, so the views list findings
only (one source of truth) and no flag is dropped."""
from __future__ import annotations

import re

from rookworld_debug.diagnosis.findings import Evidence, Finding, Fix

# flag text (regex) → the check whose finding explains it from the records
COVERED = (
    (r"zero reward std|zero-std group|ALL groups zero-std", "no-signal checks"),
    (r"tiny-σ group", "tiny_sigma_groups"),
    (r"NaN reward|unscorable|infinite reward", "unscorable_rows"),
    (r"dropout (modules )?active|policy is in training mode", "dropout_active"),
    (r"completions truncated", "all_truncated / truncation"),
    (r"loss used by the update differs from the displayed loss|recomputed loss .* differs from TRL's",
     "loss_path_mismatch"),
    (r"recomputed log-probs differ|policy and reference log-probs differ|KL at step 0|ratio deviates from 1",
     "log-prob checks"),
)
# a flag that says the step's numbers cannot be trusted is a warning; the rest are notes
SERIOUS = re.compile(r"non-finite|refused|failed|differs from|≠|must refuse|fully masked", re.I)
MAX_NOTES = 200
MALFORMED = re.compile(r"(\d+)/(\d+) completions malformed")


def check_phase_flags(trace) -> list:
    out, notes = [], []
    for flag in trace.flags:
        if any(re.search(p, flag) for p, _ in COVERED):
            continue
        m = MALFORMED.search(flag)
        if m:
            bad, n = int(m.group(1)), int(m.group(2))
            out.append(Finding(
                code="malformed_completions", severity="info",
                cause=f"{bad} of {n} completions are malformed (the reward table says which format check failed).",
                evidence=(Evidence("malformed_share", bad / max(n, 1), "share of completions with a format flag",
                                   "sampled rollout", "report: Rewards table"),),
                fix=Fix("Usually the policy's own errors (the reward penalises them); if every row is malformed, check "
                        "the prompt format and the completion budget."), score=1.0 + bad / max(n, 1)))
            continue
        notes.append(flag)
    # one finding per distinct note, at most MAX_NOTES of them (a trace with 300,000 flags is read in a second)
    distinct = list(dict.fromkeys(notes))
    for flag in distinct[:MAX_NOTES]:
        serious = bool(SERIOUS.search(flag))
        out.append(Finding(code="phase_note", severity="warning" if serious else "info", cause=flag[:2000],
                           evidence=(), fix=Fix("See the phase's record named in the note."),
                           score=3.0 if serious else 0.5))
    if len(distinct) > MAX_NOTES:
        serious = sum(bool(SERIOUS.search(f)) for f in distinct[MAX_NOTES:])
        out.append(Finding(code="phase_note", severity="warning" if serious else "info",
                           cause=f"{len(distinct) - MAX_NOTES} more distinct phase notes ({serious} of them serious) "
                                 f"not listed; {len(notes)} notes in all ({len(notes) - len(distinct)} repeats)",
                           evidence=(Evidence("phase_notes", float(len(notes)), "flags the trace holds", "trace"),),
                           fix=Fix("Read trace.flags for the full list."), score=3.0 if serious else 0.5))
    return out
