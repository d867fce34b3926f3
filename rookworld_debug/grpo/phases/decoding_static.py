"""A static-shape decode loop: every tensor keeps its shape from the first decode step to the last, so a GPU can
replay one captured step (a CUDA graph) instead of launching ~a hundred kernels from Python per token.

Shape legend: N main rows, E greedy rows, n = N + E, P prompt tokens, C = P + L cache capacity, V vocabulary.

What differs from `decoding.decode` (the dynamic loop), and why the tokens do not:
- the KV cache has a fixed capacity C and each step writes its column with `index_copy_` at a device index; the
  model attends over all C keys with the not-yet-written ones masked off (`_StaticLayer`), instead of a view that
  grows by one column per step;
- finished rows stay in the batch, masked (their token is the pad, their log-prob 0), instead of being dropped;
- sampling and EOS bookkeeping run on every row with masks, no `nonzero()` (a host sync) per step;
- the random draws are the dynamic loop's: q ~ Exp(1) of shape (N, V) per step from the same generator, each row
  reading its own row — so a row's token is the same function of the same logits and the same draw.
The prompt forward is the dynamic loop's (eager). On the CPU the static path runs eagerly and equals the dynamic
one token for token (tested); on CUDA `decode_static(..., graph=True)` captures one step as a CUDA graph and
replays it, falling back to the eager static step when capture fails (the reason is returned).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rookworld_debug.errors import NumericalError
from rookworld_debug.models.precision import autocast_for

from .decoding import Decoded, GreedyRows, SamplingParams, _decode_mask, _prompt_forward, _rows, _warp
from .kv_layers import DynamicLayer, kv_buffers


class _StaticLayer(DynamicLayer):
    """A (n, H, C, D) KV buffer written at `index` (a device tensor): the model always sees all C columns."""

    def __init__(self, capacity: int, index: torch.Tensor):
        super().__init__()
        self.capacity, self.index = capacity, index

    def lazy_initialization(self, key_states, value_states) -> None:
        # zeros: the model sees all C columns, the unwritten ones masked
        self.keys, self.values = kv_buffers(self, key_states, value_states, torch.Tensor.new_zeros)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        where = self.index + torch.arange(t, device=self.index.device)                     # (t,) columns
        self.keys.index_copy_(2, where, key_states)
        self.values.index_copy_(2, where, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.capacity

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0                       # every query sees all C columns; the mask hides the unwritten

    def load(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The prompt's cache (n, H, P, D) into the first P columns."""
        self.lazy_initialization(keys, values)
        self.keys[:, :, :keys.shape[2]] = keys
        self.values[:, :, :values.shape[2]] = values


def _static_cache(model, prompt_cache, capacity: int, index: torch.Tensor):
    from transformers.cache_utils import Cache
    layers = []
    for old in prompt_cache.layers:
        layer = _StaticLayer(capacity, index)
        layer.load(old.keys, old.values)
        layers.append(layer)
    return Cache(layers=layers)


@dataclass
class _State:
    """The loop's device tensors: written in place each step (a captured graph reads and writes these)."""
    tok: torch.Tensor          # (n,) this step's input token
    pos: torch.Tensor          # (n,) its position id
    index: torch.Tensor        # (1,) the cache column it is written to
    key_mask: torch.Tensor     # (n, 1, 1, C) keys visible to the step's query
    logits: torch.Tensor       # (n, V) the step's output


def _forward(model, ckw, cache, s: _State, amp) -> None:
    with amp:
        out = model(input_ids=s.tok[:, None], attention_mask=s.key_mask, position_ids=s.pos[:, None],
                    **{ckw: cache}, use_cache=True)
    s.logits.copy_(out.logits[:, -1].float())


def _choose(logits, done, step: int, n_main: int, sp: SamplingParams | None, rec: dict) -> tuple:
    """(the n rows' tokens, any non-finite sampled logits): greedy argmax for every row, the N main rows sampled
    with the dynamic loop's draws; masked rows included (their token is replaced by the pad afterwards)."""
    tok = logits.argmax(-1)                                                                # (n,)
    if sp is None:
        return tok, torch.zeros((), dtype=torch.bool, device=logits.device)
    tempered = logits[:n_main] / sp.temperatures[:, None]                                  # (N, V)
    lse = torch.logsumexp(tempered, -1)                                                    # (N,)
    probs = _warp(tempered, sp.top_k, sp.top_p).softmax(-1)                                # (N, V)
    q = torch.empty((n_main if sp.noise is None else sp.noise[1], logits.shape[-1]),
                    device=logits.device).exponential_(generator=sp.generator)           # (N, V)
    tok_main = (probs / (q if sp.noise is None else q[sp.noise[0]])).argmax(-1)           # (N,)
    tok = torch.cat([tok_main, tok[n_main:]])
    rec["logps"][:, step] = (tempered.gather(-1, tok_main[:, None]).squeeze(1) - lse).masked_fill(done[:n_main], 0.0)
    if rec.get("entropy") is not None:
        logp_all = tempered - lse[:, None]
        rec["entropy"][:, step] = -(logp_all.exp() * logp_all).sum(-1)
        if sp.stats_k:
            rec["topk_logps"][:, step], rec["topk_ids"][:, step] = logp_all.topk(sp.stats_k, dim=-1)
    bad = ~torch.isfinite(lse) & ~done[:n_main]
    return tok, bad.any()


class _Graphed:
    """One decode step's forward captured as a CUDA graph over the `_State` tensors; `step()` replays it."""

    def __init__(self, model, ckw, cache, s: _State, amp):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        keys = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        with torch.cuda.stream(side):                 # warm-up runs (allocator, lazy init) off the main stream
            for _ in range(2):
                _forward(model, ckw, cache, s, amp)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            _forward(model, ckw, cache, s, amp)
        for layer, (k, v) in zip(cache.layers, keys):  # the warm-ups wrote column `index`: put it back
            layer.keys.copy_(k)
            layer.values.copy_(v)

    def step(self) -> None:
        self.graph.replay()


def _stepper(model, ckw, cache, s: _State, amp, graph: bool):
    """(the step function, the loop's name, why no graph): a CUDA graph when asked for and capture works."""
    if not graph:
        return (lambda: _forward(model, ckw, cache, s, amp)), "static", ""
    if s.tok.device.type != "cuda":
        return (lambda: _forward(model, ckw, cache, s, amp)), "static", "CUDA graphs need a CUDA device"
    try:
        g = _Graphed(model, ckw, cache, s, amp)
    except Exception as err:  # noqa: BLE001 - capture is an optimisation: the eager static step is the same math
        torch.cuda.synchronize()
        return (lambda: _forward(model, ckw, cache, s, amp)), "static", \
            f"CUDA graph capture failed ({type(err).__name__}: {str(err)[:160]}): the static loop ran eagerly"
    return g.step, "static+graph", ""


def loop_for(device, sampling: SamplingParams | None):
    """The decode loop for `device`, chosen by measurement (docs/PERFORMANCE.md): the dynamic loop on the CPU
    (the static one attends over the full capacity: 4 % slower for the tiny model's B = 4 × G = 4, 160 tokens),
    the static loop replayed as a CUDA graph on CUDA (the dynamic loop's time there is kernel launches); the
    rookworld-rlvr pitfalls decode in the dynamic loop."""
    from functools import partial

    from .decoding import decode
    dev = torch.device(device)
    if dev.type != "cuda" or (sampling is not None and (sampling.mini_positions or sampling.continue_after_eos)):
        return decode
    return partial(decode_static, graph=True)


@torch.no_grad()
def decode_static(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, expand: int, max_new_tokens: int,
                  eos_id: int, pad_id: int, sampling: SamplingParams | None = None, greedy: GreedyRows | None = None,
                  sync_every: int | None = None, graph: bool = False) -> Decoded:
    """`decoding.decode`'s contract (same arguments, same `Decoded`), with static shapes (module doc). Finished rows
    are masked, not dropped; the loop stops when every row is done, looked at every `sync_every` steps (1 on the
    CPU, where looking is free). `graph`: replay each step's forward as a CUDA graph (CUDA only; `Decoded.loop`
    says what ran, `Decoded.note` why not a graph)."""
    if sampling is not None and (sampling.mini_positions or sampling.continue_after_eos):
        raise NotImplementedError("the rookworld-rlvr pitfalls decode in the dynamic loop")
    device = next(model.parameters()).device
    e = 0 if greedy is None else greedy.prompt_ids.shape[0]
    ids, pmask, row_src, limit = _rows(prompt_ids, prompt_mask, expand, max_new_tokens, pad_id, device, greedy)
    p, n_main, n, length = ids.shape[1], prompt_ids.shape[0] * expand, row_src.numel(), int(limit.max())
    sp = None if sampling is None else sampling.on(device)
    sync_every = sync_every or (1 if device.type == "cpu" else 16)
    amp = autocast_for(model)
    prompt_cache, ckw, logits = _prompt_forward(model, ids, pmask, row_src, p + length, amp)    # (n, V)
    index = torch.full((1,), p, dtype=torch.long, device=device)
    cache = _static_cache(model, prompt_cache, p + length, index)
    del prompt_cache
    key_mask = _decode_mask(pmask[row_src], model.config._attn_implementation, model.dtype, length)  # (n,1,1,C)
    s = _State(tok=torch.full((n,), pad_id, dtype=torch.long, device=device),
               pos=pmask.long().sum(1)[row_src].clone(), index=index, key_mask=key_mask.clone(), logits=logits)
    visible = key_mask.clone()
    visible[..., p:] = False if visible.dtype == torch.bool else torch.finfo(visible.dtype).min
    s.key_mask.copy_(visible)
    tokens = torch.full((n, length), pad_id, dtype=torch.long, device=device)               # (n, L)
    rec = _record(n_main, max_new_tokens, sp, device)
    step_fn, loop, note = _stepper(model, ckw, cache, s, amp, graph and length > 1)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    bad = torch.zeros((), dtype=torch.bool, device=device)
    steps = 0
    for step in range(length):
        main_open = step < max_new_tokens
        tok, bad_now = _choose(s.logits, done, step, n_main, sp if main_open else None, rec)
        bad |= bad_now
        tok = tok.masked_fill(done, pad_id)
        tokens[:, step] = tok
        steps = step + 1
        done = done | (tok == eos_id) | (limit <= steps)
        if steps == length or (steps % sync_every == 0 and (bool(bad) or bool(done.all()))):
            break
        s.tok.copy_(tok)
        _show(s.key_mask, key_mask, p + step)         # this step's key becomes visible to later queries
        step_fn()
        s.pos += 1
        s.index += 1
    if bool(bad):
        raise NumericalError("cannot sample: the policy's next-token logits are NaN/inf (see the step-0 "
                             "invariants; check the weights and dtype)")
    main_steps = min(steps, max_new_tokens)
    main_steps = _last_needed(tokens[:n_main], pad_id, eos_id, main_steps)
    cut = (lambda x: None if x is None else x[:, :main_steps])                            # noqa: E731
    return Decoded(tokens=tokens[:n_main, :main_steps], logps=cut(rec.get("logps")), entropy=cut(rec.get("entropy")),
                   topk_ids=cut(rec.get("topk_ids")), topk_logps=cut(rec.get("topk_logps")), steps=main_steps,
                   forwards=1 + max(steps - 1, 0), row_steps=n * max(steps - 1, 0),
                   greedy_tokens=tokens[n_main:, :steps] if e else None, loop=loop, note=note)


def _show(mask: torch.Tensor, full: torch.Tensor, column: int) -> None:
    """Make key `column` visible in `mask` (in place), as the full decode mask has it."""
    mask[..., column] = full[..., column]


def _last_needed(tokens: torch.Tensor, pad_id: int, eos_id: int, steps: int) -> int:
    """The dynamic loop stops the main rows once every one has ended: trailing columns where every main row is
    already past its EOS hold only pads there, so they are cut the same way."""
    if steps == 0:
        return 0
    ended = torch.cumsum(tokens[:, :steps] == eos_id, 1) > 0                             # (N, L) at/after EOS
    after = torch.cat([torch.zeros_like(ended[:, :1]), ended[:, :-1]], 1)                 # strictly after EOS
    open_cols = (~after).any(0).nonzero()
    return int(open_cols.max()) + 1 if open_cols.numel() else steps


def _record(n_main: int, t: int, sp: SamplingParams | None, device) -> dict:
    if sp is None:
        return {}
    k = sp.stats_k
    out = {"logps": torch.zeros((n_main, t), device=device)}
    if k is not None:
        out.update(entropy=torch.zeros((n_main, t), device=device),
                   topk_ids=torch.zeros((n_main, t, k), dtype=torch.long, device=device),
                   topk_logps=torch.zeros((n_main, t, k), device=device))
    return out
