"""rookworld-rlvr's data-pipeline faults, reproducible on this package's rollout (StepConfig.rlvr_pitfalls).

Shape legend: N rows, P padded prompt length, T completion tokens, L_i real prompt tokens of row i, d_i = P − L_i
its left pads. Two faults live in the sampler (grpo/phases/decoding.py: `kv_cache_positions`, `train_past_eos`); the
two below change WHICH positions are trained, so they rebuild the rollout's trained segment:

- `prompt_mask_left_pad`: the mini's prompt mask marks the first L_i − 1 shifted positions, which is right for
  RIGHT padding. Its training batch is LEFT-padded, so those positions are pads and every target position
  s ≥ L_i counts as completion: the last min(d_i, L_i) real prompt tokens (positions max(L_i, d_i) … P − 1)
  are trained as if the policy had sampled them.
- `pad_first_token` (with the first): when d_i ≥ L_i that range starts at the first real token, whose
  log-prob is predicted from a pad (its context holds no real token). Without this switch that one token is
  left out, so each effect can be seen alone.

The rebuilt rollout moves those k_i prompt tokens to the front of the completion (prompt and completion stay
contiguous, so positions and attention are unchanged) and rescores every trained token with a fresh forward.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from rookworld_debug.grpo.phases.generation import Rollout, _score, _token_strings


def trained_prompt_tokens(prompt_mask: torch.Tensor, *, pad_first_token: bool) -> torch.Tensor:
    """k_i (N,): how many of row i's last prompt tokens the mini's right-padding prompt mask leaves to be trained
    on a left-padded row: P − max(L_i, d_i), minus the pad → first-token term unless `pad_first_token`."""
    p = prompt_mask.shape[1]
    length = prompt_mask.sum(1).long()                                                   # (N,)
    pads = p - length                                                                    # (N,)
    start = torch.maximum(length, pads)                                                  # (N,)
    if not pad_first_token:
        start = torch.where(pads >= length, pads + 1, start)                            # skip the first real token
    return (p - start).clamp(min=0)                                                      # (N,)


def _shift(prompt_ids, prompt_mask, completion_ids, completion_mask, k: torch.Tensor, pad_id: int):
    """Move the last k_i prompt tokens of each row to the front of its completion (left/right padding kept)."""
    n, p = prompt_ids.shape
    t = completion_ids.shape[1]
    kmax = int(k.max()) if k.numel() else 0
    new_p = p - int(k.min()) if k.numel() else p
    pid = torch.full((n, new_p), pad_id, dtype=prompt_ids.dtype)
    pm = torch.zeros((n, new_p), dtype=prompt_mask.dtype)
    cid = torch.full((n, t + kmax), pad_id, dtype=completion_ids.dtype)
    cm = torch.zeros((n, t + kmax), dtype=completion_mask.dtype)
    for i in range(n):                       # N rows of index arithmetic, no model work
        ki = int(k[i])
        keep = p - ki
        pid[i, new_p - keep:] = prompt_ids[i, :keep]
        pm[i, new_p - keep:] = prompt_mask[i, :keep]
        cid[i, :ki], cm[i, :ki] = prompt_ids[i, keep:], 1
        cid[i, ki:ki + t], cm[i, ki:ki + t] = completion_ids[i], completion_mask[i]
    return pid, pm, cid, cm


def left_pad_prompt_view(rollout: Rollout, policy, reference, tokenizer, *, pad_first_token: bool) -> Rollout:
    """The rollout as the mini trains it under left padding (see the module docstring); rows whose prompt is
    not padded are unchanged. Texts, rewards and sampling settings stay those of the sampled completion."""
    k = trained_prompt_tokens(rollout.prompt_mask, pad_first_token=pad_first_token)     # (N,)
    if int(k.sum()) == 0:
        return replace(rollout, warnings=rollout.warnings + (
            "prompt_mask_left_pad: no row is left-padded, nothing changes",))
    pad_id = int(tokenizer.pad_token_id)
    pid, pm, cid, cm = _shift(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                              rollout.completion_mask, k, pad_id)
    scores, _ = _score(policy, reference, pid, pm, cid, cm, rollout.temperatures, rollout.topk_ids.shape[-1], None)
    sampling = scores["logps"].clone()                                                   # (N, T')
    for i in range(cid.shape[0]):            # the sampled tokens keep their sampling-time log-probs
        ki = int(k[i])
        sampling[i, ki:ki + rollout.completion_ids.shape[1]] = rollout.sampling_per_token_logps[i]
    lengths = cm.sum(1).tolist()
    tokens, topk_tokens = _token_strings(tokenizer, cid, lengths, scores["topk_ids"])
    moved = int(k.sum())
    first = int(((rollout.prompt_mask.shape[1] - rollout.prompt_mask.sum(1)) >= rollout.prompt_mask.sum(1)).sum()) \
        if pad_first_token else 0
    note = (f"prompt_mask_left_pad: the right-padding prompt mask on left-padded rows trains {moved} real prompt "
            f"token(s) as completion (per row {k.tolist()})" +
            (f"; {first} row(s) also train their first real token predicted from a pad" if first else ""))
    return replace(rollout, prompt_ids=pid, prompt_mask=pm, completion_ids=cid, completion_mask=cm,
                   per_token_logps=scores["logps"], ref_per_token_logps=scores.get("ref"),
                   per_token_entropy=scores["entropy"], per_token_full_kl=scores.get("kl"),
                   topk_ids=scores["topk_ids"], topk_logps=scores["topk_logps"], sampling_per_token_logps=sampling,
                   completion_tokens=tokens, topk_tokens=topk_tokens, warnings=rollout.warnings + (note,))


def apply_layout_faults(rollout: Rollout, config, policy, reference, tokenizer) -> Rollout:
    """The rollout the step trains on, given StepConfig.rlvr_pitfalls (unchanged without layout faults)."""
    if "prompt_mask_left_pad" not in config.rlvr_pitfalls:
        return rollout
    return left_pad_prompt_view(rollout, policy, reference, tokenizer,
                                pad_first_token="pad_first_token" in config.rlvr_pitfalls)
