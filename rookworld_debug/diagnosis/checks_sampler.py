"""Checks: the training log-probs are not the sampler's (the rollout's ℓ^sampler vs the trainer's recompute).

A deterministic gap is told apart by where it sits and its sign:
* inside the completion mask after EOS → padding / post-EOS tokens are trained;
* only on rows whose prompt is left-padded → position ids ignore the padding;
* one sign on the tokens the sampler found most likely, as 1 − T predicts → the training logits skip the
  temperature (dividing by T < 1 sharpens: the top token's log-prob rises; temperature never moves the argmax);
* small, both signs → a sampler in another precision or engine.
"""
from __future__ import annotations

import torch

from rookworld_debug.diagnosis import evidence as E
from rookworld_debug.diagnosis.checks_logprob import BF16_MEAN_ABS, EXACT, _SGAP, _forward_evidence, recorded_precision
from rookworld_debug.diagnosis.context import current_step
from rookworld_debug.diagnosis.findings import Finding, Fix

# a rule over token shares: one sign on ≥ 90 % of the top-1 tokens is a systematic direction, not rounding
SIGN_SHARE = 0.9
# mean |Δℓ| of two float32 forwards of the same weights (summation order): a gap above it is real
FLOAT32_NOISE = 1e-6
# applying ÷ T to the trainer's top-k must reproduce the sampler up to float rounding (it does to ~1e-4 of the gap;
# a bf16 sampler's systematic rounding is reproduced only to ~10 %)
TEMPERATURE_EXPLAINS = 0.01


def _after_eos(trace):
    """(masked tokens after each row's first EOS, how many of them are pad/EOS ids)."""
    r = trace.rollout
    ids, m = r.completion_ids, E.mask(trace)
    eos = _eos_id(trace)
    if eos is None:
        return 0, 0
    is_eos = (ids == eos) & m                                                               # (N, T)
    seen = torch.cumsum(is_eos.long(), 1)                                                  # EOS so far, incl. t
    after = m & ((seen - is_eos.long()) > 0)                                               # strictly after 1st EOS
    return int(after.sum()), int((after & (ids == eos)).sum())


def _eos_id(trace):
    """The EOS id: the last masked token of a row that ended (not truncated)."""
    r = trace.rollout
    m = E.mask(trace)
    for i in range(r.completion_ids.shape[0]):
        if not bool(r.is_truncated[i]) and bool(m[i].any()):
            n = int(m[i].sum())
            first = (r.completion_ids[i] == r.completion_ids[i, n - 1]).nonzero()
            return int(r.completion_ids[i, int(first[0])]) if first.numel() else None
    return None


def check_mask_after_eos(trace) -> list[Finding]:
    n_after, n_pad = _after_eos(trace)
    if n_after == 0:
        return []
    total = int(E.mask(trace).sum())
    pad = n_pad == n_after
    evs = (E.ev("masked_tokens_after_eos", n_after, "completion-mask tokens after the row's first EOS "
                "(TRL keeps EOS and masks everything after it)", where="report: token view"),
           E.ev("masked_tokens_share", n_after / max(total, 1), "their share of all masked tokens"),
           E.ev("pad_ids_among_them", n_pad, "how many of them are the pad/EOS id"))
    code, what = ("pad_in_mask", "padding after EOS is counted in the completion mask") if pad else \
        ("tokens_after_eos_trained", "tokens generated after EOS are trained")
    return [Finding(
        code=code, severity="error",
        cause=f"The loss trains on positions that are not the completion: {what}, so the loss, its normaliser "
              "and the gradient include tokens the policy never chose as part of its answer.",
        evidence=evs, fix=Fix("Cut each completion at its first EOS and mask everything after it (EOS kept).",
                              code_change="completion_mask = (position <= first EOS index), as TRL builds it"),
        alternatives=("pad_in_mask / tokens_after_eos_trained: with pad = EOS the two read alike",),
        score=10.0, step=E.step_of(trace, current_step()))]


def check_sampler_trainer(trace) -> list[Finding]:
    gap = E.sampler_gap(trace)
    if gap is None:
        return []
    st = E.stats(gap)
    if st["max_abs"] <= EXACT or _forward_evidence(trace)[1] or _after_eos(trace)[0]:
        return []                                # agree, or dropout / the mask explain it (their checks)
    step = E.step_of(trace, current_step())
    evs = [E.ev("sampler_gap_mean_abs", st["mean_abs"], "mean |" + _SGAP + "|", where="report: token view"),
           E.ev("sampler_gap_max_abs", st["max_abs"], "max |" + _SGAP + "|")]
    for make in (_position_ids, _temperature, _precision):
        got = make(trace, st, evs, step)
        if got:
            return got
    return [Finding(
        code="sampler_trainer_mismatch", severity="error",
        cause="The training log-probs are not the sampler's: the same tokens under the same weights get different "
              "log-probs in training than when they were sampled, so the ratio, KL and gradient describe another "
              "distribution.", evidence=(*evs, *_where_gap(trace), *_temperature_ratio(trace)),
        fix=Fix("Score exactly the sampled ids with the sampler's temperature, position ids and precision.",
                code_change="score the sampled token ids (never re-tokenized text) with logits ÷ T"),
        alternatives=("retokenized_completions", "temperature_not_applied", "position_ids_left_pad",
                      "sampler_precision"), score=9.5, step=step)]


def _position_ids(trace, st, evs, step):
    rows = E.row_gap(trace)
    pad = E.left_pad(trace)
    if rows is None or not bool((pad == 0).any()) or not bool((pad > 0).any()):
        return []
    flat = float(rows[pad == 0].nanmean())
    padded = float(rows[pad > 0].nanmean())
    if not (flat <= EXACT and padded > 10 * max(flat, EXACT)):
        return []
    return [Finding(
        code="position_ids_left_pad", severity="error",
        cause="Position ids ignore the left padding: rows whose prompt is padded are scored at shifted positions, "
              "so their training log-probs differ from the sampler's while unpadded rows agree.",
        evidence=(*evs, E.ev("gap_unpadded_rows", flat, "mean |ℓ^sampler − ℓ^trainer| per token on rows with no "
                             "left padding"),
                  E.ev("gap_padded_rows", padded, "the same on rows whose prompt is left-padded")),
        fix=Fix("Pass position ids that count real tokens only (cumsum(attention_mask) − 1, pads at 0).",
                code_change="position_ids = attention_mask.cumsum(-1) - 1 clamped at 0, in every scoring forward"),
        alternatives=("a prompt-dependent sampler bug would also hit some rows only",), score=10.0, step=step)]


def _temperature(trace, st, evs, step):
    """Apply the sampling temperature to the trainer's recorded top-k log-probs: if that reproduces the sampler's
    log-probs far better than the trainer's own, the trainer skipped logits ÷ T."""
    r = trace.rollout
    m = E.mask(trace)
    t = r.temperatures.float()
    if r.topk_ids is None or r.topk_ids.ndim != 3 or r.topk_ids.shape[-1] < 2 or bool((t == 1.0).all()):
        return []
    hit = (r.topk_ids == r.completion_ids[..., None]) & m[..., None] & (t != 1.0)[:, None, None]   # (N, T, K)
    sel = hit.any(-1)                                                                             # (N, T)
    if int(sel.sum()) < 5:
        return []
    # both sides renormalised over the same top-k, so only ÷ T differs between them
    tempered = torch.log_softmax(r.topk_logps.float() / t[:, None, None], -1)                     # (N, T, K)
    as_is = torch.log_softmax(r.topk_logps.float(), -1)                                           # (N, T, K)
    pred = (tempered * hit).sum(-1)[sel]                      # the trainer's distribution with ÷ T applied
    base = (as_is * hit).sum(-1)[sel]
    samp = r.sampling_per_token_logps.float()[sel]
    now = (samp - base).abs().mean()
    after = (samp - pred).abs().mean()
    if not float(now) > FLOAT32_NOISE or not float(after) < TEMPERATURE_EXPLAINS * float(now):
        return []
    pos = E.position_gap(trace)
    evs = [*evs, E.ev("gap_if_tempered", float(after), "mean |ℓ^sampler − log_softmax(top-k ℓ^trainer / T)| on "
                      "the sampled tokens in the trainer's top-k: the gap left once ÷ T is applied"),
           E.ev("gap_as_recorded", float(now), "mean |ℓ^sampler − ℓ^trainer| on the same tokens"),
           E.ev("temperature", float(r.temperatures.float().mean()), "mean sampling temperature of the rows", "config")]
    if pos is not None:
        evs += [E.ev("gap_first_token", pos[0], "mean |gap| at the first completion token"),
                E.ev("gap_later_tokens", pos[1], "mean |gap| at the later tokens")]
    return [Finding(
        code="temperature_not_applied", severity="error",
        cause="The training logits are not divided by the sampling temperature: every sampled token's training "
              "log-prob is off in the direction 1 − T predicts, so ratios, KL and the gradient are those of the "
              "untempered policy.", evidence=tuple(evs),
        fix=Fix("Divide the logits by the sampling temperature in every scoring forward (TRL does: logits /= T).",
                code_change="logits = logits / temperature before log_softmax in the trainer's log-prob function"),
        alternatives=("sampler_trainer_mismatch (another logits processor, e.g. top-p renormalisation in the "
                      "sampler's log-probs)",), score=10.0, step=step)]


def _where_gap(trace) -> list:
    """Per row and per task: where the sampler–trainer gap sits (all rows alike vs some rows or one task)."""
    rows = E.row_gap(trace)
    if rows is None:
        return []
    ok = ~torch.isnan(rows)
    out = [E.ev("rows_with_gap_share", float((rows[ok] > EXACT).double().mean()) if bool(ok.any()) else 0.0,
                f"share of rows whose mean |ℓ^sampler − ℓ^trainer| per token > {EXACT:g}"),
           E.ev("worst_row_gap", float(rows[ok].max()) if bool(ok.any()) else 0.0, "the largest row's mean |gap|")]
    tasks = list(getattr(trace.rollout, "tasks", ()) or ())
    for task in sorted(set(tasks))[:4] if len(set(tasks)) > 1 else ():
        sel = torch.tensor([t == task for t in tasks]) & ok
        if bool(sel.any()):
            out.append(E.ev(f"gap_task_{task}", float(rows[sel].mean()), f"mean |gap| per token on the {task} rows"))
    return out


# scales c of the trainer's logits tried for the sampler: log-spaced over [1/4, 4] (temperature ratios)
_RATIOS = torch.logspace(-0.602, 0.602, 49)


def _temperature_ratio(trace) -> list:
    """The temperature ratio that would explain the gap: the scale c for which log_softmax(c · trainer top-k)
    best reproduces the sampler's log-probs, and the gap left there (c = 1: no temperature explains it)."""
    r = trace.rollout
    m = E.mask(trace)
    if r.topk_ids is None or r.topk_ids.ndim != 3 or r.topk_ids.shape[-1] < 2:
        return []
    hit = (r.topk_ids == r.completion_ids[..., None]) & m[..., None]                         # (N, T, K)
    sel = hit.any(-1)
    if int(sel.sum()) < 5:
        return []
    top = r.topk_logps.float()[sel]                                                       # (n, K)
    h = hit[sel].float()                                                                  # (n, K)
    samp = r.sampling_per_token_logps.float()[sel]                                        # (n,)
    pred = (torch.log_softmax(top[None] * _RATIOS[:, None, None], -1) * h[None]).sum(-1)  # (R, n)
    err = (pred - samp[None]).abs().nanmean(1)                                            # (R,)
    best = int(torch.argmin(err))
    one = int(torch.argmin((_RATIOS - 1).abs()))
    return [E.ev("temperature_ratio_fit", float(_RATIOS[best]), "the scale c of the trainer's logits (over its "
                 "recorded top-k) that best reproduces the sampler's log-probs: c = T_trainer / T_sampler"),
            E.ev("gap_at_ratio_fit", float(err[best]), "mean |gap| left at that scale"),
            E.ev("gap_at_ratio_1", float(err[one]), "mean |gap| over the same tokens at c = 1")]


HALF = ("bfloat16", "float16", "torch.bfloat16", "torch.float16")


def _precision(trace, st, evs, step):
    if st["mean_abs"] > BF16_MEAN_ABS:
        return []
    prec = recorded_precision(trace)
    same = bool(prec.get("sampler")) and prec.get("sampler") == prec.get("policy")
    if same and prec["policy"] not in HALF:
        return []                                # recorded: both fp32, a gap is not rounding
    if same:                                     # both 16-bit: a KV-cached loop and a full forward round apart
        return [Finding(
            code="sampler_precision", severity="info",
            cause=f"Sampler and trainer both run in {prec['policy']}: the KV-cached sampling loop and the full "
                  "training forward round differently, so their log-probs differ slightly (both signs), as in any "
                  "16-bit GRPO step.",
            evidence=(*evs, E.ev("sampler_gap_pos_share", st["pos_share"], "share of tokens with ℓ^sampler > "
                                 "ℓ^trainer")),
            fix=Fix("Nothing to fix; for an exact ratio, score in float32 or correct with importance sampling.",
                    step_config={"vllm_importance_sampling_correction": True}), score=1.0, step=step)]
    ac = getattr(trace.config, "sampling_autocast", None)
    return [Finding(
        code="sampler_precision", severity="warning",
        cause="The sampler runs in another precision (or engine) than the trainer: small gaps of both signs "
              "make the update slightly off-policy; the importance-sampling correction accounts for it.",
        evidence=(*evs, E.ev("sampler_gap_pos_share", st["pos_share"], "share of tokens with ℓ^sampler > ℓ^trainer"),
                  E.ev("sampling_autocast_bf16", 1.0 if ac else 0.0, "1 when the sampling loop ran in bf16 autocast",
                       "config")),
        fix=Fix("Correct for it (importance-sampling correction) or sample in the trainer's precision.",
                step_config={"vllm_importance_sampling_correction": True},
                grpo_config={"vllm_importance_sampling_correction": True}),
        alternatives=("sampler_trainer_mismatch",), score=6.0, step=step)]
