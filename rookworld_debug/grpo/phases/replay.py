"""Replay: the after-update resample and greedy rows, decoding only the rows the update changed.

Shape legend: N sampled rows, E greedy rows, T completion tokens, V vocabulary, d hidden size.

A decode step's token is a pure function of the logits at that position and the step's random draw. Along an
OLD completion, the updated weights' logits come from ONE teacher-forced forward, and a same-seed resample's
draws are the sampling loop's stream, regenerated from the seed. So, position by position: would the updated
policy, with the same draw, pick the same token? If it would at every position up to the row's EOS, the
resample IS the old completion — same tokens, nothing to decode. Only the rows that diverge are decoded, each
with the draws it had in the full batch (`SamplingParams(noise=...)`); greedy rows work the same way without draws.
After a small update most rows do not move, so the after-update decode loop mostly disappears.

Exact up to float rounding: teacher-forced and KV-cached logits differ in the last bit, so a token can flip
only on an exact near-tie — the caveat `decoding` states for its loop against `generate`. `evaluation` uses
replay only when the sampling loop runs in fp32 (no autocast); a bf16 sampler's rows are decoded as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rookworld_debug.errors import NumericalError
from .decoding import GreedyRows, SamplingParams, _warp, active_warpers, decode
from .generation import (GreedyTexts, _auto_chunk, _cut_after_eos, _forward_completion_hidden, _greedy_kw,
                         completion_texts, row_sampling)


@dataclass(frozen=True)
class Replayed:
    same: torch.Tensor                  # (n,) bool: the update leaves the row's tokens unchanged
    first_diff: torch.Tensor            # (n,) first position whose token would change (T where none does)
    logps: torch.Tensor | None          # (n, T) tempered log-prob of each old token after the update (sampled)
    entropy: torch.Tensor | None        # (n, T) entropy of the tempered distribution there; 0 where masked
    states: tuple = ()                  # T generator states, the one before each position's draws (sampled)


@torch.no_grad()
def replay_rows(policy, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                temperatures: torch.Tensor | None = None, top_k=None, top_p=None, seed: int | None = None,
                ) -> Replayed:
    """Which rows (n, T) would the policy decode again unchanged? `temperatures` (n,) → sampled rows of a loop
    seeded with `seed` (this batch's n rows are that loop's rows, in order); None → greedy rows (argmax of the
    raw logits). Sampled rows also get the tempered log-prob and entropy of every old token (the Δlogp of the
    evaluation), from the same forward. One teacher-forced forward, then the LM head one position at a time,
    as the loop applies it: memory is (n, T, d) hidden states plus (n, V) per position (and one row chunk's
    forward)."""
    device = next(policy.parameters()).device
    n, t = completion_ids.shape
    ids = completion_ids.to(device)                                                         # (n, T)
    head, sample = policy.get_output_embeddings(), temperatures is not None
    # row chunks as the scoring forwards take them: a chunk's KV cache (prompt + T) is what the forward holds
    chunk = _auto_chunk(n, t, head.weight.shape[0], device)
    hidden = torch.cat([_forward_completion_hidden(policy, prompt_ids[r].to(device), prompt_mask[r].to(device), ids[r],
                                                   completion_mask[r].to(device))
                        for r in (slice(i, i + chunk) for i in range(0, n, chunk))])         # (n, T, d)
    same_at = torch.ones((n, t), dtype=torch.bool, device=device)                           # (n, T)
    logps = torch.zeros((n, t), device=device) if sample else None
    entropy = torch.zeros((n, t), device=device) if sample else None
    if sample:
        temps = temperatures.to(device=device, dtype=torch.float32)                         # (n,)
        top_k, top_p = active_warpers(top_k, top_p, device)      # as the loop: an unused warper is skipped
        generator = torch.Generator(device=device).manual_seed(seed)
    bad = torch.zeros((), dtype=torch.bool, device=device)
    states = []
    for s in range(t):
        logits = head(hidden[:, s]).float()                                                 # (n, V)
        if not sample:
            bad |= ~torch.isfinite(logits).all()
            same_at[:, s] = logits.argmax(-1) == ids[:, s]
            continue
        tempered = logits / temps[:, None]                                                  # (n, V)
        lse = torch.logsumexp(tempered, -1)                                                 # (n,)
        bad |= ~torch.isfinite(lse).all()
        logp_all = tempered - lse[:, None]                                                  # (n, V)
        logps[:, s] = logp_all.gather(-1, ids[:, s, None]).squeeze(1)
        entropy[:, s] = -(logp_all.exp() * logp_all).sum(-1)
        probs = _warp(tempered, top_k, top_p).softmax(-1)                                   # (n, V)
        states.append(generator.get_state())    # a changed row's decode resumes the stream here
        q = torch.empty_like(probs).exponential_(generator=generator)                       # (n, V) step s's draws
        same_at[:, s] = (probs / q).argmax(-1) == ids[:, s]
    if bool(bad):
        raise NumericalError("cannot replay the after-update rows: the updated policy's logits are NaN/inf")
    mask = completion_mask.to(device).bool()                                                # (n, T)
    differs = ~same_at & mask                                                               # (n, T)
    same = ~differs.any(1)                                                                  # (n,)
    first_diff = torch.where(same, t, differs.int().argmax(1))                              # (n,)
    if sample:
        logps, entropy = logps.masked_fill(~mask, 0.0).cpu(), entropy.masked_fill(~mask, 0.0).cpu()
    return Replayed(same=same.cpu(), first_diff=first_diff.cpu(), logps=logps, entropy=entropy, states=tuple(states))


def _prefixed(prompt_ids, prompt_mask, completion_ids, rows: torch.Tensor, start: int):
    """The changed rows' prompts with their first `start` (unchanged) completion tokens appended: their decode
    resumes at position `start`. (k, P + start) ids and mask."""
    ids = torch.cat([prompt_ids[rows], completion_ids[rows, :start]], 1)
    return ids, torch.cat([prompt_mask[rows], torch.ones_like(completion_ids[rows, :start])], 1)


def resample_after_update(policy, tokenizer, rollout, greedy_prompts, greedy_before: GreedyTexts,
                          greedy_max_new_tokens: int) -> tuple[list[str], GreedyTexts, Replayed, dict]:
    """The same-seed resample of `rollout` and the greedy completions of `greedy_prompts` under the CURRENT
    (updated) weights, decoding only the rows whose tokens the update changed (`greedy_before`: the same
    prompts' greedy completions before the update, with their ids).

    Returns (resample completions (N,), greedy completions (E,), the sampled rows' Replayed — with the
    after-update log-probs and entropies of the old tokens — and counts)."""
    eos_id, pad_id = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    n = rollout.completion_ids.shape[0]
    _, top_p, top_k = row_sampling(rollout.sampling, rollout.tasks)                        # (N,) each
    sampled = replay_rows(policy, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                          rollout.completion_mask, temperatures=rollout.temperatures, top_k=top_k, top_p=top_p,
                          seed=rollout.seed)
    enc = _greedy_kw(tokenizer, greedy_prompts, greedy_max_new_tokens)                    # None: no greedy rows
    g_same = Replayed(same=torch.ones(0, dtype=torch.bool), first_diff=torch.zeros(0, dtype=torch.long),
                      logps=None, entropy=None)
    if enc is not None:
        g_ids, g_mask, _ = _cut_after_eos(greedy_before.ids, eos_id, pad_id)               # (E, L') each
        g_same = replay_rows(policy, enc.prompt_ids, enc.prompt_mask, g_ids, g_mask)
    rows, g_rows = (~sampled.same).nonzero().squeeze(1), (~g_same.same).nonzero().squeeze(1)  # changed rows
    completions, greedy = list(rollout.completions), list(greedy_before)
    # each set resumes at its earliest change: the positions before it are unchanged for all its rows
    s0 = int(sampled.first_diff[rows].min()) if rows.numel() else 0
    g0 = int(g_same.first_diff[g_rows].min()) if g_rows.numel() else 0
    extra = None
    if g_rows.numel():
        g_prompt, g_pmask = _prefixed(enc.prompt_ids, enc.prompt_mask, g_ids, g_rows, g0)
        extra = GreedyRows(g_prompt, g_pmask, greedy_max_new_tokens - g0)
    if rows.numel():               # the changed sampled rows, each with its own draws; changed greedy rows beside
        generator = torch.Generator(device=next(policy.parameters()).device)
        generator.set_state(sampled.states[s0])
        prompt, pmask = _prefixed(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rows, s0)
        params = SamplingParams(rollout.temperatures[rows], top_k[rows], top_p[rows], generator, noise=(rows, n))
        d = decode(policy, prompt, pmask, expand=1, max_new_tokens=rollout.max_new_tokens - s0, eos_id=eos_id,
                   pad_id=pad_id, sampling=params, greedy=extra)
        tokens, mask, _ = _cut_after_eos(torch.cat([rollout.completion_ids[rows, :s0], d.tokens.cpu()], 1), eos_id,
                                         pad_id)
        for i, text in zip(rows.tolist(), completion_texts(tokenizer, tokens, mask)):
            completions[i] = text
        g_tokens = d.greedy_tokens
    elif g_rows.numel():           # only greedy rows changed: a greedy loop of their own
        g_tokens = decode(policy, extra.prompt_ids, extra.prompt_mask, expand=1, max_new_tokens=extra.max_new_tokens,
                          eos_id=eos_id, pad_id=pad_id).tokens
    if g_rows.numel():
        g_tokens = torch.cat([g_ids[g_rows, :g0], g_tokens.cpu()], 1)
        for i, text in zip(g_rows.tolist(), tokenizer.batch_decode(g_tokens, skip_special_tokens=True)):
            greedy[i] = text
    counts = {"replayed_rows": n + len(greedy), "decoded_sampled_rows": int(rows.numel()),
              "decoded_greedy_rows": int(g_rows.numel())}
    return completions, GreedyTexts(greedy), sampled, counts
