"""Our KV-cached decoding loop (sampling and greedy): what `generate()` does for us, minus its overhead.

Shape legend: B prompts, G copies per prompt, N = B·G rows (a prompt's copies consecutive, TRL's order),
n ≤ N rows still decoding, P prompt tokens (left-padded), L ≤ max_new_tokens decoded steps, V vocabulary,
C = P + max_new_tokens cache capacity.

Why our own loop (docs/PERFORMANCE.md § Sampling):
- the prompt forward runs on the B distinct prompts and the KV cache is expanded to N rows after it
  (`generate` runs it on all N copies);
- the cache is preallocated once (`kv_layers.PreallocLayer`) and written in place: `DynamicCache` concatenates
  the whole cache on every step (`aten::cat`, 12 % of the profiled step);
- rows that emitted EOS are dropped from the batch, so later steps forward only live rows;
- temperature, top-k and top-p are per-row tensors, so a mixed P:/A: batch decodes in ONE loop;
- the attention mask of a decode step is built directly as (n, 1, 1, P+t) booleans.

Same tokens as `generate` for the same seed, by construction: `torch.multinomial(probs, 1)` IS
`argmax(probs / q)` with q ~ Exp(1) of shape (rows, V) drawn from the generator (torch's own fast path),
so we draw q for ALL N rows at every step — exactly the draws `generate` makes for its N-row batch — and
use the live rows' part. Temperature/top-k/top-p follow `TemperatureLogitsWarper`, `TopKLogitsWarper`
and `TopPLogitsWarper` op for op. (Floats can differ in the last bit because the batch composition
differs; a sampled token flips only on an exact near-tie.) Mixed-setting batches used one `generate`
call per setting before; they now share one stream, so their tokens differ from the old per-call ones.

The sampling-time log-prob of each sampled token is TRL's tempered `gathered logit − logsumexp` of the
raw fp32 logits / T over the full vocabulary (top-p/top-k not renormalised) — the same formula as the
teacher-forced recompute (`generation._token_stats`), so the recompute check compares like with like.

No host sync per step on CUDA: EOS bookkeeping stays on device and the loop looks at it (stop, drop
finished rows, NaN check) every `sync_every` steps (1 on CPU, where a "sync" is free).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, replace

import torch

from rookworld_debug.errors import NumericalError
from rookworld_debug.models.precision import autocast_for


@functools.lru_cache(maxsize=None)
def _cache_kw_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_kw(module) -> str:
    """The KV-cache keyword of ``module.forward``: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name still works but warns into every report)."""
    return _cache_kw_of(type(module))

COMPACT_FRACTION = 0.25  # drop finished rows once they are ≥ this share of the batch (a cache copy each time)


@dataclass(frozen=True)
class SamplingParams:
    """How `decode` samples its N main rows (without it they decode greedily: argmax of the raw logits)."""
    temperatures: torch.Tensor                   # (N,) > 0
    top_k: torch.Tensor | None = None            # (N,) 0 = off
    top_p: torch.Tensor | None = None            # (N,) 1.0 = off
    generator: torch.Generator | None = None     # the random stream (the caller's RNG is untouched)
    stats_k: int | None = None                   # also record each step's entropy and its stats_k likeliest tokens
    noise: tuple | None = None                   # (index (N,), rows): rows `index` of a `rows`-row batch, same draws
    # rookworld-rlvr's generate, as faults to reproduce (sampled rows only; greedy rows decode correctly)
    mini_positions: bool = False                 # KV-cached steps at position P + step for every row
    continue_after_eos: bool = False             # rows go on after EOS; stop when all emit EOS at one step

    def on(self, device) -> "SamplingParams":
        """The tensors on `device`, unused warpers dropped (`active_warpers`)."""
        top_k, top_p = active_warpers(self.top_k, self.top_p, device)
        noise = None if self.noise is None else (self.noise[0].to(device), int(self.noise[1]))
        return replace(self, temperatures=self.temperatures.to(device=device, dtype=torch.float32), top_k=top_k,
                       top_p=top_p, noise=noise)


@dataclass(frozen=True)
class GreedyRows:
    """E more rows `decode` decodes greedily IN THE SAME LOOP as its main rows (they draw no random numbers, so
    the main rows' tokens are as without them); returned as `Decoded.greedy_tokens`."""
    prompt_ids: torch.Tensor                     # (E, P') left-padded
    prompt_mask: torch.Tensor                    # (E, P')
    max_new_tokens: int | None = None            # None: the main rows' max_new_tokens


@dataclass(frozen=True)
class Decoded:
    tokens: torch.Tensor        # (N, L) decoded ids, pad after each row's first EOS
    logps: torch.Tensor | None  # (N, L) sampling-time tempered log-prob of each token (None when greedy)
    entropy: torch.Tensor | None     # (N, L) entropy of the tempered distribution (None unless stats_k)
    topk_ids: torch.Tensor | None    # (N, L, K) its K most likely tokens (None unless stats_k)
    topk_logps: torch.Tensor | None  # (N, L, K) their tempered log-probs
    steps: int                  # L: decode steps run (the longest row; ≤ max_new_tokens)
    forwards: int               # model forwards (1 prompt forward + decode steps)
    row_steps: int              # Σ over decode forwards of the rows forwarded (N·(L−1) without row dropping)
    greedy_tokens: torch.Tensor | None = None   # (E, L') the extra greedy rows' ids (None without extras)
    loop: str = "dynamic"       # which loop ran: "dynamic" | "static" | "static+graph" (decoding_static)
    note: str = ""              # why a CUDA graph was not used when one was asked for


# ------------------------------------------------------------------------------------------ cache
def _new_cache(model, capacity: int):
    from transformers.cache_utils import Cache
    from .kv_layers import PreallocLayer          # transformers' cache classes, imported when a loop decodes
    return Cache(layers=[PreallocLayer(capacity) for _ in range(model.config.num_hidden_layers)])


# ------------------------------------------------------------------------------------------ warpers
def _warp(scores: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Per-row TopK then TopP (transformers' order and ops) on tempered scores (n, V); 0 / 1.0 = off.
    `top_k`/`top_p` None: no row uses it (skips the sort)."""
    if top_k is not None:
        k = top_k.clamp(min=1, max=scores.shape[-1])                                   # (n,)
        kth = scores.sort(-1, descending=True).values.gather(-1, (k - 1)[:, None])     # (n, 1)
        remove = (scores < kth) & (top_k > 0)[:, None]                                 # (n, V)
        scores = scores.masked_fill(remove, float("-inf"))
    if top_p is not None:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)               # (n, V)
        cum = sorted_logits.softmax(-1).cumsum(-1)                                      # (n, V)
        drop = (cum <= (1 - top_p)[:, None]) & (top_p < 1.0)[:, None]                  # (n, V)
        drop[..., -1:] = False                                                          # min_tokens_to_keep = 1
        scores = scores.masked_fill(drop.scatter(1, sorted_idx, drop), float("-inf"))
    return scores


def active_warpers(top_k: torch.Tensor | None, top_p: torch.Tensor | None, device):
    """Per-row top-k (n,) / top-p (n,) on `device`, each None when no row uses it (0 / 1.0 = off): `_warp` then
    skips that warper's sort, and a replay of the loop must skip it too."""
    top_k = top_k.to(device) if top_k is not None and bool((top_k > 0).any()) else None
    top_p = top_p.to(device=device, dtype=torch.float32) if top_p is not None and bool((top_p < 1.0).any()) else None
    return top_k, top_p


def _decode_mask(prompt_mask: torch.Tensor, attn_impl: str, dtype: torch.dtype, new_tokens: int) -> torch.Tensor:
    """(n, P) prompt mask → (n, 1, 1, C = P + new_tokens) key mask of every decode step (sliced to P+t): prompt
    pads off, every decoded position on. Booleans for sdpa/flex; additive floats for eager attention."""
    n, p = prompt_mask.shape
    keys = torch.ones((n, 1, 1, p + new_tokens), dtype=torch.bool, device=prompt_mask.device)
    keys[:, 0, 0, :p] = prompt_mask.bool()
    return keys if attn_impl != "eager" else (~keys).to(dtype) * torch.finfo(dtype).min


# ------------------------------------------------------------------------------------------ loop
def _left_cat(ids: torch.Tensor, mask: torch.Tensor, ids2: torch.Tensor, mask2: torch.Tensor, pad_id: int):
    """Stack two left-padded prompt batches (B, P) and (E, P') → (B+E, max(P, P')), left-padded."""
    width = max(ids.shape[1], ids2.shape[1])

    def pad(x, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)
    return torch.cat([pad(ids, pad_id), pad(ids2, pad_id)]), torch.cat([pad(mask, 0), pad(mask2, 0)])


@dataclass
class _SampleRecord:
    """What the loop records of the sampled rows: each token's tempered log-prob, and (stats) the entropy and
    top-k of its distribution. Rows are the N main rows, columns the decode steps."""
    logps: torch.Tensor                  # (N, T)
    entropy: torch.Tensor | None         # (N, T)
    topk_ids: torch.Tensor | None        # (N, T, K)
    topk_logps: torch.Tensor | None      # (N, T, K)

    @staticmethod
    def empty(n: int, t: int, k: int | None, device) -> "_SampleRecord":
        stats = k is not None
        return _SampleRecord(
            logps=torch.zeros((n, t), device=device), entropy=torch.zeros((n, t), device=device) if stats else None,
            topk_ids=torch.zeros((n, t, k), dtype=torch.long, device=device) if stats else None,
            topk_logps=torch.zeros((n, t, k), device=device) if stats else None)


def _sample_step(logits, tok, live, done, step: int, n_main: int, sp: SamplingParams,
                 rec: _SampleRecord) -> torch.Tensor:
    """Sample the live main rows' tokens into `tok` (in place; greedy rows keep their argmax) and record them.
    Draws q for ALL N main rows (the stream `generate` draws) — or, with `noise` = (index (n_main,), rows), for
    all `rows` of the batch these rows were taken from, each main row reading its own row of that block.
    Returns whether any logit row was non-finite."""
    temps, top_k, top_p, generator, stats_k, noise = sp.temperatures, sp.top_k, sp.top_p, sp.generator, \
        sp.stats_k, sp.noise
    si = (live < n_main).nonzero().squeeze(1)                                           # batch rows sampled
    ls = live[si]                                                                       # (s,) their rows
    tempered = logits[si] / temps[ls, None]                                             # (s, V)
    lse = torch.logsumexp(tempered, -1)                                                 # (s,)
    probs = _warp(tempered, None if top_k is None else top_k[ls],
                  None if top_p is None else top_p[ls]).softmax(-1)                     # (s, V)
    q = torch.empty((n_main if noise is None else noise[1], logits.shape[-1]),
                    device=logits.device).exponential_(generator=generator)             # (N, V)
    tok_s = (probs / q[ls if noise is None else noise[0][ls]]).argmax(-1)               # (s,) = multinomial
    tok[si] = tok_s
    rec.logps[ls, step] = (tempered.gather(-1, tok_s[:, None]).squeeze(1) - lse).masked_fill(done[si], 0.0)
    if rec.entropy is not None:
        logp_all = tempered - lse[:, None]                                              # (s, V)
        rec.entropy[ls, step] = -(logp_all.exp() * logp_all).sum(-1)
        if stats_k:
            top_v, top_i = logp_all.topk(stats_k, dim=-1)                               # (s, K) each
            rec.topk_logps[ls, step], rec.topk_ids[ls, step] = top_v, top_i
    return ~torch.isfinite(lse).all()


def _prompt_forward(model, ids, pmask, row_src, capacity: int, amp):
    """One forward over the distinct prompts; its KV cache and last logits indexed out to every row."""
    cache, ckw = _new_cache(model, capacity), cache_kw(model)
    pos0 = pmask.long().cumsum(-1) - 1                                                  # (B+E, P)
    with amp:
        out = model(input_ids=ids, attention_mask=pmask, position_ids=pos0.masked_fill(pmask == 0, 0),
                    **{ckw: cache}, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float()[row_src]                                         # (N+E, V)
    del out
    cache.batch_select_indices(row_src)                                                 # groups expanded here
    return cache, ckw, logits


def _rows(prompt_ids, prompt_mask, expand: int, max_new_tokens: int, pad_id: int, device,
          greedy: GreedyRows | None):
    """The loop's prompts (B+E, P) on `device` (columns that pad every row dropped), the prompt of each of the
    N+E rows (the B prompts' `expand` copies, then the E greedy prompts), and each row's max new tokens."""
    ids, pmask, e = prompt_ids, prompt_mask, 0 if greedy is None else greedy.prompt_ids.shape[0]
    if e:
        ids, pmask = _left_cat(ids, pmask, greedy.prompt_ids, greedy.prompt_mask, pad_id)
    keep = pmask.any(0)
    ids, pmask = ids[:, keep].to(device), pmask[:, keep].to(device)                    # (B+E, P)
    b = prompt_ids.shape[0]
    row_src = torch.cat([torch.arange(b, device=device).repeat_interleave(expand),
                         torch.arange(b, b + e, device=device)])                       # (N+E,)
    limit = torch.full((row_src.numel(),), max_new_tokens, device=device)               # (N+E,)
    limit[b * expand:] = (greedy.max_new_tokens if e else None) or max_new_tokens
    return ids, pmask, row_src, limit


def _compact(cache, done, live, tok, key_mask):
    """Drop the finished rows from the batch and its KV cache (a copy of the filled cache each time)."""
    alive = (~done).nonzero().squeeze(1)                                                # (n',)
    cache.batch_select_indices(alive)
    return live[alive], tok[alive], done[alive], key_mask[alive]


@torch.no_grad()
def decode(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, expand: int, max_new_tokens: int,
           eos_id: int, pad_id: int, sampling: SamplingParams | None = None, greedy: GreedyRows | None = None,
           sync_every: int | None = None) -> Decoded:
    """Decode `expand` continuations of each of the B left-padded prompts (B, P) → N = B·expand rows.

    `sampling` (SamplingParams): how the N rows sample; None → greedy (argmax, `generate(do_sample=False)`).
    Inputs on any device; outputs on the model's device. NumericalError if a sampling step's logits are NaN/inf.
    `greedy` (GreedyRows): E more rows decoded greedily in the same loop, returned as `greedy_tokens`.
    """
    device = next(model.parameters()).device
    e = 0 if greedy is None else greedy.prompt_ids.shape[0]
    ids, pmask, row_src, limit = _rows(prompt_ids, prompt_mask, expand, max_new_tokens, pad_id, device, greedy)
    p, n_main, n, length = ids.shape[1], prompt_ids.shape[0] * expand, row_src.numel(), int(limit.max())
    sp = None if sampling is None else sampling.on(device)
    sync_every = sync_every or (1 if device.type == "cpu" else 8)
    amp = autocast_for(model)                     # bf16 autocast on CUDA (fp32 weights), else a no-op
    cache, ckw, logits = _prompt_forward(model, ids, pmask, row_src, p + length, amp)  # logits (N+E, V)
    key_mask = _decode_mask(pmask[row_src], model.config._attn_implementation, model.dtype, length)  # (N+E,1,1,C)
    next_pos = pmask.long().sum(1)[row_src]                                             # (N+E,)
    if sp is not None and sp.mini_positions:
        next_pos[:n_main] = p
    tokens = torch.full((n, length), pad_id, dtype=torch.long, device=device)           # (N+E, L)
    rec = None if sp is None else _SampleRecord.empty(n_main, max_new_tokens, sp.stats_k, device)
    # each batch row's original row (n,), whether it finished (n,), whether a sampling step saw NaN/inf logits
    live, done = torch.arange(n, device=device), torch.zeros(n, dtype=torch.bool, device=device)
    bad = torch.zeros((), dtype=torch.bool, device=device)
    forwards, row_steps, steps, main_steps, main_open = 1, 0, 0, 0, True
    for step in range(length):
        # argmax only where some row decodes greedily; a sampling-only step fills every row in _sample_step
        sampling_now = sp is not None and main_open
        tok = logits.argmax(-1) if e or not sampling_now else logits.new_empty(live.numel(), dtype=torch.long)
        if sampling_now:
            bad |= _sample_step(logits, tok, live, done, step, n_main, sp, rec)
        tok = tok.masked_fill(done, pad_id)                                             # (n,)
        tokens[live, step] = tok
        steps = step + 1
        done = done | _ended(tok, live, n_main, eos_id, sp) | (limit[live] <= steps)    # EOS, or its own max
        if main_open:
            main_steps, main_open = steps, steps < max_new_tokens
        if steps == length or (steps % sync_every == 0 and (bool(bad) or bool(done.all()))):
            break
        if steps % sync_every == 0:
            main_open = main_open and not bool(done[live < n_main].all())                # as a loop of its own
            if (n_done := int(done.sum())) and n_done >= COMPACT_FRACTION * done.numel():  # drop finished rows
                live, tok, done, key_mask = _compact(cache, done, live, tok, key_mask)
        with amp:
            out = model(input_ids=tok[:, None], attention_mask=key_mask[:, :, :, :p + steps],
                        position_ids=(next_pos[live] + step)[:, None], **{ckw: cache}, use_cache=True)
        logits = out.logits[:, -1].float()                                              # (n, V)
        forwards, row_steps = forwards + 1, row_steps + live.numel()
    if bool(bad):
        raise NumericalError("cannot sample: the policy's next-token logits are NaN/inf (see the step-0 "
                             "invariants; check the weights and dtype)")
    cut = (lambda x: None if x is None else x[:, :main_steps])                         # noqa: E731
    return Decoded(tokens=tokens[:n_main, :main_steps], logps=cut(rec and rec.logps), entropy=cut(rec and rec.entropy),
                   topk_ids=cut(rec and rec.topk_ids), topk_logps=cut(rec and rec.topk_logps), steps=main_steps,
                   forwards=forwards, row_steps=row_steps, greedy_tokens=tokens[n_main:, :steps] if e else None)


def _ended(tok, live, n_main: int, eos_id: int, sp: SamplingParams | None) -> torch.Tensor:
    """(n,) rows that emitted EOS this step; the mini's `continue_after_eos`: its sampled rows only when every
    one of them emits EOS at once."""
    eos = tok == eos_id
    if sp is not None and sp.continue_after_eos:
        main = live < n_main
        eos = eos & (~main | bool(eos[main].all()))
    return eos