"""Completion ids changed after sampling, read from the sampler's own log-probs.

A sampler records the log-prob of the token it drew. Where the recorded id at a position is not that token (a loop
that writes EOS over the last token of a completion cut at the length limit, or edits ids after decoding), the
recorded sampler log-prob there is another token's log-prob under the same distribution, and the recorded id's is
not. So at each position where the sampler's log-probs disagree, the distribution of the weights that sampled is
searched for the token whose log-prob reproduces the recorded one: where every such position has exactly one, and
it is not the recorded id, the ids were rewritten after sampling. That is a generation fault (the rollout's ids are
not the sampled ones), whatever the scoring phase then computes from them.

    rewritten_ids(check, recorded, trusted, mask, logits, rollout, tol, eos) -> PhaseCheck (the check, refitted)

Shape legend: N rows, T completion tokens, V vocabulary.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .records import DISAGREE, PhaseCheck

# positions past which the search is not run (one (N, T, V) forward of the weights that sampled serves them all)
MAX_POSITIONS = 256


def rewritten_ids(check: PhaseCheck, recorded: torch.Tensor, trusted: torch.Tensor, mask: torch.Tensor, logits,
                  rollout, tol: float, eos: Optional[int]) -> PhaseCheck:
    """`check` (the sampler's log-probs, disagreeing without a cause) named as ids rewritten after sampling where
    the module doc's search holds at every disagreeing position, else `check` unchanged. `logits()`: (N, T, V) the
    raw logits of the weights that sampled at every completion position."""
    m = mask.bool()
    off = m & ((recorded.float() - trusted.float()).abs() > tol)                                 # (N, T)
    if check.status != DISAGREE or check.cause or not bool(off.any()) or int(off.sum()) > MAX_POSITIONS:
        return check
    rows, cols = off.nonzero(as_tuple=True)
    with torch.no_grad():
        raw = logits()                                                                          # (N, T, V)
    temps = rollout.temperatures.float()[rows][:, None]
    lp = (raw[rows, cols].float() / temps).log_softmax(-1)                                      # (K, V)
    near = (lp - recorded.float()[rows, cols][:, None]).abs() <= tol                            # (K, V)
    if not bool((near.sum(-1) == 1).all()):
        return check                                       # some position has no such token, or more than one
    drawn = near.float().argmax(-1)                                                             # (K,)
    ids = rollout.completion_ids[rows, cols]
    if bool((drawn == ids).any()):
        return check
    forced = _forced_eos(rows, cols, ids, rollout, eos)
    return dataclasses.replace(check, phase="generation",
                               cause="eos_forced_on_truncated" if forced else "completion_ids_rewritten",
                               explanation=_sentence(rows, cols, ids, drawn, rollout.completion_ids.shape[1], forced))


def _forced_eos(rows, cols, ids, rollout, eos) -> bool:
    """Every rewritten id is EOS, at the last column, in a row with no EOS before it (cut at the length limit)."""
    if eos is None or not bool((ids == eos).all()) or not bool((cols == rollout.completion_ids.shape[1] - 1).all()):
        return False
    return not bool((rollout.completion_ids[rows, :-1] == eos).any())


def _sentence(rows, cols, ids, drawn, width: int, forced: bool) -> str:
    at = ", ".join(f"row {int(r)} token {int(c)}: id {int(i)} recorded, id {int(d)} drawn"
                   for r, c, i, d in list(zip(rows, cols, ids, drawn))[:4]) + (", …" if len(rows) > 4 else "")
    said = (f"the completion ids were changed after sampling at {len(rows)} position(s) ({at}): there the sampler's "
            "recorded log-prob is exactly another token's under the weights that sampled, the token it drew, and "
            "not the recorded id's, so the loss trains tokens the policy never chose")
    if forced:
        said += (f"; each is the last of the {width} tokens of a completion that reached "
                 "the length limit without an end-of-sequence, overwritten with EOS: a truncated completion made "
                 "to look finished (mask it, or keep the drawn token and flag the row truncated)")
    return said
