"""Checks for rookworld-rlvr "mini" faults, each a pure function `check(trace) -> list[Finding]` over a StepTrace.

Every check reads the step's own numbers (the rollout's trained tokens and log-probs, the advantages, the loss
record) and names its evidence; the fix is a StepConfig delta. `STEP_CHECKS` is the tuple a registry imports;
`FAULTS` lists the faults as (code, StepConfig overrides that inject it, finding codes that count as caught).

Codes: rlvr_prompt_trained, rlvr_pad_first_token, rlvr_kv_cache_positions, rlvr_trained_past_eos,
rlvr_summed_logprobs, rlvr_zero_std_push, rlvr_ratio_against_reference.
"""
from __future__ import annotations

import math

import torch

from rookworld_debug.diagnosis.findings import Evidence, Finding, Fix

EOS_TEXT = "<|endoftext|>"
GAP_TOLERANCE = 1e-3          # nats: a sampler–trainer log-prob gap above this is not float noise (fp32 ~1e-5)
LENGTH_RATIO = 1.5            # rows 1.5× longer weigh 1.5× more under summed log-probs (TRL grpo: equal)
_ROLLOUT = "sampled rollout"


def _text(tokens) -> str:
    """Byte-level GPT-2 token strings → text (RookWorld text is ASCII: Ġ is a space, Ċ a newline)."""
    return "".join(tokens).replace("Ġ", " ").replace("Ċ", "\n")


def _prompt_prefix(trace) -> list[tuple[int, str]]:
    """(row, trained text before the sampled completion) for rows whose trained segment starts with prompt text."""
    r = trace.rollout
    out = []
    for i, (tokens, comp, prompt) in enumerate(zip(r.completion_tokens, r.completions, r.prompts)):
        trained = _text(tokens).replace(EOS_TEXT, "")
        at = trained.find(comp) if comp else -1
        head = trained[:at] if at > 0 else ""
        if head and prompt.endswith(head):
            out.append((i, head))
    return out


def check_prompt_trained(trace) -> list[Finding]:
    """Real prompt tokens trained as completion (a right-padding prompt mask on left-padded rows)."""
    rows = _prompt_prefix(trace)
    if not rows:
        return []
    n_chars = sum(len(h) for _, h in rows)
    return [Finding(
        "rlvr_prompt_trained", "error",
        f"{len(rows)} row(s) train the end of their PROMPT as if the policy had sampled it: a prompt mask built "
        "for right padding (first L−1 positions) on left-padded rows covers the pads, not the prompt",
        (Evidence("rows_with_prompt_tokens_trained", float(len(rows)), "rows whose trained segment begins with "
                  "the last characters of their own prompt", _ROLLOUT, "report: token strips"),
         Evidence("prompt_chars_trained", float(n_chars), "characters of prompt text inside the trained segment",
                  _ROLLOUT)),
        Fix("build the prompt mask from each row's pads + prompt (or right-pad); drop the switch",
            step_config={"rlvr_pitfalls": ()},
            code_change="mask = 1 on [0, pads_i + L_i − 1) of a left-padded row, not on [0, L_i − 1)"),
        score=3.0)]


def check_pad_first_token(trace) -> list[Finding]:
    """The first real token's log-prob predicted from a pad is trained (the whole prompt sits in the segment)."""
    r = trace.rollout
    rows = [(i, h) for i, h in _prompt_prefix(trace) if h.strip() == r.prompts[i].strip()]
    if not rows:
        return []
    logps = [float(r.per_token_logps[i, 0]) for i, _ in rows]
    return [Finding(
        "rlvr_pad_first_token", "warning",
        f"{len(rows)} row(s) train their FIRST prompt token predicted from a pad (no real context): a log-prob "
        "the policy never sampled, kept because the mask multiplies by attention_mask[t+1] only",
        (Evidence("rows_pad_first_token", float(len(rows)), "rows whose trained segment starts at the prompt's "
                  "first token", _ROLLOUT),
         Evidence("pad_first_token_logp_mean", sum(logps) / len(logps), "mean log π(first prompt token | pads), "
                  "nats, tempered policy", _ROLLOUT)),
        Fix("mask the target of every pad position as prompt", step_config={"rlvr_pitfalls": ()}),
        alternatives=("rlvr_prompt_trained",), score=2.0)]


def check_kv_cache_positions(trace) -> list[Finding]:
    """A sampler–trainer log-prob gap on LEFT-PADDED rows only: the sampler's positions differ from training's."""
    r = trace.rollout
    m = r.completion_mask.bool()
    gap = ((r.sampling_per_token_logps - r.per_token_logps).abs() * m).amax(1)          # (N,)
    padded = r.prompt_mask.sum(1) < r.prompt_mask.shape[1]                              # (N,)
    if not bool(padded.any()) or bool(padded.all()) or bool(torch.isnan(gap).any()):
        return []                       # the evidence is the contrast: it needs padded AND unpadded rows
    g_pad, g_full = float(gap[padded].max()), float(gap[~padded].max())
    # the cache's positions go wrong only AFTER the first generated token (the prompt forward places it right);
    # a sampler in another precision is off at the first token too
    first = ((r.sampling_per_token_logps[:, 0] - r.per_token_logps[:, 0]).abs() * m[:, 0])[padded]   # (n_padded,)
    if bool(torch.isnan(first).any()) or float(first.max()) > GAP_TOLERANCE:
        return []
    # unpadded rows agree to float noise while padded ones do not (a sampler in another precision shifts both)
    if not (g_pad > GAP_TOLERANCE and g_full <= GAP_TOLERANCE and g_pad > 10 * max(g_full, 1e-5)):
        return []
    return [Finding(
        "rlvr_kv_cache_positions", "error",
        "the sampler scored left-padded rows with other position ids than training: on KV-cached steps every row "
        "got position P_max + step, so a row's positions jump by its pad count (unpadded rows agree)",
        (Evidence("max_logp_gap_padded_rows", g_pad, "max |sampling-time − recomputed log-prob| over the tokens of "
                  "left-padded rows, nats", _ROLLOUT, "report: sampler–trainer gap"),
         Evidence("max_logp_gap_unpadded_rows", g_full, "the same over rows without pads", _ROLLOUT)),
        Fix("cached steps continue each row at its own length: position_ids = L_i + step",
            step_config={"rlvr_pitfalls": ()}),
        alternatives=("a bf16 sampler would shift every row, not only padded ones",), score=3.0)]


def check_trained_past_eos(trace) -> list[Finding]:
    """Tokens sampled after a row's EOS carry loss weight."""
    r = trace.rollout
    extra, rows = 0, 0
    for tokens in r.completion_tokens:
        if EOS_TEXT in tokens[:-1]:
            n = len(tokens) - (list(tokens).index(EOS_TEXT) + 1)
            extra, rows = extra + n, rows + 1
    if not extra:
        return []
    total = float(r.completion_mask.sum())
    return [Finding(
        "rlvr_trained_past_eos", "error",
        f"{rows} row(s) train {extra} token(s) sampled AFTER their EOS: generation ran on until every row stopped "
        "and the training mask kept those tokens",
        (Evidence("tokens_after_eos_trained", float(extra), "trained tokens after a row's first EOS", _ROLLOUT),
         Evidence("share_of_trained_tokens", extra / max(total, 1.0), "their share of Σ completion_mask", _ROLLOUT)),
        Fix("stop each row at its EOS and mask everything after it", step_config={"rlvr_pitfalls": ()}),
        score=3.0)]


def _is_mini(loss) -> bool:
    """Whether the loss record is the mini family's (its checks read the mini's own metrics)."""
    from rookworld_debug.grpo.families import family_of
    from rookworld_debug.grpo.families.rlvr_mini.family import FAMILY
    return family_of(loss.loss_type) is FAMILY


def check_summed_logprobs(trace) -> list[Finding]:
    """The mini sums log-ratios over tokens: each row's gradient weight grows with its length."""
    lo = trace.loss
    if not _is_mini(lo) or lo.loss_params.get("rlvr_length_normalize"):
        return []
    lengths = lo.seq_len[lo.seq_len > 0].double()
    if lengths.numel() < 2 or float(lengths.max() / lengths.min()) < LENGTH_RATIO:
        return []
    ratio = float(lengths.max() / lengths.min())
    return [Finding(
        "rlvr_summed_logprobs", "warning",
        f"log-probs are summed per row, so the longest row pushes {ratio:.1f}× the shortest's weight into the "
        "gradient (and its ratio, a sum of per-token log-ratios, leaves the clip range first)",
        (Evidence("max_over_min_completion_length", ratio, "longest / shortest trained row, tokens", _ROLLOUT,
                  "side-by-side: per-row gradient weight"),
         Evidence("max_length", float(lengths.max()), "tokens", _ROLLOUT)),
        Fix("average over each row's tokens (or use TRL's grpo loss)", step_config={"rlvr_length_normalize": True}),
        alternatives=("loss_type='grpo'",), score=1.0)]


def check_zero_std_push(trace) -> list[Finding]:
    """Zero-std groups that still get a non-zero advantage from the batch normalisation."""
    adv = trace.advantages
    g = adv.num_generations
    pushed = [b for b in adv.zero_std_groups if float(adv.advantages[b * g:(b + 1) * g].abs().max()) > 1e-6]
    if not pushed:
        return []
    worst = max(float(adv.advantages[b * g:(b + 1) * g].abs().max()) for b in pushed)
    base = getattr(trace.config, "rlvr_baseline", "group_mean")
    fix = {"rlvr_baseline": "group_mean", "rlvr_use_gae": False} if base != "group_mean" else {"rlvr_use_gae": False}
    return [Finding(
        "rlvr_zero_std_push", "warning",
        f"{len(pushed)} group(s) with equal rewards get |A| up to {worst:.3g}: the baseline does not centre each "
        "group, and ONE batch-wide (A − mean)/std turns the offset into a push with no reward difference behind it",
        (Evidence("zero_std_groups_pushed", float(len(pushed)), "groups with reward std 0 and max |A| > 1e-6",
                  _ROLLOUT, "report: advantages"),
         Evidence("max_abs_advantage_zero_std", worst, "largest |A| inside those groups", _ROLLOUT)),
        Fix("centre every group on its own mean before the global normalisation", step_config=fix),
        score=2.0)]


def check_ratio_against_reference(trace) -> list[Finding]:
    """What the mini's clipped_frac / kl_div measure: the ratio is against the REFERENCE, summed over tokens."""
    lo = trace.loss
    if not _is_mini(lo):
        return []
    frac = lo.metrics.get("rlvr/clipped_frac", math.nan)
    binding = lo.metrics.get("clip_ratio/region_mean", math.nan)
    kl = lo.metrics.get("rlvr/kl_div", math.nan)
    if not (frac >= 0.5 or kl < 0):
        return []
    return [Finding(
        "rlvr_ratio_against_reference", "warning" if frac >= 0.5 else "info",
        f"'clipped_frac' = {frac:.2f} counts rows whose ratio to the REFERENCE (a sum over all their tokens) is "
        f"outside [1 − ε, 1 + ε], whatever A's sign; the clip binds on {binding:.2f}. 'kl_div' = {kl:.3g} is a "
        "sampled-token surrogate that can be negative. Neither measures one update's size",
        (Evidence("rlvr/clipped_frac", frac, "fraction of rows with r = exp(clamp(Σ_t(logp − ref), ±20)) outside the "
                  "clip range", _ROLLOUT),
         Evidence("clip_ratio/region_mean", binding, "fraction of rows where min() picks the clipped term", _ROLLOUT),
         Evidence("rlvr/kl_div", kl, f"mean_i of the {lo.kl_estimator} surrogate", _ROLLOUT)),
        Fix("length-normalise the log-ratio (or compare with the previous policy, as TRL)",
            step_config={"rlvr_length_normalize": True}, code_change="r_i = exp(Σ_t(logp − logp_old)) per step"),
        score=1.5 if frac >= 0.5 else 0.5)]


STEP_CHECKS = (check_prompt_trained, check_pad_first_token, check_kv_cache_positions, check_trained_past_eos,
               check_summed_logprobs, check_zero_std_push, check_ratio_against_reference)

_MINI = {"loss_type": "rlvr_mini", "reward_mode": "rlvr"}
# a short P: prompt beside a long A: prompt (bundled train split): the P: rows get more pads than prompt tokens,
# and the two groups' rewards differ (the mini's reward gives a malformed P: −0.3, a good A: ≈ 0.75–1)
_SHORT_LONG = {"task": "mixed", "batch_size": 2, "prompt_indices": (527, 1621)}
FAULTS = (
    ("prompt_mask_left_pad", {**_MINI, "task": "mixed", "rlvr_pitfalls": ("prompt_mask_left_pad",)},
     ("rlvr_prompt_trained",)),
    ("pad_first_token", {**_MINI, **_SHORT_LONG, "rlvr_pitfalls": ("prompt_mask_left_pad", "pad_first_token")},
     ("rlvr_pad_first_token",)),
    ("kv_cache_positions", {**_MINI, "task": "mixed", "rlvr_pitfalls": ("kv_cache_positions",)},
     ("rlvr_kv_cache_positions",)),
    ("train_past_eos", {**_MINI, "rlvr_pitfalls": ("train_past_eos",)}, ("rlvr_trained_past_eos",)),
    ("summed_logprobs", {**_MINI, "task": "mixed"}, ("rlvr_summed_logprobs",)),
    ("zero_std_global_norm", {**_MINI, **_SHORT_LONG, "rlvr_baseline": "ema"}, ("rlvr_zero_std_push",)),
)
