"""A forward that saw each prompt cut to its last k tokens (a max_prompt_length applied to one forward's prompts and
not to the sampler's): rows whose prompt is at most k tokens long are scored as recorded, longer ones on a shorter
context. Read from which rows disagree: k lies between the longest prompt among the rows that agree and the shortest
among the rows that do not; with no row agreeing, the lengths a configuration sets (multiples of 8) below the
shortest prompt are tried."""
from __future__ import annotations

from dataclasses import replace

import torch

from .records import DISAGREE, PhaseCheck

MAX_TRIES = 8           # forwards one disagreement may cost


def prompt_cut(check: PhaseCheck, rec: torch.Tensor, ours: torch.Tensor, mask: torch.Tensor, logps_cut,
               prompt_mask: torch.Tensor) -> PhaseCheck:
    """`check` with the cause named where one cut length k reproduces `rec` (N, T) within the check's tolerance;
    `logps_cut(k)` gives the (N, T) log-probs with each prompt cut to its last k tokens; else `check` unchanged."""
    if check.status != DISAGREE or check.cause:
        return check
    m = mask.bool()
    off = ((rec.double() - ours.double()).abs().masked_fill(~m, 0.0) > check.tolerance).any(1)     # (N,)
    lengths = prompt_mask.sum(1)                                                                     # (N,)
    live = m.any(1)
    if not bool((off & live).any()):
        return check
    low = int(lengths[live & ~off].max()) if bool((live & ~off).any()) else 0
    high = int(lengths[off & live].min()) - 1          # a cut shorter than every disagreeing row's prompt
    if low > high:
        return check                                   # a row longer than a disagreeing one agrees: not a cut
    tries = list(range(high, low - 1, -1)) if low else [k for k in range(high, 0, -1) if k % 8 == 0]
    for k in tries[:MAX_TRIES]:
        v = logps_cut(k)
        if float((rec.double() - v.double()).abs().masked_fill(~m, 0.0).max()) <= check.tolerance:
            why = (f"the forward saw each prompt cut to its last {k} tokens: the {int((off & live).sum())} rows whose "
                   f"prompt is longer (from {high + 1} tokens) are scored on a shorter context than the sampler "
                   f"generated from, the rows of at most {k} tokens as recorded. A max_prompt_length of {k} (or a "
                   "tokenizer's truncation) applied to this forward's prompts and not to the sampler's")
            fit = {"kind": "prompt_cut", "params": {"keep_last": k, "tried": tries[:MAX_TRIES]}, "residual": 0.0,
                   "sentence": why}
            return replace(check, cause="prompt_tokens_differ", explanation=why, fit=fit)
    return check


def prompt_text_cut(check: PhaseCheck, trace, tokenizer, trusted: torch.Tensor) -> PhaseCheck:
    """The sampler's log-probs `check` (against `trusted` (N, T), the weights that sampled, on the recorded prompt
    ids) with the cause named where the recorded prompt ids decode to a strict end (or start) of the row's prompt
    text on exactly the rows that disagree: the forward that was recorded scored a cut prompt, the sampler generated
    from the whole one; else `check` unchanged."""
    r = trace.rollout
    if check.status != DISAGREE or check.cause or tokenizer is None or not r.prompts:
        return check
    m = r.completion_mask.bool()
    off = ((r.sampling_per_token_logps.double() - trusted.double()).abs().masked_fill(~m, 0.0)
           > check.tolerance).any(1)                                                                # (N,)
    cut, side = [], set()
    for i in range(r.prompt_ids.shape[0]):
        seen = tokenizer.decode(r.prompt_ids[i][r.prompt_mask[i].bool()].tolist(), skip_special_tokens=True)
        text = str(r.prompts[i])
        shorter = len(seen.strip()) < len(text.strip())
        if shorter and text.endswith(seen):
            side.add("left")
        elif shorter and text.startswith(seen):
            side.add("right")
        cut.append(shorter and (text.endswith(seen) or text.startswith(seen)))
    cut = torch.tensor(cut)
    live = m.any(1)
    if not bool((cut & live).any()) or not torch.equal(cut & live, off & live) or len(side) != 1:
        return check
    longest = int(r.prompt_mask.sum(1)[cut].max())
    why = (f"the recorded prompt ids of {int(cut.sum())} rows are the {'last' if side == {'left'} else 'first'} "
           f"{longest} tokens or fewer of their prompt text: the forward that was recorded scored prompts cut to "
           f"{longest} tokens (a max_prompt_length, or a tokenizer's truncation) while the sampler generated from "
           "the whole prompt, so its log-probs disagree on exactly those rows and the policy is trained on a context "
           "it did not sample from. Apply the same truncation to the sampler's prompts, or none to the trainer's")
    fit = {"kind": "prompt_cut", "params": {"rows": int(cut.sum()), "keep": longest, "side": next(iter(side))},
           "residual": 0.0, "sentence": why}
    return replace(check, cause="prompt_tokens_differ", explanation=why, fit=fit)
