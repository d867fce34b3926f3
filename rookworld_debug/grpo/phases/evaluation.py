"""Evaluation: greedy before/after on the SAME prompts, Δlogp of the sampled tokens, same-seed resample.

Shape legend: B prompts, G generations, N = B·G, T completion tokens.

The old tool compared "Pre" on one batch with "Post" on another; here every before/after pair is on
identical prompts with identical (greedy) decoding, and each record says which prompts it used.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from rookworld_debug.grpo.phases.decoding import decode
from rookworld_debug.grpo.phases.generation import GreedyTexts, generate_with_greedy, per_token_logps_and_entropy
from rookworld_debug.grpo.phases.replay import resample_after_update
from rookworld_debug.grpo.phases.rewards import compute_rewards


@dataclass(frozen=True)
class GreedyEval:
    name: str                   # "batch" (this step's B prompts) or "heldout" (fixed held-out prompts)
    prompts: tuple              # n prompts
    tasks: tuple
    completions: tuple          # n greedy completions
    rewards: torch.Tensor       # (n,) built-in reward of each (NaN = unscorable)
    mean_reward: float          # nanmean over the n prompts
    ci95: float                 # half-width of a normal 95% CI of the mean (1.96·s/√n), NaN if n < 2
    format_valid: float         # fraction with no format problem
    n: int
    completion_ids: torch.Tensor | None = None  # (n, L) the greedy token ids, pad after EOS (the after-update
                                                #   replay checks them); None: not kept (older traces)


@dataclass(frozen=True)
class Evaluation:
    batch_before: GreedyEval
    batch_after: GreedyEval
    heldout_before: GreedyEval | None
    heldout_after: GreedyEval | None
    delta_reward_batch: float               # batch_after.mean − batch_before.mean (same prompts, greedy)
    delta_reward_heldout: float             # same for the held-out prompts (NaN when disabled)
    per_token_logps_after: torch.Tensor     # (N, T) logπ_θ'(y_t) of the SAMPLED tokens after the update
    delta_logp: torch.Tensor                # (N, T) after − before, 0 where masked
    per_seq_delta_logp: torch.Tensor        # (N,) masked mean Δlogp per token
    corr_adv_delta_logp: float              # Pearson(advantage_i, per_seq_delta_logp_i) over rows; NaN if flat
    frac_moved_with_advantage: float        # among A ≠ 0 rows: fraction with sign(ΣΔlogp) = sign(A)
    resample_completions: tuple             # N completions resampled after the update with the SAME seed
    resample_rewards: torch.Tensor          # (N,) their built-in rewards
    resample_changed: tuple                 # N bools: text differs from the pre-update sample
    seconds: float
    per_token_entropy_after: torch.Tensor | None = None  # (N, T) entropy (nats) of the tempered policy AFTER the
                                                         #   update at the sampled tokens' positions (same forward)
    replay: dict | None = None   # rows the update left unchanged were replayed, not decoded (grpo/phases/replay.py):
                                 #   {replayed_rows, decoded_sampled_rows, decoded_greedy_rows}; None: full loop


def greedy_completions(policy, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> GreedyTexts:
    """One batched greedy decode (left padding; the sampling loop in argmax mode = `generate(do_sample=False)`),
    text after the prompt up to the first EOS."""
    enc = tokenizer(list(prompts), padding=True, padding_side="left", add_special_tokens=False,
                    return_tensors="pt")
    out = decode(policy, enc["input_ids"], enc["attention_mask"], expand=1, max_new_tokens=max_new_tokens,
                 eos_id=int(tokenizer.eos_token_id), pad_id=int(tokenizer.pad_token_id))
    return GreedyTexts(tokenizer.batch_decode(out.tokens.cpu(), skip_special_tokens=True), out.tokens.cpu())


def greedy_prompts(batch, heldout) -> list[str]:
    """The prompts `greedy_evals` decodes, in its order: the batch's, then the held-out ones."""
    return list(batch[0]) + (list(heldout[0]) if heldout is not None else [])


def greedy_evals(policy, tokenizer, batch, heldout, *, max_new_tokens: int, reward_mode: str,
                 engine=None, completions: Sequence[str] | None = None) -> tuple[GreedyEval, GreedyEval | None]:
    """`batch` and `heldout` = (prompts, tasks, labels) (`heldout` None: not evaluated) → their GreedyEvals,
    from ONE batched greedy decode and ONE reward call (per-step decode cost on CPU is latency-bound, so
    two loops cost nearly twice one). `completions`: the greedy completions of `greedy_prompts(batch,
    heldout)` when a sampling loop already decoded them (`generation.generate_with_greedy`): no decode here."""
    sets = [("batch", *map(list, batch))] + ([("heldout", *map(list, heldout))] if heldout is not None else [])
    prompts = [x for _, p, _, _ in sets for x in p]
    tasks = [x for _, _, t, _ in sets for x in t]
    labels = [x for _, _, _, lab in sets for x in lab]
    if completions is None:
        completions = greedy_completions(policy, tokenizer, prompts, max_new_tokens)
    elif len(completions) != len(prompts):
        raise ValueError(f"{len(completions)} greedy completions for {len(prompts)} prompts")
    r = compute_rewards(prompts, completions, tasks, labels=labels, reward_mode=reward_mode, engine=engine)
    ids = getattr(completions, "ids", None)                                             # (n, L) or None
    out, start = [], 0
    for name, p, t, _ in sets:
        rows = slice(start, start + len(p))
        out.append(_greedy_record(name, p, t, completions[rows], r.rewards[rows], r.format_valid[rows],
                                  None if ids is None else ids[rows]))
        start = rows.stop
    return out[0], (out[1] if heldout is not None else None)


def _greedy_record(name, prompts, tasks, completions, rewards: torch.Tensor, format_valid,
                   completion_ids: torch.Tensor | None = None) -> GreedyEval:
    vals = rewards[~torch.isnan(rewards)]                                                # (n',)
    n = len(prompts)
    return GreedyEval(name=name, prompts=tuple(prompts), tasks=tuple(tasks), completions=tuple(completions),
                      rewards=rewards, mean_reward=float(vals.mean()) if vals.numel() else math.nan,
                      ci95=float(1.96 * vals.std() / math.sqrt(vals.numel())) if vals.numel() > 1 else math.nan,
                      format_valid=sum(format_valid) / max(n, 1), n=n, completion_ids=completion_ids)


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    den = float(x.norm() * y.norm())
    return float((x * y).sum()) / den if den > 0 else math.nan


def evaluate_after(policy, reference, tokenizer, rollout, advantages, before_batch: GreedyEval,
                   before_heldout: GreedyEval | None, *, labels_per_row, batch_labels, heldout_labels,
                   reward_mode: str, engine, eval_max_new_tokens: int,
                   sampling_autocast: str | None = None, replay: bool = True) -> Evaluation:
    """Everything measured AFTER the optimizer step, paired with the `before_*` records. `sampling_autocast`:
    the step's StepConfig.sampling_autocast — the resample/greedy loop runs in the sampler's precision, as the
    before-update one did (the after-update log-probs and entropies stay in the trainer's)."""
    t0 = time.perf_counter()
    batch = (before_batch.prompts, before_batch.tasks, batch_labels)
    heldout = None if before_heldout is None else (before_heldout.prompts, before_heldout.tasks, heldout_labels)
    if replay and _can_replay(policy, sampling_autocast, before_batch, before_heldout):
        # decode only the rows the update changed; the Δlogp forward is the replay's own
        sets = [x for x in (before_batch, before_heldout) if x is not None]
        before_texts = GreedyTexts([c for x in sets for c in x.completions],
                                   _stack_ids([x.completion_ids for x in sets], int(tokenizer.pad_token_id)))
        re_completions, greedy, replayed, replay_counts = resample_after_update(
            policy, tokenizer, rollout, greedy_prompts(batch, heldout), before_texts, eval_max_new_tokens)
        logps_after, entropy_after = replayed.logps, replayed.entropy                      # (N, T) each
    else:
        re_completions, greedy, replay_counts = _resample_loop(policy, reference, tokenizer, rollout, batch, heldout,
                                                               eval_max_new_tokens, sampling_autocast)
        logps_after, entropy_after = per_token_logps_and_entropy(
            policy, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask,
            rollout.temperatures)                                                         # (N, T) each
    batch_after, heldout_after = greedy_evals(policy, tokenizer, batch, heldout, max_new_tokens=eval_max_new_tokens,
                                              reward_mode=reward_mode, engine=engine, completions=greedy)

    mask = rollout.completion_mask.to(logps_after.dtype)                                  # (N, T)
    delta = (logps_after - rollout.per_token_logps) * mask                                # (N, T)
    per_seq = delta.sum(1) / mask.sum(1).clamp(min=1)                                     # (N,)
    adv = advantages.advantages.to(per_seq.dtype)                                         # (N,)
    moving = adv != 0
    frac = float(((torch.sign(delta.sum(1)) == torch.sign(adv)) & moving).sum() / moving.sum()) \
        if moving.any() else math.nan

    re_r = compute_rewards(rollout.prompts, re_completions, rollout.tasks, labels=labels_per_row,
                           reward_mode=reward_mode, engine=engine)
    return Evaluation(
        batch_before=before_batch, batch_after=batch_after, heldout_before=before_heldout, heldout_after=heldout_after,
        delta_reward_batch=batch_after.mean_reward - before_batch.mean_reward,
        delta_reward_heldout=(heldout_after.mean_reward - before_heldout.mean_reward) if heldout_after else math.nan,
        per_token_logps_after=logps_after, delta_logp=delta, per_seq_delta_logp=per_seq,
        corr_adv_delta_logp=_pearson(adv, per_seq), frac_moved_with_advantage=frac,
        resample_completions=tuple(re_completions), resample_rewards=re_r.rewards,
        resample_changed=tuple(a != b for a, b in zip(re_completions, rollout.completions)),
        seconds=time.perf_counter() - t0, per_token_entropy_after=entropy_after, replay=replay_counts)


def _can_replay(policy, sampling_autocast, before_batch: GreedyEval, before_heldout: GreedyEval | None) -> bool:
    """Replay needs the before-update greedy ids and a loop in the model's own fp32 (a bf16 sampler's
    KV-cached logits differ from a teacher-forced forward by more than the last bit)."""
    from rookworld_debug.models.precision import autocast_dtype
    kept = before_batch.completion_ids is not None and (before_heldout is None or
                                                         before_heldout.completion_ids is not None)
    return kept and sampling_autocast is None and autocast_dtype(policy) is None and \
        next(policy.parameters()).dtype == torch.float32


def _stack_ids(ids: list[torch.Tensor], pad_id: int) -> torch.Tensor:
    """Greedy id sets (n_i, L_i) stacked, right-padded with `pad_id` to the longest (pad after EOS, as decoded)."""
    width = max(x.shape[1] for x in ids)
    return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=pad_id) for x in ids])


def _resample_loop(policy, reference, tokenizer, rollout, batch, heldout, eval_max_new_tokens, sampling_autocast):
    """Same seed, same settings, updated weights, every row decoded: what would the next sample look like? Its
    loop also decodes the greedy after-update rows (one loop where there were two)."""
    re, greedy = generate_with_greedy(
        policy, reference, tokenizer, list(rollout.prompts[:: rollout.num_generations]),
        list(rollout.tasks[:: rollout.num_generations]), num_generations=rollout.num_generations,
        max_new_tokens=rollout.max_new_tokens, sampling=dict(rollout.sampling), seed=rollout.seed,
        top_k_alternatives=1, compute_ref=False, score_policy=False,      # only its texts are used
        greedy_prompts=greedy_prompts(batch, heldout), greedy_max_new_tokens=eval_max_new_tokens,
        sampling_autocast=sampling_autocast)
    return list(re.completions), greedy, None
