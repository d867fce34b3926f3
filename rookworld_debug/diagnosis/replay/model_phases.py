"""The phases a replay recomputes from weights: the log-probs (policy, π_old, sampler, reference), the gradient of
the declared loss, and the optimizer's update.

Shape legend: N rows, T completion tokens, P prompt tokens, V vocabulary.
"""
from __future__ import annotations

import math
import weakref
from typing import Optional

import torch

from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy

from .compare import _max_diff, DISAGREE, LOGP_REL, LOGP_TOL, MEAN_TOL, SAMPLER_TOL, compare, skipped, tol_for
from .dropout_noise import dropout_noise
from .fits import value_fits
from .precision_paths import logsoftmax_path
from .records import AGREE, PhaseCheck
from .prompt_cut import prompt_cut, prompt_text_cut
from .rewritten_ids import rewritten_ids

ROWS_PER_FORWARD = 16

# a model's results per rollout and variant, computed once: the declaration fits re-run the scoring phase under each
# neighbouring declaration, asking for the same forwards again. Held weakly (a notebook's models are freed with it);
# keyed by the parameters' in-place version counters, so a model whose weights changed is recomputed.
_MEMO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
MEMO_MAX_BYTES = 64 * 2 ** 20           # the raw (N, T, V) logits are kept only below this size


def _memoised(fn):
    def cached(model, r, **kw):
        try:
            key = (fn.__name__, id(r), tuple(p._version for p in model.parameters()),
                   tuple(sorted((k, _hashable(v)) for k, v in kw.items())))
            memo = _MEMO.setdefault(model, {})
        except TypeError:                   # a model that cannot be held weakly: computed each time
            return fn(model, r, **kw)
        hit = memo.get(key)
        if hit is not None and hit[0]() is r:
            return hit[1]
        value = fn(model, r, **kw)
        if not isinstance(value, torch.Tensor) or value.numel() * value.element_size() <= MEMO_MAX_BYTES:
            memo[key] = (weakref.ref(r), value)
        return value
    cached.__doc__, cached.__name__, cached.uncached = fn.__doc__, fn.__name__, fn
    return cached


def _hashable(v):
    if isinstance(v, torch.Tensor):
        return tuple(v.flatten().tolist())
    return tuple(_hashable(x) for x in v) if isinstance(v, (tuple, list)) else v


@_memoised
@torch.no_grad()
def _variant_logps(model, r, *, temperature_one=False, plain_positions=False, unshifted=False,
                   warp=None, temperature: Optional[float] = None, other_side=False, no_mask=False,
                   pad_logits: int = 0, position_offset: int = 0, prefix: Optional[int] = None,
                   keep_last: Optional[int] = None, top_token: bool = False) -> torch.Tensor:
    """(N, T) log-probs of the sampled ids under a common scoring mistake: logits not divided by the temperature,
    position ids that count the left padding, logits not shifted by one (position t scoring token t), the
    prompts padded on the other side (`other_side`: the completion follows the pads, so a short prompt's first
    completion token is predicted from a pad position), no attention mask (`no_mask`: every position attends to
    the pads), `pad_logits` more entries of logit 0 in the log-softmax (a vocabulary padded to a multiple), position
    ids `position_offset` later, one more token `prefix` before every prompt (attended: a BOS the ids lack), or each
    prompt cut to its last `keep_last` tokens (the earlier ones masked out: a left truncation), or the log-prob of
    each position's most likely token instead of the sampled one (`top_token`)."""
    out = []
    for s in range(0, r.completion_ids.shape[0], ROWS_PER_FORWARD):
        rows = slice(s, s + ROWS_PER_FORWARD)
        ids, mask = r.completion_ids[rows], r.completion_mask[rows].long()
        p_ids, p_mask = r.prompt_ids[rows], r.prompt_mask[rows].long()
        if other_side:                      # the real tokens moved to the other end, their order kept
            order = torch.argsort(p_mask if bool(p_mask[:, 0].eq(1).all()) else 1 - p_mask, dim=1, stable=True)
            p_ids, p_mask = p_ids.gather(1, order), p_mask.gather(1, order)
        if keep_last is not None:           # the real tokens before the last keep_last, masked as pads
            p_mask = p_mask * (p_mask.flip(1).cumsum(1).flip(1) <= keep_last).long()
        if prefix is not None:              # at column 0: the pads between it and the prompt are not attended
            p_ids = torch.cat([p_ids.new_full((p_ids.shape[0], 1), prefix), p_ids], 1)
            p_mask = torch.cat([p_mask.new_ones((p_mask.shape[0], 1)), p_mask], 1)
        full, attn = torch.cat([p_ids, ids], 1), torch.cat([p_mask, mask], 1)
        kw = {} if plain_positions else {"position_ids": (attn.cumsum(1) - 1).clamp(min=0) + position_offset}
        logits = model(input_ids=full, attention_mask=None if no_mask else attn, **kw).logits.float()  # (n, P+T, V)
        p, t = p_ids.shape[1], ids.shape[1]
        at = logits[:, p:p + t] if unshifted else logits[:, p - 1:p + t - 1]             # (n, T, V)
        temps = torch.ones(ids.shape[0]) if temperature_one else r.temperatures[rows].float() \
            if temperature is None else torch.full((ids.shape[0],), float(temperature))
        tempered = at / temps[:, None, None]                                              # (n, T, V)
        if warp is not None:                  # the sampler's top-k / top-p, as the decoding loop applies them
            from rookworld_debug.grpo.phases.decoding import _warp
            n_, t_, v_ = tempered.shape
            k, p_ = (None if w is None else w[rows].repeat_interleave(t_) for w in warp)
            tempered = _warp(tempered.reshape(n_ * t_, v_), k, p_).reshape(n_, t_, v_)
        if pad_logits:
            tempered = torch.cat([tempered, tempered.new_zeros(*tempered.shape[:-1], pad_logits)], -1)
        lp = tempered.log_softmax(-1)
        lp = lp.max(-1).values if top_token else lp.gather(-1, ids[..., None]).squeeze(-1)
        out.append(lp * mask)
    return torch.cat(out)


# the multiples a vocabulary is padded to (Megatron-style trainers pad GPT-2's 50,257 rows to 50,304 = 787 × 64)
VOCAB_MULTIPLES = (8, 64, 128)


def recompute_logps(model, r) -> torch.Tensor:
    """(N, T) the trusted teacher-forced log-probs (tempered, fp32 log-softmax), 0 where masked."""
    logps, _ = per_token_logps_and_entropy(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                           r.temperatures)
    return logps


def scoring_checks(trace, policy, reference, dtype: str, *, have: set, ref_is_policy: bool,
                   policy_moved: bool = False, sampler=None, cache: Optional[dict] = None,
                   eos: Optional[int] = None, tokenizer=None) -> list[PhaseCheck]:
    """Each recorded log-prob tensor against the recompute from the weights that made it (the policy's from the
    weights before the update; π_old's and the sampler's from the weights that sampled: `sampler`, or the weights
    before on a rollout's first pass); mistakes that reproduce it name the cause."""
    r = trace.rollout
    mask = r.completion_mask
    # a logit's rounding error ε becomes ε / T in a log-prob of the tempered distribution: below T = 1 it grows
    tol = tol_for(LOGP_TOL, dtype) / min(1.0, max(float(r.temperatures.min()), 1e-2)) if r.temperatures.numel() else \
        tol_for(LOGP_TOL, dtype)
    iteration = int(getattr(trace.recorded, "iteration", 0) or 0)
    logps = _LogpCache(r, cache)
    ours = logps(policy)                                                                  # (N, T)
    sampled_by = sampler if sampler is not None else policy if iteration == 0 else None
    models = {"the weights before the update": policy, "the weights that sampled the rollout": sampler,
              "the reference's weights": reference}
    out = [] if sampler is None else [_sampler_identity(policy, sampler, iteration)]
    named = [("policy", "per_token_logps (N, T): the loss forward's log-probs", r.per_token_logps, policy),
             ("old", "old_per_token_logps (N, T): π_old (the weights that sampled the rollout)",
              getattr(trace.recorded, "old_per_token_logps", None), sampled_by),
             ("sampler", "sampling_per_token_logps (N, T): the sampler's log-probs", r.sampling_per_token_logps,
              sampled_by)]
    for key, q, rec, model in named:
        if rec is None or (key == "policy" and "policy" not in have) or not bool(torch.isfinite(rec[mask.bool()]).all()):
            continue
        if model is None:
            out.append(skipped("scoring", q, f"this is pass {iteration} of num_iterations over the rollout: the "
                                             "weights that sampled it were not recorded (StepRecorder.sampler)"))
            continue
        dt = (getattr(trace.recorded, "sampler_dtype", "") or dtype) if key == "sampler" else dtype
        variants = {**_scoring_variants(trace, model), **(_sampler_variants(model, r) if key == "sampler" else {})}
        c = compare("scoring", q, rec, logps(model), tol_for(SAMPLER_TOL, dt) if key == "sampler" else tol,
                    mask=mask * step_rows(trace)[:, None] if key == "policy" else mask, unit="token",
                    variants=variants,                                   # of the weights it is held to
                    mean_tol=tol_for(MEAN_TOL, dt), fit=_scoring_fits(model, r),
                    rel=0.0 if key == "sampler" else tol_for(LOGP_REL, dt))
        if c.status == DISAGREE and not c.cause:
            c = _other_weights(c, rec, mask, model, models, logps, tol)
        if key == "sampler":          # the recorded prompt ids a cut of the text the sampler saw: no forward
            c = prompt_text_cut(c, trace, tokenizer, logps(model))
        if c.status == DISAGREE and not c.cause:      # a forward that saw its prompts cut
            c = prompt_cut(c, rec, logps(model), mask, lambda k: _variant_logps(model, r, keep_last=k), r.prompt_mask)
        if key == "sampler" and c.status == DISAGREE and not c.cause:     # the ids it drew, rewritten after
            c = rewritten_ids(c, rec, logps(model), mask, lambda: _variant_logps_raw(model, r), r, c.tolerance,
                              eos)
        if key == "policy" and (trace.recorded is not None or trace.capture is not None):   # another's code:
            c = logsoftmax_path(c, rec, mask * step_rows(trace)[:, None], model, r, dtype)  # which path made it
        c = _dropout(c, trace) if key == "policy" else c
        out.append(dropout_noise(c, rec, logps(model), model, r, mask))
    ref = _reference_check(trace, reference, ours, tol, ref_is_policy, policy_moved, logps, sampler)
    if reference is not None and r.ref_per_token_logps is not None:
        ref = dropout_noise(ref, r.ref_per_token_logps, logps(reference), reference, r, mask)
    return out + [ref] + _sampled_tokens(trace, sampled_by, eos, cache)


def _sampled_tokens(trace, model, eos: Optional[int] = None, cache: Optional[dict] = None) -> list[PhaseCheck]:
    """The tokens the sampler chose against the distribution the loop declares (sampled_tokens.py), where the
    weights that sampled are known: a TRL step that reads a slice of an older generation batch is left out."""
    from .sampled_tokens import sampled_tokens_check
    from .weights import sampling_positions
    cap = trace.capture
    if model is None or (cap is not None and int(getattr(cap, "steps_per_generation", 0) or 1) > 1):
        return []
    # the sampler's positions: a TRL capture's scoring forward counts the left padding, its generate() did not
    hidden = (cache or {}).get(_hidden_key(model, trace.rollout)) if cap is None else None
    with sampling_positions(model):
        c = sampled_tokens_check(model, trace.rollout, declared_filter=_sampler_warpers(trace) is not None, eos=eos,
                                 hidden=hidden)
    return [c] if c is not None else []


def step_rows(trace) -> torch.Tensor:
    """(N,) 1 on the rows this optimizer step trained. A TRL step that reads a slice of its generation batch
    (steps_per_generation > gradient_accumulation_steps) trains only its micro-batches' rows; the capture shows
    the others at their generation-time log-probs, which the weights before this update did not compute."""
    n = trace.rollout.completion_ids.shape[0]
    rows = getattr(trace.capture, "micro_batch_rows", None) if trace.capture is not None else None
    if not rows:
        return torch.ones(n, dtype=trace.rollout.completion_mask.dtype)
    out = torch.zeros(n, dtype=trace.rollout.completion_mask.dtype)
    for mb in rows:
        out[list(mb)] = 1
    return out


def _scoring_fits(model, r):
    """The generic fits, then a temperature fitted to the recorded log-probs (a sampler or a scoring forward that
    divides by another temperature than the declared one)."""
    generic = value_fits(r.num_generations)

    def fit(rec, ref, mask, tol):
        return generic(rec, ref, mask, tol) or _temperature_fit(model, r, rec, mask, tol)
    return fit


@torch.no_grad()
def _temperature_fit(model, r, rec, mask, tol):
    """The temperature T' whose log-probs reproduce `rec`: a golden-section search of log T' on up to 256 masked
    tokens (the logits computed once), then checked on every token."""
    from .fits import Fit
    m = mask.bool()
    if not bool(m.any()):
        return None
    ones = _variant_logps_raw(model, r)                                                   # (N, T, V) logits
    idx = torch.nonzero(m)[:256]
    z = ones[idx[:, 0], idx[:, 1]]                                                        # (k, V)
    tok = r.completion_ids[idx[:, 0], idx[:, 1]]
    target = rec[idx[:, 0], idx[:, 1]].float()

    def err(log_t):
        return float(((z / math.exp(log_t)).log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1) - target).abs().mean())
    from .update import golden_min
    t_fit = math.exp(golden_min(err, math.log(0.05), math.log(20.0), steps=48))
    declared = float(r.temperatures[0])
    if abs(t_fit - declared) < 1e-3 * declared:
        return None
    values = _variant_logps(model, r, temperature=t_fit).double()
    resid = float((rec - values).abs().nan_to_num(nan=math.inf).masked_fill(~m, 0.0).max())
    if resid > tol:
        return None
    return Fit("temperature", {"temperature": t_fit, "declared": declared}, resid,
               f"the recorded log-probs are those of temperature {t_fit:.4g}, not the declared {declared:g}"
               + (f" (= {declared:g}²: divided by the temperature twice)" if abs(t_fit - declared ** 2) < 1e-3 else
                  " (1: not divided by the temperature)" if abs(t_fit - 1) < 1e-3 else ""))


@_memoised
@torch.no_grad()
def _variant_logps_raw(model, r) -> torch.Tensor:
    """(N, T, V) the fp32 logits that score each completion token (position ids from the attention mask)."""
    from .sampled_tokens import completion_logits
    return torch.cat([completion_logits(model, r, slice(s, s + ROWS_PER_FORWARD)).float()
                      for s in range(0, r.completion_ids.shape[0], ROWS_PER_FORWARD)])


def policy_logps(trace, policy, cache: Optional[dict] = None) -> torch.Tensor:
    """(N, T) the trusted log-probs of `policy` over the trace's rollout (computed once per cache)."""
    return _LogpCache(trace.rollout, cache)(policy)


class _LogpCache:
    """The trusted log-probs of the rollout under each model, computed once per model."""
    def __init__(self, rollout, cache: Optional[dict] = None):
        self.rollout, self.done = rollout, {} if cache is None else cache

    def __call__(self, model) -> torch.Tensor:
        key = _logps_key(model, self.rollout)
        if key not in self.done:
            self.done[key] = recompute_logps(model, self.rollout)
        return self.done[key]


def _logps_key(model, rollout) -> tuple:
    return "logps", id(model), id(rollout)


def remember_logps(cache: dict, model, rollout, logps: torch.Tensor, hidden: Optional[torch.Tensor] = None) -> None:
    """`logps` (N, T), the recompute's values from another forward of the same model and rows (the gradient's), and
    `hidden` (N, T, d), that forward's LM-head inputs (the sampled tokens' statistics apply the head to them)."""
    cache.setdefault(_logps_key(model, rollout), logps)
    if hidden is not None:
        cache.setdefault(_hidden_key(model, rollout), hidden)


def _hidden_key(model, rollout) -> tuple:
    return "head inputs", id(model), id(rollout)


def _scoring_variants(trace, policy) -> dict:
    """The forward's mistakes (`forward_variants`, rows packed across), then the sampler's: a top-k / top-p
    distribution recorded."""
    r, variants = trace.rollout, forward_variants(trace, policy)
    variants.update(_packed_variants(trace, policy))
    warp = _sampler_warpers(trace)
    if warp is not None:        # TRL's convention (and this package's) is the tempered distribution BEFORE top-k/p
        variants["sampler_logps_after_warping"] = (
            lambda: _variant_logps(policy, r, warp=warp), "the sampler recorded log-probs of the top-k / top-p "
            "renormalised distribution, not of the tempered policy: a ratio against them is biased")
    else:                       # a filter the declaration does not have: its k fitted from the recorded values
        k = {}

        def top_k_logps():
            k["k"] = _fitted_top_k(policy, r)
            n = r.completion_ids.shape[0]
            return None if k["k"] is None else _variant_logps(policy, r, warp=(torch.full((n,), k["k"]), None))
        variants["sampler_logps_after_warping/fitted"] = (
            top_k_logps, lambda: f"the sampler's log-probs are those of the tempered distribution renormalised over "
            f"its top k = {k['k']} tokens (k fitted from the recorded values), a filter the declaration does not "
            "have (top_k=0): the rollout came from another distribution than the declared one, and a ratio against "
            "it is biased")
    return variants


def _sampler_variants(model, r) -> dict:
    """How an engine's log-probs are misread: each position's first-listed (most likely) token's log-prob."""
    return {"sampler_logps_other_token": (
        lambda: _variant_logps(model, r, top_token=True),
        "the recorded log-prob at each position is the distribution's most likely token's, not the sampled token's "
        "(an engine's per-position logprob list read by its first entry): right only where the sampled token was "
        "the top one, so every ratio against it is wrong where sampling chose another")}


def _bos_id(model) -> Optional[int]:
    """The model's BOS token id from the config it was built from (GPT-2's is its <|endoftext|>), or None."""
    config = getattr(model, "source", None) or {}
    bos = config.get("bos_token_id") if isinstance(config, dict) else None
    if bos is None:
        bos = getattr(getattr(model, "config", None), "bos_token_id", None)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return int(bos) if isinstance(bos, int) and 0 <= bos < vocab else None


def forward_variants(trace, model) -> dict:
    """What a teacher-forced forward of `model` gives under each common scoring mistake, each computed when tried."""
    r = trace.rollout
    variants = {
        "temperature_not_applied": (lambda: _variant_logps(model, r, temperature_one=True),
                                    "the log-probs are of the raw logits: the sampling temperature was not applied"),
        "temperature_after_log_softmax": (lambda: _variant_logps(model, r, temperature_one=True)
                                          / r.temperatures.float().clamp(min=1e-6)[:, None],
                                          "the temperature divides the log-probs, not the logits: log_softmax(z) / T "
                                          "is not a distribution's log-probs (log_softmax(z / T) is)"),
        "position_ids_left_pad": (lambda: _variant_logps(model, r, plain_positions=True),
                                  "the forward counted the left padding in the position ids (no position_ids from "
                                  "the attention mask): every left-padded row is scored at shifted positions"),
        "logits_not_shifted": (lambda: _variant_logps(model, r, unshifted=True),
                               "position t's logits scored token t (no shift by one): the log-probs are of the "
                               "next token"),
        "position_ids_offset": (lambda: _variant_logps(model, r, position_offset=1),
                                "the position ids count from 1, not 0 (cumsum(attention_mask) without the − 1): "
                                "every token is scored one position later than it was sampled at"),
    }
    bos = _bos_id(model)
    if bos is not None:
        variants["prompt_tokens_differ"] = (
            lambda: _variant_logps(model, r, prefix=bos), f"the forward saw one more token, BOS (id {bos}), before "
            "every prompt: the prompt was tokenized again with the tokenizer's BOS, which the recorded prompt ids "
            "lack, so every log-prob is conditioned on another context")
    vocab = int(model.get_output_embeddings().weight.shape[0])
    for m in VOCAB_MULTIPLES:
        k = -vocab % m
        if k and f"logsoftmax_over_padded_vocab/{vocab + k}" not in variants:
            variants[f"logsoftmax_over_padded_vocab/{vocab + k}"] = (
                lambda k=k: _variant_logps(model, r, pad_logits=k),
                f"the log-softmax runs over {vocab + k} entries, the {vocab} tokens' logits and {k} more of logit 0: "
                f"the vocabulary padded to {vocab + k} rows (a multiple of {m}) without masking the padding, so "
                f"every log-prob is low by log(1 + {k} / Σ exp(z/T))")
    if bool((r.prompt_mask == 0).any()):     # only prompts of different lengths have a side to pad on
        variants["attention_mask_not_applied"] = (
            lambda: _variant_logps(model, r, no_mask=True), "the forward was given no attention mask: each row "
            "attends to its prompt's pads, so every left-padded row is scored on other inputs than it sampled from")
        variants["attention_mask_not_applied/positions"] = (
            lambda: _variant_logps(model, r, no_mask=True, plain_positions=True), "the forward was given neither "
            "an attention mask nor position ids: each row attends to its prompt's pads and counts them as positions")
        variants["scoring_padding_side"] = (
            lambda: _variant_logps(model, r, other_side=True), "the prompts were padded on the other side than at "
            "sampling: each shorter prompt's completion follows its pads, so its first completion token is "
            "predicted from a pad position")
    return variants


# tokens one packed forward may hold (its attention is quadratic in them); position ids restart at each row, so a
# pack may be longer than the model's context
MAX_PACK = 4096


def _packed_variants(trace, model) -> dict:
    """The rows packed into one sequence per micro-batch, or per batch, under a plain causal mask (packed_rows.py)."""
    from .loss_phase import micro_batches
    from .packed_rows import packed_logps
    r, out = trace.rollout, {}
    if trace.capture is not None:    # TRL's scoring forward counts positions across the padding: no packed path
        return out
    layouts = {"each micro-batch": [list(map(int, rows)) for rows in micro_batches(trace)],
               "the whole batch": [list(range(r.completion_ids.shape[0]))]}
    rows_len = (r.prompt_mask.sum(1) + r.completion_mask.sum(1)).tolist()                  # (N,) real tokens
    for name, packs in layouts.items():
        if f"packed_sequences_cross_attend/{len(packs)}" in out or all(len(p) < 2 for p in packs) \
                or max(sum(rows_len[i] for i in p) for p in packs) > MAX_PACK:
            continue
        out[f"packed_sequences_cross_attend/{len(packs)}"] = (
            lambda packs=packs: packed_logps(model, r, packs),
            f"the forward packed {name}'s rows into one sequence (padding removed, position ids restarting at each "
            "row) under a plain all-ones attention mask: each row attends to the rows packed before it, so every "
            "row but a pack's first is scored on other rows' tokens too. Pass the packed layout to the attention "
            "(a varlen or block-diagonal mask, or position ids with no attention mask where the model infers it)")
    return out


@_memoised
@torch.no_grad()
def _fitted_top_k(model, r) -> Optional[int]:
    """The k for which log-probs renormalised over the top k reproduce the recorded sampler's, token by token
    (its most common value over the tokens a filter changed), or None."""
    from .sampled_tokens import completion_logits
    ks = []
    for s in range(0, r.completion_ids.shape[0], ROWS_PER_FORWARD):
        rows = slice(s, s + ROWS_PER_FORWARD)
        ids, mask = r.completion_ids[rows], r.completion_mask[rows].bool()
        lp = (completion_logits(model, r, rows).float() / r.temperatures[rows].float()[:, None, None]).log_softmax(-1)
        mass = lp.sort(-1, descending=True).values.logcumsumexp(-1)                      # (n, T, V) log Σ top-k
        gap = lp.gather(-1, ids[..., None]).squeeze(-1) - r.sampling_per_token_logps[rows].float()   # (n, T) ≤ 0
        changed = mask & (gap < -1e-3)
        k = (mass - gap[..., None]).abs().argmin(-1) + 1                                  # (n, T)
        ks.append(k[changed])
    ks = torch.cat(ks)
    return int(ks.mode().values) if ks.numel() else None


def _other_weights(check: PhaseCheck, rec, mask, expected, models: dict, logps, tol: float) -> PhaseCheck:
    """A fit over the recorded weights: the disagreeing log-probs are those of another recorded set of weights
    (π_old recomputed from the current weights on a later pass, a sampler's values from the reference, …)."""
    from dataclasses import replace
    for name, model in models.items():
        if model is None or model is expected:
            continue
        if _max_diff(rec, logps(model), mask) <= tol:
            return replace(check, cause="logps_from_other_weights",
                           explanation=f"the recorded values are the log-probs of {name}, not of the weights that "
                                       "should have made them")
    return check


@torch.no_grad()
def _sampler_identity(policy, sampler, iteration: int) -> PhaseCheck:
    """On a rollout's first pass the weights that sampled are the weights before the update; on a later pass they
    are the weights of an earlier one (they differ)."""
    names = [n for n, _ in policy.named_parameters()]
    before = dict(policy.named_parameters())
    samp = dict(sampler.named_parameters())
    num = sum(float((samp[n].double() - before[n].double()).pow(2).sum()) for n in names if n in samp)
    den = sum(float(before[n].double().pow(2).sum()) for n in names)
    rel = math.sqrt(num / den) if den > 0 else math.inf
    q = "the weights that sampled the rollout: the policy's at the rollout's first pass"
    if iteration > 0 or rel == 0.0:
        return PhaseCheck("generation", q, AGREE, rel, 0.0, measure="‖θ_sampler − θ_before‖ / ‖θ_before‖")
    return PhaseCheck("generation", q, DISAGREE, rel, 0.0, "every weight", f"‖Δθ‖/‖θ‖ = {rel:.3g}",
                      "θ_sampler = θ_before", "sampler_weights_stale",
                      "the rollout was sampled by weights that are not the policy's at this step (its first pass): "
                      "a separate sampler copy not synced since an earlier update samples from an older policy",
                      measure="‖θ_sampler − θ_before‖ / ‖θ_before‖")


def trace_dtype(trace) -> str:
    return getattr(trace.recorded, "dtype", None) or str(trace.config.dtype)


def _sampler_warpers(trace):
    """(top_k (N,), top_p (N,)) the sampler declared, each None when no row uses it; None when neither is on."""
    from rookworld_debug.grpo.phases.decoding import active_warpers
    settings = [trace.config.sampling_for(t) for t in trace.rollout.tasks]
    k = torch.tensor([int(s[2] or 0) for s in settings])
    p = torch.tensor([float(s[1] if s[1] is not None else 1.0) for s in settings])
    k, p = active_warpers(k, p, "cpu")
    return None if k is None and p is None else (k, p)


def _dropout(check: PhaseCheck, trace) -> PhaseCheck:
    from dataclasses import replace
    rec = trace.recorded
    if check.status == DISAGREE and not check.cause and rec is not None and rec.policy_training_mode:
        return replace(check, cause="dropout_active", explanation="the loss forward ran in training mode: dropout "
                       "made its log-probs random, so they are not the policy's")
    return check


def _reference_check(trace, reference, policy_logps, tol: float, ref_is_policy: bool,
                     policy_moved: bool = False, logps=None, sampler=None) -> PhaseCheck:
    r = trace.rollout
    q = "ref_per_token_logps (N, T): the reference's log-probs"
    if r.ref_per_token_logps is None:
        return skipped("scoring", q, "no reference log-probs were recorded (β = 0 or the loop has no reference)")
    if reference is None:
        return skipped("scoring", q, "the reference's weights were not recorded")
    step = getattr(trace.recorded, "step", None)
    if ref_is_policy and policy_moved and step is not None and step > 1:
        return PhaseCheck("scoring", "the reference's weights: frozen at the policy's start", DISAGREE, 0.0, 0.0,
                          f"every weight (step {step})", "θ_ref = θ_policy", f"θ_ref = the start weights (policy "
                          f"moved by {step - 1} update(s))", "reference_tracks_policy",
                          f"at step {step} the reference's weights are the policy's own, although the optimizer's "
                          "moments show earlier updates: a frozen reference keeps the start weights, so the KL term is "
                          "0 and holds nothing back (TRL's sync_ref_model copies them on purpose, at its sync steps "
                          "only)", measure="max |θ_ref − θ_policy|")
    ours = logps(reference) if logps is not None else recompute_logps(reference, r)
    variants = {} if ref_is_policy else {
        "reference_tracks_policy": (policy_logps, "the 'reference' log-probs are the policy's own: the KL term is "
                                                  "0 and holds nothing back")}
    variants.update({k: (f, "in the reference's forward: " + s_)
                     for k, (f, s_) in forward_variants(trace, reference).items()})
    if sampler is not None and logps is not None and not ref_is_policy:     # the policy as it sampled
        variants["reference_tracks_policy/sampler"] = (
            lambda: logps(sampler), "the 'reference' log-probs are the policy's own, as it sampled the rollout: the "
                                    "KL term measures the policy against itself and holds nothing back")
    return compare("scoring", q, r.ref_per_token_logps, ours, tol, mask=r.completion_mask, unit="token",
                   variants=variants, mean_tol=tol_for(MEAN_TOL, trace_dtype(trace)), fit=_scoring_fits(reference, r),
                   rel=tol_for(LOGP_REL, trace_dtype(trace)))
