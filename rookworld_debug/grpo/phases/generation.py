"""Generation phase: sample G completions per prompt and score them token by token.

Shape legend: B prompts, G generations per prompt, N = B·G rows (each prompt repeated G times
consecutively, TRL's order), P prompt tokens (left-padded), T completion tokens (right-padded),
V vocabulary, K top-k alternatives.

What TRL does and we reproduce (TRL 1.16's GRPOTrainer: sampling and scoring):
- completions are cut after the first EOS; the EOS itself is part of the completion and of
  `completion_mask`; a completion without EOS is truncated;
- per-token log-probs come from a fresh teacher-forced forward over [prompt ; completion] on the
  SAMPLED ids (never re-tokenized text), fp32 logits divided by the row's sampling temperature, full
  vocabulary softmax (top-p/top-k are NOT renormalised), `gathered logit − logsumexp`.
What we add: explicit position ids for left padding (generate derives them from the attention mask;
a plain forward would not), entropy and top-k alternatives of the same tempered distribution, the
exact full-vocabulary KL(π‖π_ref) per token, and a recompute-consistency check against the log-probs
seen at sampling time.

Sampling is our own KV-cached loop (`decoding.decode`: same tokens as `generate` for the same seed). Module
seams: this module samples and assembles the `Rollout`; `grpo.phases.scoring` holds the teacher-forced forwards
(log-probs, entropy, top-k, exact KL); `grpo.phases.completion_text` the text side (cutting at EOS, texts, token
strings, greedy prompts).
Two scoring modes (`generate(score_policy=...)`):
- True (the instrumented step, and μ > 1 where TRL freezes old log-probs with a forward at sampling
  time): a fresh teacher-forced policy forward gives `per_token_logps`, entropy and top-k over the full
  vocabulary, the reference forward adds the exact KL, and the two are compared with the sampling-time
  log-probs (the recompute check);
- False (the core step: TRL's work at μ = 1, where the old log-probs ARE the training forward's,
  detached): no policy forward at all; `per_token_logps`, entropy and top-k are the sampling loop's own
  (computed from the same logits it samples from), and the reference forward keeps only TRL's
  `gathered logit − logsumexp` (no full-vocabulary KL). The recompute check is not run.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.models.precision import autocast_dtype
from rookworld_debug.models.precision import sampling_autocast as sampler_context
from .completion_text import (GreedyTexts, _cut_after_eos, _greedy_kw, _token_strings, _unique_per_group,
                              completion_texts)
from .decoding import SamplingParams, decode
# the scoring forwards live in grpo/phases/scoring.py; these names stay importable from here
from .scoring import (LOGITS_BUDGET_BYTES, TRAIN_BUDGET_BYTES, _auto_chunk, _forward_completion_hidden,  # noqa: F401
                      _forward_completion_logits, _position_ids, _score, _score_ref, _selected_logps, _token_stats,
                      auto_micro_batch_size, per_token_logps_and_entropy, per_token_logps_entropy_full_kl)

__all__ = ["Rollout", "generate", "generate_with_greedy", "inject_completions", "sampling_logps_for", "loss_mask", "row_sampling",
           "GreedyTexts", "completion_texts", "per_token_logps_and_entropy", "per_token_logps_entropy_full_kl",
           "auto_micro_batch_size", "untrained_warning", "LOGP_DIFF_TOLERANCE"]

LOGP_DIFF_TOLERANCE = 1e-4  # sampling-time vs recomputed log-prob; fp32 KV-cache vs full-forward noise is ~1e-6
UNTRAINED_ENTROPY_FRACTION = 0.97  # mean entropy ≥ 97 % of ln V: "looks untrained" (flag, not is_random_init)


@dataclass(frozen=True)
class Rollout:
    """Everything the generation phase produced. Masked positions hold 0 in per-token float tensors."""

    prompt_ids: torch.Tensor                      # (N, P) left-padded with pad id
    prompt_mask: torch.Tensor                     # (N, P) 1 = real prompt token
    completion_ids: torch.Tensor                  # (N, T) sampled ids; pad after the first EOS
    completion_mask: torch.Tensor                 # (N, T) 1 up to and including the first EOS
    per_token_logps: torch.Tensor                 # (N, T) log π(y_t) of the tempered policy: fresh forward
                                                  #   (score_policy) or the sampling loop's (core path)
    ref_per_token_logps: torch.Tensor | None      # (N, T) same for the reference; None if compute_ref=False
    per_token_entropy: torch.Tensor               # (N, T) entropy (nats) of the tempered policy distribution
    per_token_full_kl: torch.Tensor | None        # (N, T) exact Σ_v π(v)(log π(v) − log π_ref(v)), tempered;
                                                  #   None without a reference or without score_policy
    topk_ids: torch.Tensor                        # (N, T, K) most likely tokens under the tempered policy
    topk_logps: torch.Tensor                      # (N, T, K) their log-probs
    sampling_per_token_logps: torch.Tensor        # (N, T) log-prob of the sampled token seen inside generate
    is_truncated: torch.Tensor                    # (N,) bool, no EOS within max_new_tokens
    temperatures: torch.Tensor                    # (N,) sampling temperature of each row
    unique_per_group: torch.Tensor                # (B,) distinct completions (ids + length) per group
    prompts: tuple[str, ...]                      # N prompt strings (repeated G times)
    tasks: tuple[str, ...]                        # N task names, e.g. "P" / "A"
    completions: tuple[str, ...]                  # N decoded completions, special tokens skipped
    completion_tokens: tuple[tuple[str, ...], ...]  # N × len_i byte-level token strings ("ĠM"), EOS included
    topk_tokens: tuple[tuple[tuple[str, ...], ...], ...]  # N × len_i × K byte-level strings of topk_ids
    sampling: Mapping[str, tuple[float, float | None, int | None]]  # task -> (temperature, top_p, top_k)
    num_generations: int
    max_new_tokens: int
    seed: int
    max_abs_logp_diff: float                      # max over masked tokens |sampling − recomputed| log-prob
                                                  #   (NaN: not checked, score_policy=False)
    logp_diff_flagged: bool                       # max_abs_logp_diff > LOGP_DIFF_TOLERANCE
    counts: Mapping[str, int]                     # tokens, generate calls/steps, scoring forwards
    seconds: float                                # wall time of the whole phase
    timings: Mapping[str, float]                  # {"generate": s (sampling loop), "score": s (forwards)}
    warnings: tuple[str, ...] = field(default=())  # human-readable problems found on the way

    @property
    def num_prompts(self) -> int:
        return len(self.prompts) // self.num_generations

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)  # (N,)


# ------------------------------------------------------------------------------- log-prob numerics


# ---------------------------------------------------------------------------------- sampling


def _validate(prompts, tasks, sampling, num_generations, max_new_tokens, tokenizer) -> None:
    if len(prompts) == 0 or len(prompts) != len(tasks):
        raise ConfigError("prompts", f"need one task per prompt and at least one prompt "
                                     f"(got {len(prompts)} prompts, {len(tasks)} tasks)")
    if any(not p for p in prompts):
        raise ConfigError("prompts", "empty prompt: the first completion token would have no context")
    if num_generations < 1:
        raise ConfigError("num_generations", f"must be >= 1, got {num_generations}")
    if max_new_tokens < 1:
        raise ConfigError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
    for task in dict.fromkeys(tasks):
        if task not in sampling:
            raise ConfigError("sampling", f"no (temperature, top_p, top_k) for task {task!r}")
        temp, top_p, top_k = sampling[task]
        if not temp > 0:
            raise ConfigError("sampling", f"task {task!r}: temperature must be > 0 (log-probs divide by it)")
        if top_p is not None and not 0 < top_p <= 1:
            raise ConfigError("sampling", f"task {task!r}: top_p must be in (0, 1], got {top_p}")
        if top_k is not None and top_k < 0:
            raise ConfigError("sampling", f"task {task!r}: top_k must be >= 0 (0/None = off), got {top_k}")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ConfigError("tokenizer", "needs pad and eos ids (load_policy_and_reference sets pad = eos)")


def _dropout_warnings(**models) -> list[str]:
    out = []
    for name, model in models.items():
        live = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
        if live and model.training:
            out.append(f"{name}: {len(live)} dropout modules active in train mode; log-probs are noisy "
                       "(load with load_policy_and_reference or call .eval())")
    return out


def untrained_warning(entropy: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> list[str]:
    """["policy looks untrained: …"] when the mean per-token entropy (N, T) over the mask is within
    UNTRAINED_ENTROPY_FRACTION of ln V, the entropy of a uniform next-token distribution: the signature of
    random weights (a random GPT-2 at step 0: 10.80 vs ln 50257 = 10.82). A trained model sits far below."""
    m = mask.bool()
    if vocab_size < 2 or not bool(m.any()):
        return []
    mean_h, ln_v = float(entropy[m].float().mean()), math.log(vocab_size)
    if not mean_h >= UNTRAINED_ENTROPY_FRACTION * ln_v:
        return []
    return [f"policy looks untrained: mean per-token entropy {mean_h:.3f} nats = {mean_h / ln_v:.1%} of "
            f"ln V = {ln_v:.3f} (a uniform guess over V = {vocab_size} tokens); are these random weights?"]


def row_sampling(settings, rows_tasks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's (temperature, top-p, top-k) from task → (temperature, top_p, top_k) settings: three (N,) tensors,
    top-p 1.0 and top-k 0 where off."""
    temps = torch.tensor([float(settings[t][0]) for t in rows_tasks])
    top_p = torch.tensor([1.0 if settings[t][1] is None else float(settings[t][1]) for t in rows_tasks])
    top_k = torch.tensor([int(settings[t][2] or 0) for t in rows_tasks])
    return temps, top_p, top_k


def _sample(policy, prompt_ids, prompt_mask, rows_tasks, settings, max_new_tokens, eos_id, pad_id, seed, g,
            top_k_alternatives: int | None, greedy=None, faults: dict | None = None):
    """ONE decoding loop for all N rows (per-row temperature/top-p/top-k), seeded by its own generator
    (the caller's RNG is untouched). The prompt forward runs on the B distinct prompts (rows 0, G, 2G, …).

    Returns raw ids (N, T) (pad after EOS), sampling-time log-probs (N, T), the loop's entropy / top-k
    (None unless `top_k_alternatives` is not None), counts.
    """
    device = next(policy.parameters()).device
    temps, top_p, top_k = row_sampling(settings, rows_tasks)                            # (N,) each
    generator = torch.Generator(device=device).manual_seed(seed)
    params = SamplingParams(temps, top_k, top_p, generator, stats_k=top_k_alternatives, **(faults or {}))
    from .decoding_static import loop_for
    d = loop_for(device, params)(policy, prompt_ids[::g], prompt_mask[::g], expand=g, max_new_tokens=max_new_tokens,
                                 eos_id=eos_id, pad_id=pad_id, sampling=params, greedy=greedy)
    counts = {"generate_calls": 1, "generate_steps": d.steps, "tokens_sampled": d.tokens.numel(),
              "decode_forwards": d.forwards, "decode_row_steps": d.row_steps,
              "decode_static": int(d.loop != "dynamic"), "decode_graph": int(d.loop == "static+graph")}
    stats = None if d.entropy is None else {"entropy": d.entropy.cpu(), "topk_ids": d.topk_ids.cpu(),
                                            "topk_logps": d.topk_logps.cpu()}
    if d.greedy_tokens is not None:
        stats = {**(stats or {}), "greedy_tokens": d.greedy_tokens.cpu()}
    if d.note:
        stats = {**(stats or {}), "decode_note": d.note}
    return d.tokens.cpu(), d.logps.cpu(), stats, counts


# ------------------------------------------------------------------------------------------ phase
def generate(policy, reference, tokenizer, prompts: Sequence[str], tasks: Sequence[str], *, num_generations: int,
             max_new_tokens: int, sampling: Mapping[str, tuple[float, float | None, int | None]], seed: int,
             top_k_alternatives: int = 5, compute_ref: bool = True, chunk: int | None = None,
             score_policy: bool = True) -> Rollout:
    """Sample `num_generations` completions for each of the B `prompts` and score every sampled token.

    `sampling` maps task → (temperature, top_p, top_k); top_p None = 1.0, top_k None/0 = off. One
    decoding loop for all rows (per-row settings), driven by its own generator seeded with `seed`: the
    caller's RNG state is untouched and the same seed gives the same ids. `score_policy=False` is the
    core path (module docstring): no policy forward, no full-vocabulary KL, no recompute check.
    """
    return generate_with_greedy(policy, reference, tokenizer, prompts, tasks, num_generations=num_generations,
                                max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                                top_k_alternatives=top_k_alternatives, compute_ref=compute_ref, chunk=chunk,
                                score_policy=score_policy)[0]


def _rollout_warnings(policy, reference, completion_mask, is_truncated, has_eos, entropy, max_new_tokens: int,
                      flagged_diff: float | None) -> list[str]:
    """Human-readable problems of a rollout: dropout on, every row truncated, empty completions, an untrained-
    looking policy, and (`flagged_diff`) recomputed log-probs that disagree with the sampling-time ones."""
    warn = _dropout_warnings(policy=policy, reference=reference)
    n = completion_mask.shape[0]
    if bool(is_truncated.all()):
        warn.append(f"all {n} completions truncated: none emitted EOS within max_new_tokens={max_new_tokens}")
    empty = [int(i) for i in torch.nonzero(completion_mask.sum(1) <= has_eos.long()).flatten()]
    if empty:
        warn.append(f"{len(empty)} empty completion(s) (EOS as the first token) at rows {empty[:16]}")
    warn.extend(untrained_warning(entropy, completion_mask, policy.get_output_embeddings().weight.shape[0]))
    if flagged_diff is not None:
        low = autocast_dtype(policy) or (policy.dtype if policy.dtype != torch.float32 else None)
        cause = ("padding, position ids, temperature or a logits processor disagree" if low is None
                 else f"expected in {low}: KV-cache and full-forward roundings differ; use float32 "
                      "(autocast='off') to check")
        warn.append(f"recomputed log-probs differ from sampling-time ones by {flagged_diff:.3g} > "
                    f"{LOGP_DIFF_TOLERANCE:g}: {cause}")
    return warn


def rollout_of(tokenizer, *, prompt_ids, prompt_mask, completion_ids, completion_mask, prompts, tasks, completions,
               per_token_logps, ref_per_token_logps, per_token_entropy, sampling_per_token_logps, temperature: float,
               top_p, top_k, num_generations: int, max_new_tokens: int, seed: int, warnings: tuple) -> Rollout:
    """A `Rollout` around another trainer's own (N, T) tensors (a TRL capture, a recorded loop): its values as given,
    the token strings and per-group counts derived here, no top-k alternatives and no sampling-loop timings."""
    ids, mask = completion_ids, completion_mask                                          # (N, T)
    n, t = ids.shape
    lengths = mask.sum(1).tolist()
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
        per_token_logps=per_token_logps, ref_per_token_logps=ref_per_token_logps, per_token_entropy=per_token_entropy,
        per_token_full_kl=None, topk_ids=torch.zeros((n, t, 0), dtype=torch.long), topk_logps=torch.zeros((n, t, 0)),
        sampling_per_token_logps=sampling_per_token_logps,
        is_truncated=~((ids == tokenizer.eos_token_id) & mask.bool()).any(1),                    # (N,) no EOS kept
        temperatures=torch.full((n,), float(temperature)), unique_per_group=_unique_per_group(ids, mask, num_generations),
        prompts=tuple(prompts), tasks=tuple(tasks), completions=tuple(completions),
        completion_tokens=tuple(tuple(tokenizer.convert_ids_to_tokens(ids[i, :int(lengths[i])].tolist()))
                                for i in range(n)),
        topk_tokens=tuple(() for _ in range(n)), sampling={k: (float(temperature), top_p, top_k) for k in set(tasks)},
        num_generations=num_generations, max_new_tokens=max_new_tokens, seed=seed, max_abs_logp_diff=math.nan,
        logp_diff_flagged=False, counts={"tokens": int(mask.sum())}, seconds=math.nan, timings={}, warnings=warnings)


def loss_mask(rollout: Rollout, config) -> torch.Tensor:
    """(N, T) the tokens the loss reads: completion_mask, zeroed on truncated rows when
    mask_truncated_completions (TRL). The one definition: the record, the update, the inner iterations and
    the diagnostics all mask with it, so the displayed loss and the optimized loss agree."""
    mask = rollout.completion_mask                                                          # (N, T)
    if config.mask_truncated_completions:
        mask = mask * (~rollout.is_truncated)[:, None]                                      # (N, T)
    return mask


def sampling_logps_for(rollout: Rollout, config, rows=slice(None)) -> torch.Tensor | None:
    """The sampler's log-probs (N, T) for the loss when the sampling IS correction is on (TRL passes them with
    vLLM, whose sampler differs from the trainer; off: None, so OPSM compares the old log-probs, as TRL)."""
    if not config.vllm_importance_sampling_correction:
        return None
    return rollout.sampling_per_token_logps[rows]


def generate_with_greedy(policy, reference, tokenizer, prompts: Sequence[str], tasks: Sequence[str], *,
                         num_generations: int, max_new_tokens: int,
                         sampling: Mapping[str, tuple[float, float | None, int | None]], seed: int,
                         top_k_alternatives: int = 5, compute_ref: bool = True, chunk: int | None = None,
                         score_policy: bool = True, greedy_prompts: Sequence[str] = (),
                         greedy_max_new_tokens: int | None = None,
                         sampling_autocast: str | None = None,
                         decode_options: Mapping[str, bool] | None = None) -> tuple[Rollout, GreedyTexts]:
    """`generate`, plus greedy completions of `greedy_prompts` (up to `greedy_max_new_tokens` each) decoded
    in the SAME loop as the samples (`decoding.decode`'s extra greedy rows): one decode loop where the
    step used two (the greedy evaluation's and the sampler's). The rollout is the one `generate` gives.
    `sampling_autocast` ('bf16'): the sampling loop only runs in bf16 autocast (a bf16 sampler beside an fp32
    trainer); the scoring forwards stay in the model's own precision. `decode_options` (a family's sampler, e.g.
    rookworld-rlvr's faults): `mini_positions` (its KV-cache position ids), `continue_after_eos` (keep sampling
    after EOS and train those tokens; the texts stay cut)."""
    t_start = time.perf_counter()
    opts = decode_options or {}
    _validate(prompts, tasks, sampling, num_generations, max_new_tokens, tokenizer)
    g, eos_id, pad_id = num_generations, int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    rows_prompts, rows_tasks, prompt_ids, prompt_mask, settings, temperatures = _rows(tokenizer, prompts, tasks,
                                                                                     sampling, g)
    with sampler_context(sampling_autocast, policy):
        raw, sampling_logps, loop_stats, counts = _sample(
            policy, prompt_ids, prompt_mask, rows_tasks, settings, max_new_tokens, eos_id, pad_id, seed, g,
            None if score_policy else top_k_alternatives,
            _greedy_kw(tokenizer, greedy_prompts, greedy_max_new_tokens),
            {"mini_positions": bool(opts.get("mini_positions")),
             "continue_after_eos": bool(opts.get("continue_after_eos"))})                # (N, T), (N, T)
    greedy_ids = loop_stats.pop("greedy_tokens") if greedy_prompts else None                   # (E, L')
    decode_note = (loop_stats or {}).pop("decode_note", None)
    greedy_texts = GreedyTexts(tokenizer.batch_decode(greedy_ids, skip_special_tokens=True) if greedy_prompts else (),
                               greedy_ids)
    completion_ids, completion_mask, has_eos = _cut_after_eos(raw, eos_id, pad_id)     # (N, T), (N, T), (N,)
    text_mask = completion_mask
    if opts.get("continue_after_eos"):        # train what was sampled after EOS (texts stay cut)
        completion_ids, completion_mask = raw, torch.ones_like(completion_mask)
    t_generate = time.perf_counter() - t_start

    sampling_logps = sampling_logps.masked_fill(~completion_mask.bool(), 0.0)           # (N, T)
    scores, forwards, max_diff, flagged = _scores(
        policy, reference if compute_ref else None, prompt_ids, prompt_mask, completion_ids, completion_mask,
        temperatures, sampling_logps, loop_stats or None, top_k_alternatives, chunk, score_policy)
    t_score = time.perf_counter() - t_start - t_generate
    is_truncated = ~has_eos  # (N,) = TRL's 'last token neither EOS nor pad' when pad == EOS (RookWorld)
    warn = _rollout_warnings(policy, reference, completion_mask, is_truncated, has_eos, scores["entropy"],
                             max_new_tokens, max_diff if flagged else None) + ([decode_note] if decode_note else [])
    counts.update(tokens_generated=int(completion_mask.sum()), prompt_tokens=int(prompt_mask.sum()),
                  rows=len(rows_prompts), scoring_forwards=forwards, recompute_checked=int(score_policy))
    completion_tokens, topk_tokens = _token_strings(tokenizer, completion_ids, completion_mask.sum(1).tolist(),
                                                    scores["topk_ids"])
    return Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
        completion_mask=completion_mask, per_token_logps=scores["logps"], ref_per_token_logps=scores.get("ref"),
        per_token_entropy=scores["entropy"], per_token_full_kl=scores.get("kl"), topk_ids=scores["topk_ids"],
        topk_logps=scores["topk_logps"],
        sampling_per_token_logps=sampling_logps, is_truncated=is_truncated, temperatures=temperatures,
        unique_per_group=_unique_per_group(completion_ids, completion_mask, g), prompts=rows_prompts,
        tasks=rows_tasks, completions=completion_texts(tokenizer, completion_ids, text_mask),
        completion_tokens=completion_tokens, topk_tokens=topk_tokens,
        sampling=dict(settings), num_generations=g, max_new_tokens=max_new_tokens, seed=seed,
        max_abs_logp_diff=max_diff, logp_diff_flagged=flagged, counts=counts,
        seconds=time.perf_counter() - t_start, timings={"generate": t_generate, "score": t_score},
        warnings=tuple(warn),
    ), greedy_texts


def _rows(tokenizer, prompts, tasks, sampling, g: int) -> tuple:
    """Each of the N = B·G rows' prompt and task (TRL order: a prompt's G copies consecutive), their left-padded
    ids and mask (N, P), the task → (temperature, top_p, top_k) settings used and each row's temperature (N,)."""
    rows_prompts = tuple(p for p in prompts for _ in range(g))
    rows_tasks = tuple(t for t in tasks for _ in range(g))
    enc = tokenizer(list(rows_prompts), padding=True, padding_side="left", add_special_tokens=False,
                    return_tensors="pt")
    settings = {t: tuple(sampling[t]) for t in dict.fromkeys(rows_tasks)}
    temperatures = torch.tensor([float(settings[t][0]) for t in rows_tasks])            # (N,)
    return rows_prompts, rows_tasks, enc["input_ids"], enc["attention_mask"], settings, temperatures


def _scores(policy, reference, prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures,
            sampling_logps, loop_stats, k: int, chunk, score_policy: bool) -> tuple:
    """(per-token scores {logps, entropy, topk_ids, topk_logps[, ref, kl]}, forwards, max |Δ logp|, flagged).
    score_policy: fresh teacher-forced forwards and the recompute check; else (the core path) the sampling
    loop's own values and the reference's selected log-probs only."""
    m = completion_mask.bool()                                                          # (N, T)
    if score_policy:
        scores, forwards = _score(policy, reference, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                  temperatures, k, chunk)
        diff = (sampling_logps - scores["logps"]).abs()[m]
        max_diff = float("nan") if torch.isnan(diff).any() else float(diff.max()) if diff.numel() else 0.0
        return scores, forwards, max_diff, not max_diff <= LOGP_DIFF_TOLERANCE        # NaN counts as flagged
    scores = {"logps": sampling_logps, "entropy": loop_stats["entropy"].masked_fill(~m, 0.0),
              "topk_ids": loop_stats["topk_ids"], "topk_logps": loop_stats["topk_logps"]}
    if reference is not None:
        scores["ref"] = _score_ref(reference, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                   temperatures, chunk)
    return scores, int(reference is not None), float("nan"), False


def inject_completions(rollout: Rollout, texts: Mapping[int, str], policy, reference, tokenizer) -> Rollout:
    """Replace rows of a rollout with chosen completion texts ("what if the model had said X?").

    Each text is tokenized, EOS appended, and EVERY per-token tensor is recomputed by the same
    teacher-forced scoring as sampled rows, so the loss/update treat it exactly like a sample. The
    injected rows' sampling log-probs are set to the recomputed ones (nothing was sampled) and a
    warning names the rows, so no view mistakes them for samples.
    """
    if not texts:
        return rollout
    n, t_old = rollout.completion_ids.shape
    bad = [r for r in texts if not 0 <= r < n]
    if bad:
        raise ConfigError("inject", f"rows {bad} out of range 0..{n - 1}")
    eos_id, pad_id = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    new_ids = {r: tokenizer(t, add_special_tokens=False)["input_ids"] + [eos_id] for r, t in texts.items()}
    t_len = max([t_old, *(len(v) for v in new_ids.values())])
    ids = torch.full((n, t_len), pad_id, dtype=torch.long)                              # (N, T')
    mask = torch.zeros((n, t_len), dtype=rollout.completion_mask.dtype)                # (N, T')
    ids[:, :t_old], mask[:, :t_old] = rollout.completion_ids, rollout.completion_mask
    truncated = rollout.is_truncated.clone()                                            # (N,)
    for r, row in new_ids.items():                    # a handful of user-chosen rows, not a hot path
        ids[r], mask[r] = pad_id, 0
        ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
        truncated[r] = False
    k = rollout.topk_ids.shape[-1]
    scores, _ = _score(policy, reference if rollout.ref_per_token_logps is not None else None, rollout.prompt_ids,
                       rollout.prompt_mask, ids, mask, rollout.temperatures, k, None)
    sampling = torch.zeros((n, t_len))                                                  # (N, T')
    sampling[:, :t_old] = rollout.sampling_per_token_logps
    for r in new_ids:
        sampling[r] = scores["logps"][r]
    lengths = mask.sum(1).tolist()
    completions = completion_texts(tokenizer, ids, mask)
    completion_tokens, topk_tokens = _token_strings(tokenizer, ids, lengths, scores["topk_ids"])
    return replace(
        rollout, completion_ids=ids, completion_mask=mask, per_token_logps=scores["logps"],
        ref_per_token_logps=scores.get("ref"), per_token_entropy=scores["entropy"],
        per_token_full_kl=scores.get("kl"), topk_ids=scores["topk_ids"], topk_logps=scores["topk_logps"],
        sampling_per_token_logps=sampling, is_truncated=truncated,
        unique_per_group=_unique_per_group(ids, mask, rollout.num_generations), completions=completions,
        completion_tokens=completion_tokens, topk_tokens=topk_tokens,
        warnings=rollout.warnings + (f"rows {sorted(texts)} are INJECTED completions, not samples",))
