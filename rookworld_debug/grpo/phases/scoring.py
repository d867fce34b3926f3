"""Teacher-forced scoring: per-token log-probs, entropy, top-k alternatives and the exact KL of completions.

Shape legend: n rows, P prompt tokens (left-padded), T completion tokens (right-padded), V vocabulary,
K top-k alternatives. One forward over [prompt ; completion] on the SAMPLED ids, fp32 logits divided by each
row's temperature, full-vocabulary softmax (TRL's `selective_log_softmax` and `entropy_from_logits`), chunked
by rows; a group's G rows share one prompt forward. The grad path (`per_token_logps_and_entropy(...,
with_grad=True)`) is what the update trains through.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from rookworld_debug.models.memory import memory_budget
from rookworld_debug.models.precision import autocast_for
from .decoding import cache_kw

# CPU budgets; on CUDA a share of the memory free on the card (models.memory.memory_budget)
LOGITS_BUDGET_BYTES = 128 * 2**20  # one fp32 (rows, T, V) tensor per chunk; scoring peaks at a few of these
LOGITS_SHARE = 0.125               # of the card's free memory for that one tensor (so a few of them fit)


def _token_stats(logits: torch.Tensor, ids: torch.Tensor, with_entropy: bool = True):
    """TRL's `selective_log_softmax` (fp32: gathered logit − logsumexp) and `entropy_from_logits`.

    logits: (n, T, V) fp32, already divided by the temperature; ids: (n, T).
    Returns logps (n, T), entropy (n, T), and the full log-probs / probs (n, T, V) so callers that need
    top-k or KL reuse them instead of another softmax over V (entropy and probs None if not wanted).
    """
    logps = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (n, T)
    logp_all = torch.log_softmax(logits, dim=-1)                                                 # (n, T, V)
    if not with_entropy:
        return logps, None, logp_all, None
    p_all = logp_all.exp()                                                                       # (n, T, V)
    entropy = -(p_all * logp_all).sum(-1)                                                        # (n, T)
    return logps, entropy, logp_all, p_all


def _selected_logps(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """TRL's grad path: gathered logit − logsumexp only, no (n, T, V) log-probs kept. (n, T, V), (n, T) → (n, T)."""
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """generate's convention (`_prepare_position_ids_for_generation`): count real tokens, pads at 0."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)  # (n, P+T)


TRAIN_BUDGET_BYTES = 2**30  # on the CPU: what one micro-batch of the grad forward may hold (activations + logits)


def train_bytes_per_row(model, seq_len: int) -> int:
    """Estimated memory of one row's grad forward. Per token (fp32): ~68·d_model bytes per layer of saved
    activations (Korthikanti et al. 2022, ×2 for fp32, flash attention: no s² term) + 3 (·, V) fp32 tensors at the
    head (logits, tempered, logsumexp's backward). GPT-2 124M, P+T ≈ 170: ≈ 0.21 GB per row."""
    cfg = model.config
    layers, d = getattr(cfg, "num_hidden_layers", 12), getattr(cfg, "hidden_size", 768)
    vocab = model.get_output_embeddings().weight.shape[0]
    return seq_len * (layers * 68 * d + 3 * 4 * vocab)


def auto_micro_batch_size(model, n_rows: int, seq_len: int, budget: int | None = None) -> int:
    """Rows per grad forward when the config leaves it open: all N unless the estimated memory of the
    forward exceeds `budget`, then the largest divisor of N that fits (true accumulation, same gradient).
    `budget` None: the model's device's (`memory_budget`: 1 GiB on the CPU — GPT-2 124M at P+T ≈ 170 → 4 rows,
    the tiny model all 32 —, half the free memory on a CUDA card — all 192 rows on an empty 80 GB card)."""
    if budget is None:
        budget = memory_budget(next(model.parameters()).device, TRAIN_BUDGET_BYTES)
    fit = max(1, budget // max(train_bytes_per_row(model, seq_len), 1))
    return max(k for k in range(1, n_rows + 1) if n_rows % k == 0 and (k <= fit or k == 1))


def _auto_chunk(n_rows: int, t: int, vocab: int, device="cpu") -> int:
    """Rows per scoring chunk: one fp32 (rows, T, V) tensor within the device's logits budget."""
    budget = memory_budget(device, LOGITS_BUDGET_BYTES, LOGITS_SHARE)
    return max(1, min(n_rows, budget // max(1, 4 * t * vocab)))


def _prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Consecutive rows with the same prompt form a group. (n, P) → (first row of each group (b,), each
    row's group (n,)), or None when no two consecutive rows share a prompt (nothing to save)."""
    same = ((prompt_ids[1:] == prompt_ids[:-1]) & (prompt_mask[1:] == prompt_mask[:-1])).all(1)  # (n-1,)
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same])                                       # (n,) group starts
    return starts.nonzero().squeeze(1), starts.long().cumsum(0) - 1


def _new_cache(model):
    """The model's own KV cache where it brings one (models.gpt2_torch), else transformers' DynamicCache."""
    own = getattr(model, "new_cache", None)
    if callable(own):
        return own()
    from transformers.cache_utils import DynamicCache
    return DynamicCache(config=model.config)


def _forward_completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Last hidden states (n, T, d) at the positions that predict each completion token (P-1 … P+T-2); the LM
    head of them is `_forward_completion_logits`. (`replay` applies the head one step at a time.)

    A group's G rows share one prompt: the prompt runs once per DISTINCT prompt (with grad when enabled)
    and its KV cache is indexed out to the group's rows, then the completions run on that cache. Same
    math as one forward over prompt + completion for every row (exact up to float summation order; the
    sampling loop shares the prompt the same way) at 1/G of the prompt tokens' forward and backward.
    The last completion token is never an input: it predicts nothing that was sampled.
    """
    t = completion_ids.shape[1]
    attn = torch.cat([prompt_mask, completion_mask], 1)                                 # (n, P+T)
    pos = _position_ids(attn)                                                            # (n, P+T)
    groups = _prompt_groups(prompt_ids, prompt_mask)
    body = model.base_model
    if groups is None:
        return body(input_ids=torch.cat([prompt_ids, completion_ids], 1), attention_mask=attn, position_ids=pos,
                    use_cache=False).last_hidden_state[:, -(t + 1):-1]                     # (n, T, d)
    uniq, expand = groups                                                                # (b,), (n,)
    p = prompt_ids.shape[1]
    cache, ckw = _new_cache(model), cache_kw(body)
    first = body(input_ids=prompt_ids[uniq], attention_mask=prompt_mask[uniq], position_ids=pos[uniq, :p],
                 **{ckw: cache}, use_cache=True).last_hidden_state[:, -1:]                   # (b, 1, d)
    if t == 1:                                                                            # nothing after the prompt
        return first[expand]                                                              # (n, 1, d)
    cache.batch_select_indices(expand)                                                    # (b, ...) → (n, ...)
    rest = body(input_ids=completion_ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, p:-1],
                **{ckw: cache}, use_cache=True).last_hidden_state                          # (n, T-1, d)
    return torch.cat([first[expand], rest], 1)                                            # (n, T, d)


def _forward_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Raw logits (n, T, V) at the positions that predict each completion token: one LM-head matmul over all T
    positions (a per-position one rounds differently)."""
    return model.get_output_embeddings()(
        _forward_completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask))


def _iter_tempered_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures,
                          chunk: int | None) -> Iterator[tuple[slice, torch.Tensor]]:
    """Yield (rows, fp32 logits / T) for each row chunk; logits (n, T, V) predict completion_ids[rows]."""
    device = next(model.parameters()).device
    n, t = completion_ids.shape
    chunk = chunk or _auto_chunk(n, t, model.get_output_embeddings().weight.shape[0], device)
    for start in range(0, n, chunk):
        rows = slice(start, min(n, start + chunk))
        with autocast_for(model):                     # bf16 autocast on CUDA (fp32 weights), else a no-op
            raw = _forward_completion_logits(model, prompt_ids[rows].to(device), prompt_mask[rows].to(device),
                                             completion_ids[rows].to(device), completion_mask[rows].to(device))
        temps = temperatures[rows].to(device=device, dtype=torch.float32)
        logits = raw.float()                                                            # (n, T, V)
        del raw
        # no grad: divide in place (one (n, T, V) tensor less); with grad the division must stay out of place
        yield rows, (logits.div_(temps[:, None, None]) if not torch.is_grad_enabled()
                     else logits / temps[:, None, None])


def per_token_logps_and_entropy(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                                completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                                temperatures: torch.Tensor | float, *, with_grad: bool = False,
                                chunk: int | None = None, entropy_grad: bool | None = None,
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of `completion_ids` and entropy, both of softmax(fp32 logits / temperature).

    THE place log-probs are computed (generation with no grad; the loss phase with `with_grad=True` on
    the same sampled ids). Left-padded prompts get generate-consistent position ids. `temperatures`:
    (N,) per row or one float. `chunk`: rows per forward (default: ~128 MiB of fp32 logits per chunk).
    `entropy_grad` (default = with_grad): False keeps the entropy out of the graph, as TRL does unless
    its entropy bonus is on — the grad path then holds only gathered logit − logsumexp, not three more
    (n, T, V) tensors.
    Returns (per_token_logps (N, T), per_token_entropy (N, T)), 0 where completion_mask is 0, on the device of
    `completion_ids` (the forward runs on the model's; a CPU record gets CPU results, the graph kept). The
    columns after the last one any row's mask holds are not run (`used_columns`).
    """
    if not torch.is_tensor(temperatures) or temperatures.ndim == 0:
        temperatures = torch.full((completion_ids.shape[0],), float(temperatures))     # (N,)
    entropy_grad = with_grad if entropy_grad is None else entropy_grad and with_grad
    width = completion_ids.shape[1]
    used = used_columns(completion_mask)     # the columns past every row's last token predict nothing read
    completion_ids, completion_mask = completion_ids[:, :used], completion_mask[:, :used]
    logps, entropies = [], []
    with torch.set_grad_enabled(with_grad):
        for rows, logits in _iter_tempered_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                                  temperatures, chunk):
            ids = completion_ids[rows].to(logits.device)                                # (n, T)
            if with_grad and not entropy_grad:
                lp = _selected_logps(logits, ids)                                       # (n, T) grad
                with torch.no_grad():
                    _, ent, _, _ = _token_stats(logits.detach(), ids)                  # (n, T) no grad
            else:
                lp, ent, _, _ = _token_stats(logits, ids)
            logps.append(lp)
            entropies.append(ent)
    mask = completion_mask.to(logps[0].device).bool()                                   # (N, T)
    return tuple(torch.nn.functional.pad(torch.cat(x).masked_fill(~mask, 0.0), (0, width - used))
                 .to(completion_ids.device) for x in (logps, entropies))


def used_columns(completion_mask: torch.Tensor) -> int:
    """How many completion columns a forward must run: through the last one any row's mask holds (at least 1). A
    loop that pads every completion to max_new_tokens leaves the rest all padding; causal attention makes the
    earlier positions' values the same without them."""
    cols = completion_mask.bool().any(0).nonzero()
    return int(cols.max()) + 1 if cols.numel() else 1


def per_token_logps_entropy_full_kl(policy, reference, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                    temperatures: torch.Tensor, *, chunk: int | None = None):
    """Like `per_token_logps_and_entropy(..., with_grad=True)` plus the exact full-vocabulary
    KL(π_θ‖π_ref) per token WITH its gradient (the 'full' estimator needs both distributions; the
    reference side carries no grad). Returns (logps, entropy, full_kl), each (N, T), 0 where masked, on the device
    of `completion_ids`."""
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures, chunk)
    logps, ents, kls = [], [], []
    ref_iter = _iter_tempered_logits(reference, *args)
    for rows, logits in _iter_tempered_logits(policy, *args):                          # (n, T, V) with grad
        ids = completion_ids[rows].to(logits.device)                                    # (n, T)
        with torch.no_grad():
            _, ref_all = _reference_side(ref_iter, ids)                                 # (n, T, V)
        lp, ent, logp_all, p_all = _token_stats(logits, ids)
        logps.append(lp)
        ents.append(ent)
        kls.append((p_all * (logp_all - ref_all)).sum(-1))                             # (n, T)
    mask = completion_mask.to(logps[0].device).bool()                                   # (N, T)
    return tuple(torch.cat(x).masked_fill(~mask, 0.0).to(completion_ids.device) for x in (logps, ents, kls))


def _reference_side(ref_iter, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's next row chunk (the same rows as the policy's): its log-probs of `ids` (n, T) and over the
    vocabulary (n, T, V), computed where the reference sits and returned on `ids`' device, the policy's. With
    `reference_device` elsewhere, THE place the reference's numbers cross to the policy's device."""
    _, ref_logits = next(ref_iter)                                                      # (n, T, V)
    ref_lp, _, ref_all, _ = _token_stats(ref_logits, ids.to(ref_logits.device), False)  # (n, T), (n, T, V)
    return ref_lp.to(ids.device), ref_all.to(ids.device)


def _score_ref(reference, prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures, chunk):
    """The core path's only forward: the reference's gathered logit − logsumexp, chunked, no grad. (N, T)."""
    out = torch.zeros(completion_ids.shape)                                              # (N, T)
    with torch.no_grad():
        for rows, logits in _iter_tempered_logits(reference, prompt_ids, prompt_mask, completion_ids,
                                                  completion_mask, temperatures, chunk):
            out[rows] = _selected_logps(logits, completion_ids[rows].to(logits.device)).cpu()
    return out.masked_fill(~completion_mask.bool(), 0.0)


def _score(policy, reference, prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures, k, chunk):
    """Fresh teacher-forced forwards of policy (and reference unless None), chunked by rows, no grad.

    Returns ({logps, entropy, topk_ids, topk_logps[, ref, kl]}, number of forwards); per-token values
    are (N, T), top-k (N, T, K), all 0 where completion_mask is 0.
    """
    n, t = completion_ids.shape
    out = {name: torch.zeros((n, t)) for name in ("logps", "entropy", "ref", "kl")}     # each (N, T)
    out["topk_ids"] = torch.zeros((n, t, k), dtype=torch.long)                         # (N, T, K)
    out["topk_logps"] = torch.zeros((n, t, k))                                          # (N, T, K)
    args = (prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures, chunk)
    ref_iter = _iter_tempered_logits(reference, *args) if reference is not None else None
    forwards = 0
    with torch.no_grad():
        for rows, logits in _iter_tempered_logits(policy, *args):                      # logits (n, T, V)
            ids = completion_ids[rows].to(logits.device)                                # (n, T)
            lp, ent, logp_all, p_all = _token_stats(logits, ids)                        # (n, T), (n, T, V)
            top_v, top_i = logp_all.topk(k, dim=-1)                                     # (n, T, K) each
            out["logps"][rows], out["entropy"][rows] = lp.cpu(), ent.cpu()
            out["topk_logps"][rows], out["topk_ids"][rows] = top_v.cpu(), top_i.cpu()
            forwards += 1
            if ref_iter is not None:
                ref_lp, ref_all = _reference_side(ref_iter, ids)                        # (n, T), (n, T, V)
                out["ref"][rows] = ref_lp.cpu()
                out["kl"][rows] = (p_all * (logp_all - ref_all)).sum(-1).cpu()          # exact KL(π‖π_ref)
                forwards += 1
    if reference is None:
        del out["ref"], out["kl"]
    m = completion_mask.bool()                                                          # (N, T)
    for name in ("logps", "entropy", "ref", "kl"):
        if name in out:
            out[name] = out[name].masked_fill(~m, 0.0)
    return out, forwards
