"""Whether step k+1's sampler drew with step k's random numbers: a generator seeded again with the same seed before
every rollout (or an engine given one fixed seed per call) makes each step's draws the same stream, so the token a
row chooses at position t leans toward the one step k's row chose there.

The test reads only the tokens and the declared distribution of the weights that sampled k+1. Under independent
draws, step k+1's token at (i, t) equals step k's with probability p_{k+1}(y_k[i, t]), whatever the prompts are
(a peaked distribution repeats its token by itself, and that is in the expectation). The count of matches M over
the positions both rows reach is then a sum of those Bernoulli terms given each row's own prefix (a martingale), and
Freedman's inequality bounds its upper tail: P(M − E ≥ x) ≤ exp(−x² / (2(V + x/3))), E = Σ p,
V = Σ p(1 − p).
Shared draws push M far past E; the bound against P_ERROR decides, as sampled_tokens.py's exact tests do.

Not tested: a later pass over one rollout (the tokens are the same by design), two steps with the same tokens and
prompts (one rollout recorded twice), a filter the loop declares, a sampler whose tokens reject the declared
distribution (its own replay names that), and fewer than MIN_TOKENS shared positions.
"""
from __future__ import annotations

import math

import torch

from .compare import skipped
from .records import DISAGREE, SUSPECT, AGREE, PhaseCheck
from .sampled_tokens import MIN_TOKENS, P_ERROR, P_WARN, judge, token_statistics

QUANTITY = ("sampler draws: step k+1's tokens against step k's at the same row and position (under independent "
            "draws each matches with its probability under k+1's declared distribution)")


def draws_check(p) -> PhaseCheck:
    """The shared-stream test of the module doc between the two steps of `p` (a consecutive._Pair)."""
    from rookworld_debug.errors import RookWorldError
    from rookworld_debug.grpo.trace.state import build_model
    from .model_phases import _sampler_warpers
    tk, tk1 = p.trace_k, p.trace_k1
    r0, r1 = tk.rollout, tk1.rollout
    later_pass = int(getattr(tk1.recorded, "iteration", 0) or 0) > 0
    weights = None if p.sk1 is None else p.sk1.sampler if p.sk1.sampler is not None else \
        None if later_pass else p.sk1.before
    why = _not_tested(r0, r1, later_pass, weights, _sampler_warpers(tk1) is not None)
    if why:
        return skipped("sampler", QUANTITY, why)
    t = min(r0.completion_ids.shape[1], r1.completion_ids.shape[1])
    both = (r0.completion_mask[:, :t].bool() & r1.completion_mask[:, :t].bool())                     # (N, t)
    if int(both.sum()) < MIN_TOKENS:
        return skipped("sampler", QUANTITY, f"the two steps' rows share {int(both.sum())} positions (fewer than "
                                            f"{MIN_TOKENS} say nothing)")
    try:
        model = build_model(p.sk1, weights)           # positions from the mask, as generate() sampled
    except RookWorldError as err:
        return skipped("sampler", QUANTITY, f"the weights that sampled k+1 cannot be rebuilt ({err})")
    p_match, st = _match_probabilities(model, r1, r0.completion_ids[:, :t])
    if judge(st).status != AGREE:
        return skipped("sampler", QUANTITY, "step k+1's tokens reject its declared distribution (its own replay "
                                            "names the sampler): the expected matches would be wrong")
    return _verdict(r0.completion_ids[:, :t] == r1.completion_ids[:, :t], p_match[:, :t], both)


def _not_tested(r0, r1, later_pass: bool, weights, declared_filter: bool) -> str:
    if later_pass:
        return "step k+1 is a later pass over one rollout: its tokens are step k's by design"
    if weights is None:
        return "the weights that sampled k+1 were not recorded (StepRecorder.sampler)"
    if declared_filter:
        return "the loop declares a top-k / top-p filter: the test needs the unfiltered distribution"
    if r0.completion_ids.shape[0] != r1.completion_ids.shape[0]:
        return "the two steps have different numbers of rows"
    if r0.completion_ids.shape == r1.completion_ids.shape and bool(torch.equal(r0.completion_ids, r1.completion_ids)) \
            and bool(torch.equal(r0.prompt_ids, r1.prompt_ids)):
        return "both steps hold one and the same rollout (a later pass over it, or one rollout recorded twice)"
    return ""


@torch.no_grad()
def _match_probabilities(model, r, other_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """((N, T) the probability under `r`'s declared distribution of `other_ids`' token at each position (0 past
    other_ids' width), the chosen tokens' statistics for `judge`): one pass of `token_statistics`."""
    out = torch.zeros(r.completion_ids.shape, dtype=torch.float64)
    w = other_ids.shape[1]

    def each(rows, lp):                                                                    # lp: (n, T, V)
        other = other_ids[rows].clamp(0, lp.shape[-1] - 1)[..., None]                      # (n, w, 1)
        out[rows, :w] = lp[:, :w].gather(-1, other[:, :lp.shape[1]]).squeeze(-1).exp().double()
    return out, token_statistics(model, r, each=each)


def _verdict(match: torch.Tensor, prob: torch.Tensor, both: torch.Tensor) -> PhaseCheck:
    """Freedman's bound on M − E (module doc): DISAGREE below P_ERROR, SUSPECT below P_WARN."""
    m, e = float(match[both].sum()), float(prob[both].sum())
    v = float((prob * (1 - prob))[both].sum())
    x = m - e
    log_p = -x * x / (2 * (v + x / 3)) if x > 0 else 0.0                       # natural log of the tail bound
    log10 = log_p / math.log(10)
    where = f"{int(m)} of {int(both.sum())} shared positions"
    if log10 > math.log10(P_WARN):
        return PhaseCheck("sampler", QUANTITY, AGREE, 10 ** log10, P_WARN, where,
                          measure="P (Freedman bound) of this many matches under independent draws")
    why = (f"step k+1's rows chose step k's token at the same position {int(m)} times in {int(both.sum())} "
           f"positions both reach, where independent draws give {e:.1f} ± {math.sqrt(v):.1f} (chance ≤ "
           f"10^{log10:.0f}): the sampler drew with step k's random numbers again (a generator seeded with the same "
           "seed before every rollout, or one fixed seed per generate call). Seed once per run, or with seed + step")
    return PhaseCheck("sampler", QUANTITY, DISAGREE if log10 < math.log10(P_ERROR) else SUSPECT, 10 ** log10,
                      P_ERROR, where, f"{int(m)} matches", f"{e:.1f} ± {math.sqrt(v):.1f}", "sampling_seed_repeated",
                      why, measure="P (Freedman bound) of this many matches under independent draws",
                      fit={"kind": "shared_stream", "params": {"matches": int(m), "expected": e, "variance": v,
                                                               "positions": int(both.sum())}, "residual": None})
