"""What the sampler did, read from the tokens it chose: the rollout's tokens against the distribution the loop
declares it sampled from (the weights that sampled, at the declared temperature, no filter).

A loop can record log-probs that agree with the policy's and still have sampled from another distribution: a
nucleus (top-p) or top-k filter, greedy decoding, a repetition penalty, another temperature, applied while sampling
and left out of the recorded log-probs. Every such sampler leaves a trace in WHICH tokens it chose, and each trace
has an exact probability under the declared distribution, position by position:
  a filter      no chosen token outside the top k (or the top-p nucleus): P = Π_t mass_t(kept set); the kept set
                tried is the tightest of the usual values that holds every chosen token (k = 1 is greedy);
  a minimum     no row ending before token m, the earliest any row ended: P = Π_rows Π_{t<m} (1 − P_t(EOS));
  a penalty     tokens already in the sequence chosen less often than Σ_t P_t(a seen token) predicts;
  a temperature the chosen tokens' log-probs summed, against their expectation −Σ_t H_t and variance Σ_t Var_t.
Each is a test the declared distribution passes except with the stated probability (a filter's P is family-wise:
× the number of sets tried). A filter's and a minimum's P is exact: past its error bound (P < P_ERROR) the generation
phase disagrees; past only its warning bound (P < P_WARN) it is SUSPECT, a warning that no later phase waits on. The
two sums are normal approximations, and tokens the loop wrote rather than sampled (a fixed completion, a replay
buffer) move them too: past Z_WARN they are SUSPECT, never more. Each names the sampler's mechanism with the step's
numbers.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .records import AGREE, DISAGREE, SUSPECT, PhaseCheck

TOP_K = (1, 2, 3, 5, 10, 20, 40, 50, 64, 100)       # the top-k values samplers use (1: greedy)
TOP_P = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.95, 0.98, 0.99)   # and top-p
# family-wise probabilities under the declared distribution: an error claims the sampler's filter, a warning says to
# look (a healthy sampler draws a false warning once in 10,000 recorded steps)
P_ERROR, P_WARN = 1e-8, 1e-4
# a sum this many standard deviations from its expectation (a normal tail of 6e-7): a warning
Z_WARN = 5.0
MIN_TOKENS = 32           # fewer chosen tokens say nothing about a sampler
_PARTS = ("rank", "cum_before", "k_mass", "p_mass", "seen", "seen_mass", "lp", "mean", "var", "first", "p_eos")
QUANTITY = "the tokens the sampler chose, against the declared distribution (the weights that sampled, ÷ T)"


@torch.no_grad()
def token_statistics(model, r, elements: int = 2 ** 25, eos: Optional[int] = None,
                     hidden: Optional[torch.Tensor] = None, each: Optional[Callable] = None) -> dict:
    """Per chosen token (the completion mask's): its rank, the mass of the top-k and top-p sets of TOP_K / TOP_P,
    whether it was already in the sequence and the chance of that, its log-prob with that log-prob's mean and
    variance under the declared distribution; (M,) or (M, len(grid)) tensors over the M masked tokens. Rows go
    through the model a few at a time: each holds (rows, T, V) tensors of `elements` at most. `hidden` (N, T, d):
    the LM head's inputs at the completion positions from a forward of these weights already run (the head alone
    is applied to them). `each(rows, lp)`: called with every chunk's (rows, T, V) log-probs, for a caller that
    reads more of the same distribution."""
    head = model.get_output_embeddings()
    vocab = int(head.weight.shape[0])
    if hidden is not None and hidden.shape[1] < r.completion_ids.shape[1] and \
            _earliest_end(r.completion_ids, r.completion_mask, eos) > hidden.shape[1]:
        hidden = None           # the minimum-length test reads P(EOS) up to the earliest end: past those columns
    t = r.completion_ids.shape[1] if hidden is None else hidden.shape[1]
    rows_per_forward = max(1, elements // max(1, t * vocab))
    parts: dict = {k: [] for k in _PARTS}
    for s in range(0, r.completion_ids.shape[0], rows_per_forward):
        rows = slice(s, s + rows_per_forward)
        ids, mask = r.completion_ids[rows, :t], r.completion_mask[rows, :t].bool()
        lp = (completion_logits(model, r, rows) if hidden is None else head(hidden[rows])).float()
        lp = (lp / r.temperatures[rows].float().to(lp.device)[:, None, None]).log_softmax(-1)
        _add(parts, lp, ids, mask, seen_before(r.prompt_ids[rows], r.prompt_mask[rows].bool(), ids, lp.shape[-1]), eos)
        if each is not None:
            each(rows, lp)
    return {**{k: torch.cat(v) for k, v in parts.items() if v}, "vocab": vocab}


def _earliest_end(ids: torch.Tensor, mask: torch.Tensor, eos: Optional[int]) -> int:
    """The column of the earliest end-of-sequence token in any row's mask (the width where none has one)."""
    at = ((ids == eos) & mask.bool()).any(0).nonzero() if eos is not None else ids.new_zeros(0)
    return int(at.min()) if at.numel() else ids.shape[1]


def completion_logits(model, r, rows) -> torch.Tensor:
    """(n, T, V) the logits that predict each completion token of `rows`: one forward of prompt and completion,
    position ids from the attention mask."""
    ids, mask = r.completion_ids[rows], r.completion_mask[rows]
    full = torch.cat([r.prompt_ids[rows], ids], 1)
    attn = torch.cat([r.prompt_mask[rows].long(), mask.long()], 1)
    logits = model(input_ids=full, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
    p, t = r.prompt_ids.shape[1], ids.shape[1]
    return logits[:, p - 1:p + t - 1]


def statistics_of(lp: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, seen_before: torch.Tensor,
                  eos: Optional[int] = None) -> dict:
    """`token_statistics` of given (n, T, V) log-probs of the declared distribution and the chosen ids (n, T)."""
    parts: dict = {k: [] for k in _PARTS}
    _add(parts, lp, ids, mask.bool(), seen_before, eos)
    return {**{k: torch.cat(v) for k, v in parts.items() if v}, "vocab": int(lp.shape[-1])}


def _add(parts: dict, lp, ids, mask, seen_before, eos: Optional[int] = None) -> None:
    probs = lp.exp()                                                                   # (n, T, V)
    sorted_p = probs.sort(-1, descending=True).values                                  # (n, T, V)
    cum = sorted_p.cumsum(-1)
    chosen = lp.gather(-1, ids[..., None]).squeeze(-1)                                 # (n, T)
    above = lp > chosen[..., None]                                                     # (n, T, V)
    parts["rank"].append((above.sum(-1) + 1)[mask])
    parts["cum_before"].append((probs * above).sum(-1)[mask])
    ks = torch.tensor(TOP_K).clamp(max=lp.shape[-1])
    parts["k_mass"].append(cum[..., ks - 1][mask])                                     # (M, |K|)
    before = (cum - sorted_p).contiguous()                                             # exclusive cumsum
    qs = torch.tensor(TOP_P, dtype=before.dtype).expand(*before.shape[:2], len(TOP_P)).contiguous()
    kept = torch.searchsorted(before, qs)                          # (n, T, |P|) tokens with less mass above than q
    parts["p_mass"].append(cum.gather(-1, (kept - 1).clamp(min=0))[mask])             # the nucleus's mass
    parts["seen"].append(seen_before.gather(-1, ids[..., None]).squeeze(-1)[mask])
    parts["seen_mass"].append((probs * seen_before).sum(-1)[mask])
    ent_terms = torch.where(probs > 0, probs * lp, torch.zeros_like(lp))
    mean = ent_terms.sum(-1)                                                           # E[ℓ] = −H
    second = torch.where(probs > 0, probs * lp * lp, torch.zeros_like(lp)).sum(-1)
    parts["lp"].append(chosen[mask])
    parts["mean"].append(mean[mask])
    parts["var"].append((second - mean * mean).clamp(min=0)[mask])
    if eos is not None and 0 <= eos < lp.shape[-1]:     # each row's first EOS (T: none) and P(EOS) at every t
        ended = (ids == eos) & mask
        parts["first"].append(torch.where(ended.any(1), ended.int().argmax(1), torch.full_like(ids[:, 0], ids.shape[1])))
        parts["p_eos"].append(probs[..., eos])


def seen_before(prompt_ids, prompt_mask, ids, vocab: int) -> torch.Tensor:
    """(n, T, V) bool: token v occurs in the row before completion position t (its prompt's real tokens, then the
    completion's earlier tokens): what a repetition penalty divides."""
    n, t = ids.shape
    prompt = torch.zeros(n, vocab, dtype=torch.uint8)
    prompt[torch.arange(n)[:, None].expand_as(prompt_ids)[prompt_mask], prompt_ids.clamp(0, vocab - 1)[prompt_mask]] = 1
    at = torch.zeros(n, t, vocab, dtype=torch.uint8)                                       # token v chosen at t
    at.scatter_(2, ids.clamp(0, vocab - 1)[..., None], 1)
    earlier = torch.cat([torch.zeros_like(at[:, :1]), at[:, :-1]], 1).cummax(1).values    # (n, T, V) before t
    return (earlier | prompt[:, None]).bool()


def sampled_tokens_check(model, r, declared_filter: bool, eos: Optional[int] = None,
                         hidden: Optional[torch.Tensor] = None) -> Optional[PhaseCheck]:
    """The chosen tokens against the declared distribution (module doc); None where it cannot be tested: a filter
    the loop declares (its kept set is the declared distribution) or too few tokens. `hidden`: as token_statistics
    takes it."""
    if declared_filter or int(r.completion_mask.sum()) < MIN_TOKENS:
        return None
    return shared_or_judged(token_statistics(model, r, eos=eos, hidden=hidden), r)


def shared_or_judged(st: dict, r) -> PhaseCheck:
    """Groups of identical rows drawn with shared random numbers, unless the distinct rows' tokens reject the
    declared distribution (then `judge`'s mechanism)."""
    shared = shared_draws(st, r)
    if shared is None:
        return judge(st)
    # shared draws' chance is computed under the declared distribution: where the distinct rows' tokens reject that
    # distribution (a ban or penalty that forces tokens repeats rows too), the identical rows are no evidence
    verdict = judge(_distinct_rows(st, r, shared.fit["params"]["rows"]))
    return shared if verdict.status == AGREE else verdict


def _distinct_rows(st: dict, r, copies: list) -> dict:
    """`st` without the rows in `copies` (repeats of another row): per-token parts by token, per-row parts by row."""
    n = r.completion_ids.shape[0]
    keep_row = torch.ones(n, dtype=torch.bool)
    keep_row[copies] = False
    keep_tok = keep_row.repeat_interleave(r.completion_mask.sum(1).long())                   # (M,)
    per_row = {"first", "p_eos"}
    return {k: (v[keep_row] if k in per_row else v[keep_tok]) if torch.is_tensor(v) else v for k, v in st.items()}


def shared_draws(st: dict, r) -> Optional[PhaseCheck]:
    """A disagreement when groups whose G rows are one and the same completion (a chance of Π p(completion)^(G−1)
    under independent draws, below P_ERROR) hold tokens that are not the most likely (so not greedy decoding): the
    rows drew with the same random numbers (one seed or generator for every request of a group); else None."""
    g = int(r.num_generations)
    n, t = r.completion_ids.shape
    if g < 2 or n % g:
        return None
    ids = (r.completion_ids * r.completion_mask).view(n // g, g, t)
    same = [k for k in range(n // g) if bool((ids[k] == ids[k, :1]).all()) and
            bool((r.completion_mask.view(n // g, g, t)[k] == r.completion_mask.view(n // g, g, t)[k, :1]).all())]
    if not same:
        return None
    counts = r.completion_mask.sum(1).long().tolist()
    # each row's last in-mask token is left out: an engine may append it rather than draw it (a stop id or string
    # ended the row and the trainer's pad, its EOS, follows), and then its probability says nothing about the draws
    m = r.completion_mask.bool()
    drawn = ((m.cumsum(1) < m.sum(1, keepdim=True)) & m)[m]                          # (M,) all but each row's last
    lp = torch.split(st["lp"].double() * drawn, counts)
    # not the most likely beyond a rounding flip: more than twice the token's own probability ranks above it
    clear = torch.split((st["rank"] > 1) & (st["cum_before"].double() > 2 * st["lp"].double().exp()) & drawn, counts)
    firsts = [k * g for k in same]
    log10 = (g - 1) * float(sum(lp[i].sum() for i in firsts)) / math.log(10)
    off = sum(int(clear[i].sum()) for i in firsts)
    tokens = sum(max(counts[i] - 1, 0) for i in firsts)
    if log10 > math.log10(P_ERROR) or off == 0:
        return None                     # chance, or every token the argmax: greedy decoding (the filter test's)
    why = (f"{len(same)} of {n // g} groups hold G = {g} copies of one completion (under independent draws at the "
           f"declared temperature: chance 10^{log10:.0f}), and {off} of their {tokens} tokens before each row's last are "
           "clearly not the most "
           "likely ones (more than twice their probability ranks above them), so they were sampled, not decoded greedily: every row of a group drew with the same random numbers "
           "(one seed or generator shared by the group's requests). Seed each row's sampler differently")
    return PhaseCheck("generation", QUANTITY, DISAGREE, 10 ** log10, P_ERROR, f"groups {same[:6]}",
                      f"{len(same)} groups of identical rows", "G independent draws per group",
                      "sampling_draws_shared", why, measure="P of identical rows under independent draws",
                      fit={"kind": "shared_draws", "params": {"groups": len(same), "not_argmax": off,
                                                              "rows": [k * g + j for k in same for j in range(1, g)]},
                           "residual": None})


def judge(st: dict) -> PhaseCheck:
    """The check from the chosen tokens' statistics (`token_statistics`): the first test past its bound names
    the mechanism, a filter first (the most specific), then a penalty, then a sharper or flatter distribution."""
    m = st["rank"].numel()
    found = _filter(st, m) or _min_length(st) or _penalty(st, m) or _temperature(st, m)
    if found is None:
        return PhaseCheck("generation", QUANTITY, AGREE, 0.0, P_WARN,
                          measure="a filter's P, a repeat or sharpness z (none beyond its warning bound)")
    size, where, rec, ours, explanation, params = found
    code = "sampling_greedy" if params.get("filter") == "top_k=1" else "sampler_distribution_changed"
    if params["kind"] == "sampler_filter":
        strong, bound, measure = size < P_ERROR, (P_ERROR if size < P_ERROR else P_WARN), \
            "P (family-wise) of the chosen tokens under the declared distribution"
    else:
        strong, bound, measure = False, Z_WARN, "|z| of the chosen tokens"
    return PhaseCheck("generation", QUANTITY, DISAGREE if strong else SUSPECT, size, bound, where, rec, ours, code,
                      explanation, measure=measure, fit={"kind": params["kind"], "params": params, "residual": None})


def _filter(st: dict, m: int) -> Optional[tuple]:
    """The tightest top-k and top-p sets of the usual values that hold every chosen token; the less probable of the
    two under the declared distribution, when that probability (family-wise) is below P_WARN."""
    vocab = st["vocab"]
    k = next((k for k in TOP_K if k >= int(st["rank"].max()) and k < vocab), None)
    q = next((q for q in TOP_P if q > float(st["cum_before"].max())), None)
    kept = ([(f"top_k={k}", st["k_mass"][:, TOP_K.index(k)])] if k is not None else []) + \
        ([(f"top_p={q:g}", st["p_mass"][:, TOP_P.index(q)])] if q is not None else [])
    if not kept:
        return None
    log_p, name, mass = min(((float(mass.double().clamp(min=1e-300).log().sum()), name, mass) for name, mass in kept),
                            key=lambda x: x[0])
    log_p += math.log(len(TOP_K) + len(TOP_P))         # any of the sets could have been the tightest
    if log_p > math.log(P_WARN):
        return None
    outside = float((1 - mass.double()).sum())
    what = "greedy decoding (every chosen token the most likely one)" if name == "top_k=1" else \
        f"a {name.replace('_', '-')} filter"
    explanation = (f"the sampler drew from a filtered distribution, {what}, that the loop does not declare: none of "
                   f"the {m} chosen tokens lies outside it, where the declared distribution puts {outside:.1f} of "
                   f"them (P = {math.exp(log_p):.2g} that none would, over the {len(TOP_K) + len(TOP_P)} usual sets; "
                   f"the loosest chosen token: rank {int(st['rank'].max())}, "
                   f"{float(st['cum_before'].max()):.3f} of the probability above it). The loss scores the completions "
                   "under the unfiltered policy: the rollout is off-policy by the filter")
    return (math.exp(log_p), f"{m} chosen tokens", f"0 outside {name}", f"{outside:.1f} expected outside",
            explanation, {"kind": "sampler_filter", "filter": name, "tokens": m, "expected_outside": outside,
                          "log_probability": log_p})


def _min_length(st: dict) -> Optional[tuple]:
    """No row ended before the earliest end any row has, where the declared distribution puts EOS there."""
    if not st.get("first", torch.zeros(0)).numel():
        return None
    first, p_eos = st["first"], st["p_eos"].double()                                   # (N,), (N, T)
    m = int(first.min())
    before = torch.arange(p_eos.shape[1])[None] < m                                    # (1, T)
    log_p = float(((1 - p_eos).clamp(min=1e-300).log() * before).sum())
    if m < 2 or log_p > math.log(P_WARN):
        return None
    expected = float((p_eos * before).sum())
    explanation = (f"no row ended before token {m}: the earliest end-of-sequence of the {first.numel()} rows is at "
                   f"token {m}, where the declared distribution puts {expected:.1f} ends before it (P = "
                   f"{math.exp(log_p):.2g} that none would): the sampler suppressed end-of-sequence before {m} "
                   "tokens (a min_new_tokens or min_length), a rule the loss's probabilities do not have")
    return (math.exp(log_p), f"{first.numel()} rows", f"earliest end at token {m}", f"{expected:.1f} ends expected "
            "before it", explanation, {"kind": "sampler_filter", "filter": f"min_new_tokens≥{m}",
                                       "expected_outside": expected, "log_probability": log_p, "tokens": m})


def _penalty(st: dict, m: int) -> Optional[tuple]:
    """Tokens already in the sequence chosen less (or more) often than the declared distribution gives."""
    q = st["seen_mass"].double()
    observed, expected, sd = float(st["seen"].sum()), float(q.sum()), float((q * (1 - q)).sum()) ** 0.5
    z = (observed - expected) / sd if sd > 0 else 0.0
    if abs(z) < Z_WARN:
        return None
    how = "less" if z < 0 else "more"
    explanation = (f"the sampler chose tokens already in the sequence {how} often than the declared distribution "
                   f"gives: {observed:.0f} of {m} chosen tokens repeat one, where {expected:.1f} ± {sd:.1f} are "
                   f"expected (z = {z:.1f}): " + ("a repetition penalty (or a no-repeat filter) reweights the "
                                                  "sampler's distribution" if z < 0 else
                                                  "the sampler favours repeats") + "; the loss scores the "
                   "completions under the unpenalised policy, so the rollout is off-policy by it")
    return (abs(z), f"{m} chosen tokens", f"{observed:.0f} repeats", f"{expected:.1f} ± {sd:.1f}", explanation,
            {"kind": "sampler_repetition", "z": z, "observed": observed, "expected": expected, "tokens": m})


def _temperature(st: dict, m: int) -> Optional[tuple]:
    """The chosen tokens' summed log-prob against its expectation under the declared distribution."""
    observed, expected = float(st["lp"].double().sum()), float(st["mean"].double().sum())
    sd = float(st["var"].double().sum()) ** 0.5
    z = (observed - expected) / sd if sd > 0 else 0.0
    if abs(z) < Z_WARN:
        return None
    how = "sharper (a lower temperature, or a filter of another kind)" if z > 0 else \
        "flatter (a higher temperature, or a ban or penalty that forces less likely tokens)"
    explanation = (f"the chosen tokens are {'more' if z > 0 else 'less'} likely than sampling the declared "
                   f"distribution gives: Σ log-prob = {observed:.1f} over {m} tokens where {expected:.1f} ± {sd:.1f} "
                   f"is expected (z = {z:.1f}): the sampler's distribution is {how} than the declared one")
    return (abs(z), f"{m} chosen tokens", f"Σℓ = {observed:.1f}", f"{expected:.1f} ± {sd:.1f}", explanation,
            {"kind": "sampler_sharpness", "z": z, "observed": observed, "expected": expected, "tokens": m})
