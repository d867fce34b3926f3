"""Where the rollout's unfinished rows stopped. A row without EOS ends at the batch's last column, and a generation
loop reaches that column for one of two reasons: the token budget (max_new_tokens), or every row having finished. A
row without EOS in a batch narrower than the budget was cut by something else — most often a stopping rule that
returns one decision for the whole batch and so stops every row at the step where the first row emits EOS (its
sign: every finished row ends at the last column)."""
from __future__ import annotations

from typing import Optional

from .records import AGREE, DISAGREE, SUSPECT, PhaseCheck

Q = "completion length: a row without EOS ends at the budget (max_new_tokens)"
# distinct finished completions that must all end at the batch's last column before a loop that did not declare its
# budget is told so as an error (one or two may by chance; identical ones are one draw)
DISTINCT_FOR_ERROR = 3


def stopped_rows_check(trace, eos: Optional[int]) -> Optional[PhaseCheck]:
    """The unfinished rows' length against the budget; None where there is nothing to hold (no EOS id, every row
    finished, no row finished)."""
    r = trace.rollout
    if eos is None or r.completion_ids.numel() == 0:
        return None
    ids, t = r.completion_ids, r.completion_ids.shape[1]
    is_eos = ids == eos
    finished = is_eos.any(1)                                                              # (N,)
    if bool(finished.all()) or not bool(finished.any()):
        return None
    budget = int(getattr(trace.config, "max_new_tokens", t) or t)
    declared = trace.recorded is None or "max_new_tokens" in tuple(getattr(trace.recorded, "explicit", ()) or ())
    ends = is_eos.int().argmax(1)[finished]                                               # (m,) first EOS column
    at_edge = bool((ends == t - 1).all())
    distinct = len({tuple(row.tolist()) for row in ids[finished]})
    cut = int((~finished).sum())
    if declared and t < budget:
        status = DISAGREE
    elif at_edge and distinct >= DISTINCT_FOR_ERROR:
        status = DISAGREE
    elif at_edge:
        status = SUSPECT
    else:
        return PhaseCheck("generation", Q, AGREE, 0.0, 0.0, measure="rows without EOS shorter than the budget")
    if at_edge:
        cause = "generation_stopped_for_batch"
        why = (f"{cut} rows without EOS end at column {t}, the step at which the first row emitted EOS: every one "
               f"of the {int(finished.sum())} finished rows ends exactly there"
               + (f", while the budget is {budget} tokens" if declared and t < budget else "") +
               ". The generation stopped for the whole batch when one row finished (a stopping criterion that "
               "returns one bool for the batch instead of one per row), so the other rows were cut mid-answer and "
               "score as truncated")
    else:
        cause = "completion_cut_early"
        why = (f"{cut} rows without EOS end at column {t}, short of the declared budget of {budget} tokens: the "
               "generation stopped them before the budget or an EOS (a stop rule, a length cut, or a batch width "
               "taken from another batch)")
    return PhaseCheck("generation", Q, status, float(cut), 0.0, f"{cut} rows without EOS, {t} columns",
                      f"length {t}", f"length {budget}" if declared else "EOS or the budget", cause, why,
                      measure="rows without EOS shorter than the budget")
