"""The phases a replay recomputes without weights: the rollout's own consistency, rewards, advantages (the loss:
loss_phase.py).

Shape legend: N rows (B groups of G), T completion tokens, P prompt tokens.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from rookworld_debug.grpo.families import advantages_from_config
from rookworld_debug.grpo.phases.completion_text import _cut_after_eos
from rookworld_debug.grpo.phases.rewards import BUILTIN_REWARDS, LABEL_REWARD_MODES, builtin_breakdowns

from .compare import DISAGREE, VALUE_TOL, compare, skipped
from .fits import STORAGE_FITS, token_fits, value_fits
from .loss_phase import micro_batches
from .records import AGREE, PhaseCheck
from .reward_variants import kl_reward_variant, length_variant, reward_variants
from .stopped_rows import stopped_rows_check


def expected_mask(ids: torch.Tensor, eos: int) -> torch.Tensor:
    """(N, T) 1 up to and including the first EOS (every token of a row without one): TRL's completion mask, as the
    generation phase cuts it."""
    return _cut_after_eos(ids, eos, eos)[1]


def generation_checks(trace, eos: int | None, tokenizer=None) -> list[PhaseCheck]:
    """The rollout against itself: groups share their prompt, the loss mask ends at the first EOS, the texts the
    rewards read are the decoded ids."""
    r = trace.rollout
    g = r.num_generations
    out = [_grouping(r, g)]
    out += mask_checks(trace, eos)
    stopped = stopped_rows_check(trace, eos)
    out += [stopped] if stopped is not None else []
    if tokenizer is not None:
        out.append(_texts_check(r, tokenizer, eos))
    return out


def mask_checks(trace, eos: int | None) -> list[PhaseCheck]:
    """The loss mask against TRL's for the declaration (mask_truncated_completions: rows without EOS all 0)."""
    r = trace.rollout
    if eos is None:
        return [skipped("generation", "completion_mask (N, T)", "the EOS id is unknown (no tokenizer)")]
    check = _mask_check(r.completion_ids, r.completion_mask.long(), eos, trace.config.mask_truncated_completions)
    return [_truncated_rows_cut(check, r, eos)]


def _truncated_rows_cut(check: PhaseCheck, r, eos: int) -> PhaseCheck:
    """`check` named `truncated_rows_masked_to_first_token` where its disagreement lies on the rows the sampler
    flagged truncated alone and each of them keeps its first token only: the mask cut at argmax(ids == EOS), which
    is 0 for a row without EOS."""
    trunc = getattr(r, "is_truncated", None)
    if check.status != DISAGREE or trunc is None or not bool(trunc.bool().any()):
        return check
    trunc, mask = trunc.bool(), r.completion_mask.long()
    off_rows = (mask != expected_mask(r.completion_ids, eos).long()).any(1)                  # (N,)
    first_only = (mask[:, 0] == 1) & (mask.sum(1) == 1)
    if not bool((off_rows <= trunc).all()) or not bool(first_only[trunc].all()):
        return check
    rows = trunc.nonzero().flatten().tolist()
    return _with_cause(check, "truncated_rows_masked_to_first_token", (
        f"the {len(rows)} rows the sampler flagged truncated (rows {rows[:8]}) keep their first token only in the "
        "mask, every other row is right: the mask is cut at argmax(ids == EOS), which is 0 for a row with no EOS, so "
        "a truncated completion trains one token (guard the index: the row's length where it has no EOS)"))


def _grouping(r, g: int) -> PhaseCheck:
    ids, pm = r.prompt_ids, r.prompt_mask
    n = ids.shape[0]
    first = torch.arange(n) // g * g                                                     # (N,) the group's first row
    same_ids = ((ids == ids[first]) | (pm == 0) & (pm[first] == 0)).all(1)                 # (N,)
    same_text = torch.tensor([r.prompts[i] == r.prompts[int(first[i])] for i in range(n)])
    bad = ~(same_ids & same_text)
    if not bool(bad.any()):
        return PhaseCheck("generation", "each group's G rows share one prompt", AGREE, 0.0, 0.0)
    rows = torch.nonzero(bad).flatten().tolist()
    stride = n // g
    strided = all(r.prompts[i] == r.prompts[i % stride] for i in range(n)) if stride > 0 and n > g else False
    return PhaseCheck("generation", "each group's G rows share one prompt", DISAGREE, float(bad.sum()), 0.0,
                      f"{len(rows)} of {n} rows, e.g. rows {rows[:6]}",
                      f"row {rows[0]}'s prompt {r.prompts[rows[0]][:40]!r}",
                      f"its group's prompt {r.prompts[int(first[rows[0]])][:40]!r}",
                      cause="rows_not_grouped",
                      explanation=("the rows are laid out prompt-major with a stride of B (repeat instead of "
                                   "repeat_interleave): a group mixes prompts, so its mean and std compare "
                                   "different positions" if strided else
                                   "rows of one group hold different prompts: group statistics mix positions"),
                      measure="rows whose prompt differs from their group's first row")


def _leading_columns_dropped(mask, want, most: int = 2) -> int:
    """k (1..`most`) when the mask differs from `want` exactly by 0 in the first k columns of every row that has
    them in `want`, else 0."""
    for k in range(1, most + 1):
        cut = want.clone()
        cut[:, :k] = 0
        if bool((want[:, :k] == 1).any()) and torch.equal(mask, cut):
            return k
    return 0


def _mask_check(ids, mask, eos: int, mask_truncated: bool = False) -> PhaseCheck:
    """The loss mask against TRL's; a mask that only adds tokens after the first EOS, or only drops the EOS, names
    its mechanism. `mask_truncated`: a row with no EOS may be all 0 (TRL masks it before the loss)."""
    want = expected_mask(ids, eos)                                                        # (N, T)
    if mask_truncated:
        truncated = ~(ids == eos).any(1)                                                  # (N,)
        want = torch.where((truncated & (mask.sum(1) == 0))[:, None], torch.zeros_like(want), want)
    after_eos = (mask == 1) & (want == 0)
    eos_dropped = (mask == 0) & (want == 1) & (ids == eos)
    q = "completion_mask (N, T): 1 through the first EOS" + (" (0 on rows without one)" if mask_truncated else "")
    check = compare("generation", q, mask, want, 0.0, unit="token", fit=token_fits(want, None))
    if check.status == DISAGREE:
        if bool(after_eos.any()) and not bool(((mask == 0) & (want == 1)).any()):
            check = _with_cause(check, "tokens_after_eos_trained", "the mask is 1 on tokens after the first EOS: the "
                                                                   "loss trains the padding")
        elif _leading_columns_dropped(mask, want):
            k = _leading_columns_dropped(mask, want)
            check = _with_cause(check, "first_token_not_in_mask", f"the mask is 0 on the first {k} completion "
                                f"token{'s' if k > 1 else ''} of every row and right after: the mask's start is "
                                f"off by {k} (an action mask sliced [:, {k}:] against the completion, or shifted "
                                "with the prompt), so the loss never trains the token that opens each answer")
        elif bool(eos_dropped.any()) and not bool(after_eos.any()):
            check = _with_cause(check, "eos_not_in_mask", "the mask is 0 on the EOS token: the loss never teaches the "
                                                          "policy to stop")
    return check


def _with_cause(check: PhaseCheck, code: str, sentence: str) -> PhaseCheck:
    from dataclasses import replace
    return replace(check, cause=code, explanation=sentence)


def _texts_check(r, tok, eos: int | None = None) -> PhaseCheck:
    """The completion strings the rewards read against the decoded ids (special tokens skipped): the loss mask's
    ids, or the ids generated through the first EOS (mask_truncated_completions leaves a truncated row's loss mask
    all 0; TRL's reward still reads the row's text, a loop that decodes after masking reads '')."""
    ids, mask = r.completion_ids, r.completion_mask.bool()
    decoded = [tok.decode(ids[i][mask[i]].tolist(), skip_special_tokens=True) for i in range(ids.shape[0])]
    bad = [i for i, (a, b) in enumerate(zip(decoded, r.completions)) if a.strip() != str(b).strip()]
    if bad and eos is not None:
        generated = expected_mask(ids, eos).bool()
        bad = [i for i in bad if tok.decode(ids[i][generated[i]].tolist(), skip_special_tokens=True).strip()
               != str(r.completions[i]).strip()]
    if not bad:
        return PhaseCheck("generation", "completion texts = decoded completion ids", AGREE, 0.0, 0.0)
    shifted = all(any(decoded[i].strip() == str(c).strip() for c in r.completions) for i in bad)
    why = "the texts are the completions of other rows: rewards are joined to the wrong ids" if shifted else \
        _special_tokens_kept(r, tok, bad, mask)
    return PhaseCheck("generation", "completion texts = decoded completion ids", DISAGREE, float(len(bad)), 0.0,
                      f"{len(bad)} of {len(decoded)} rows, e.g. rows {bad[:6]}", repr(str(r.completions[bad[0]])[:50]),
                      repr(decoded[bad[0]][:50]), "completion_text_misaligned" if why else "", why,
                      measure="rows whose text is not their decoded ids")


def _special_tokens_kept(r, tok, bad: list, mask: torch.Tensor) -> str:
    """Why the texts of rows `bad` differ, where each is its ids decoded with the special tokens kept (the EOS and
    the padding after it read as text by the reward) and that decode holds one, else "". `mask`: (N, T) the ids
    generated."""
    ids = r.completion_ids
    spans = {"its in-mask ids": lambda i: ids[i][mask[i]], "all its T ids (the padding after EOS included)":
             lambda i: ids[i]}

    def kept(i, pick):
        text = tok.decode(pick(i).tolist(), skip_special_tokens=False).strip()
        return text == str(r.completions[i]).strip() and text != tok.decode(pick(i).tolist(),
                                                                            skip_special_tokens=True).strip()
    for span, pick in spans.items():
        if all(kept(i, pick) for i in bad):
            eos = tok.eos_token or "the end-of-sequence token"
            return (f"each text is the decode of {span} with the special tokens kept (skip_special_tokens=False): the "
                    f"rewards read {eos!r} as part of the completion, so a format check or a parser sees text the "
                    "model did not write as an answer")
    return ""


def rewards_check(trace, labels) -> PhaseCheck:
    rw, r = trace.rewards, trace.rollout
    q = "rewards (N,): the project's RookWorld reward of each row's completion against its label"
    names = tuple(rw.func_names)
    if not names or any(n not in BUILTIN_REWARDS for n in names):
        return _own_reward(trace, labels, skipped("rewards", q, f"the reward functions {list(names)} are the loop's "
                                                  "own: pass them to replay_trace(reward_funcs=...) to recompute them"))
    engine = None
    if rw.reward_mode == "engine":
        engine, why = _replay_engine(trace)
        if engine is None:
            return skipped("rewards", q, why)
    elif rw.reward_mode not in LABEL_REWARD_MODES:
        return skipped("rewards", q, f"reward_mode {rw.reward_mode!r} is not one a replay recomputes")
    if engine is None and (not labels or not any(labels)):
        return skipped("rewards", q, "no dataset labels were recorded with the prompts")

    def score(lab):
        scored = builtin_breakdowns(list(r.prompts), list(r.completions), list(lab), reward_mode=rw.reward_mode,
                                    engine=engine)
        return torch.tensor([b.total if b is not None else math.nan for b in scored], dtype=torch.float64)  # (N,)
    try:
        ref = score(labels)
    finally:
        if engine is not None:
            engine.close()
    if engine is not None:                   # one search per position: the label fits would search again
        return compare("rewards", q + " (Stockfish re-run under the step's search settings)", rw.rewards.double(),
                       ref, VALUE_TOL, variants=reward_variants(ref, r.num_generations),
                       fit=value_fits(r.num_generations))
    variants = {**reward_variants(ref, r.num_generations), **_label_variants(score, labels, r.num_generations),
                **(_cut_variants(trace, labels) if rw.reward_mode == "dataset" else {}),
                **length_variant(rw.rewards.double(), ref, r.completion_mask.sum(1)),
                **kl_reward_variant(trace, rw.rewards.double(), ref)}
    return compare("rewards", q, rw.rewards.double(), ref, VALUE_TOL, variants=variants,
                   fit=value_fits(r.num_generations))


# the fits of a reward function's rows, not of its values: the recorded values are the candidate's, on other rows
ROW_FITS = ("reward_rows_misaligned", "rewards_other_labels", "reward_cached", "reward_input_truncated")


def _own_reward(trace, labels, skip: PhaseCheck) -> PhaseCheck:
    """The loop's own reward functions are never called from a file. The project's RookWorld reward against the
    recorded labels is tried as a candidate: where it reproduces the recorded rewards, the phase agrees; where it
    reproduces them on other rows only (shifted, reversed, another group's label, cached by prompt) or only as
    stored in another type (rounded to bf16, cut to whole numbers) with at least 3 distinct values (a permutation of
    fewer is no evidence), or where the rewards are exactly the candidate's of each completion cut short (at least 3
    distinct recorded values), that is the finding; otherwise `skip`, no claim (a reward of another scale or formula
    is the loop's own business)."""
    g = trace.rollout.num_generations
    score = functools.partial(rookworld_candidate, trace)
    ref = score(labels)
    rec = trace.rewards.rewards.double()
    if ref is None or not bool(torch.isfinite(ref).all()):
        return skip
    spread = ref.unique().numel() >= 3
    variants = {**reward_variants(ref, g), **_label_variants(score, labels, g)} if spread else {}
    variants.update(_cut_variants(trace, labels) if rec.unique().numel() >= 3 else {})
    variants = {k: v for k, v in variants.items() if k.split("/")[0] in ROW_FITS}
    if not spread and not variants:
        return skip
    q = ("rewards (N,): the loop's own reward functions, against the project's RookWorld reward of each row's "
         "completion against its label (the candidate)")
    check = compare("rewards", q, rec, ref, VALUE_TOL, variants=variants,
                    fit=value_fits(g, STORAGE_FITS) if spread else None)
    return check if check.status == AGREE and spread or check.cause else skip


def row_labels(trace) -> list:
    """Each row's dataset label: its prompt's, repeated for the G rows of its group; [] where none were recorded."""
    batch = trace.setup.batch.completions if trace.setup is not None else None
    return [x for x in batch for _ in range(trace.rollout.num_generations)] if batch else []


def rookworld_candidate(trace, labels=None) -> Optional[torch.Tensor]:
    """(N,) the project's RookWorld reward of each row's completion against its label (`labels` per row; default
    `row_labels`), NaN where unscorable; None where a row has no label."""
    r = trace.rollout
    labels = row_labels(trace) if labels is None else labels
    if not labels or not all(labels):
        return None
    scored = builtin_breakdowns(list(r.prompts), list(r.completions), list(labels), reward_mode="dataset")
    return torch.tensor([b.total if b is not None else math.nan for b in scored], dtype=torch.float64)  # (N,)


def _replay_engine(trace) -> tuple:
    """(a Stockfish under the step's recorded search settings, "") when its search is deterministic and the same
    engine is here — fixed depth, one thread, a fresh game (cleared hash) per search, the recorded version — else
    (None, why not)."""
    from rookworld_debug.chess.engine import Engine
    from rookworld_debug.errors import RookWorldError
    rec = (trace.setup.provenance or {}).get("engine") if trace.setup is not None else None
    if not isinstance(rec, dict) or not isinstance(rec.get("depth"), int) or rec.get("threads") != 1:
        return None, ("reward_mode 'engine': the trace does not record a fixed-depth, one-thread search, so its "
                      "rewards cannot be re-run to the same values")
    try:
        engine = Engine(depth=rec["depth"], multipv=int(rec.get("multipv") or 5), threads=1, workers=1)
    except (RookWorldError, OSError) as err:
        return None, f"reward_mode 'engine': no Stockfish to re-run the searches here ({err})"
    if rec.get("version") and getattr(engine, "version", None) != rec["version"]:
        engine.close()
        return None, (f"reward_mode 'engine': the Stockfish here ({getattr(engine, 'version', None)}) is not the "
                      f"step's ({rec['version']}); another version's evaluations differ")
    return engine, ""


def _label_variants(score, labels, g: int) -> dict:
    """A fit of the join between completions and labels: the rewards scored against the labels of other rows
    (another group's, or in prompt-major order), each computed only when tried."""
    n = len(labels)
    out = {}
    for s in (g, -g):
        if 0 < abs(s) < n:
            rolled = [labels[(i - s) % n] for i in range(n)]
            out[f"rewards_other_labels/{s}"] = (lambda lab=rolled: score(lab), f"the rewards were scored against the "
                                                f"labels of the rows {s} away (another group's label): the reward "
                                                "reads each completion against another position's answer")
    b = n // g if g else 0
    if b > 1:
        stride = [labels[(i % b) * g + i // b] for i in range(n)]
        out["rewards_other_labels/stride"] = (lambda lab=stride: score(lab), "the rewards were scored against the "
                                              "labels in prompt-major order (stride B) while the rows are grouped")
    return out


# the input lengths (characters) a reward scorer is commonly capped at
CUTS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048)


def _cut_variants(trace, labels) -> dict:
    """The rewards of each completion cut to its first c characters (a scorer whose input is truncated on the right,
    so it never sees a long completion's end), for each c of CUTS shorter than the longest completion; each computed
    only when tried."""
    r = trace.rollout
    longest = max((len(str(c)) for c in r.completions), default=0)
    if not labels or not all(labels):
        return {}

    def cut(c: int):
        scored = builtin_breakdowns(list(r.prompts), [str(x)[:c] for x in r.completions], list(labels),
                                    reward_mode="dataset")
        return torch.tensor([b.total if b is not None else math.nan for b in scored], dtype=torch.float64)
    return {f"reward_input_truncated/{c}": (lambda c=c: cut(c), f"the rewards are those of each completion cut to "
                                            f"its first {c} characters: the scorer's input is truncated on the right, "
                                            "so it never reads a long completion's end, where the answer is")
            for c in CUTS if c < longest}


def advantages_check(trace) -> PhaseCheck:
    adv, config = trace.advantages, trace.config
    ours = advantages_from_config(trace.rewards.rewards, config)
    return compare("advantages", f"advantages (N,): {ours.normalization}", adv.advantages.double(),
                   ours.advantages.double(), VALUE_TOL * 10,
                   variants=advantage_variants(trace.rewards.rewards.double(), config, ours.advantages.double(),
                                               micro_rows=micro_batches(trace),
                                               ranks=getattr(trace.recorded, "rows_by_rank", ()) or ()),
                   fit=value_fits(config.num_generations))


def advantage_variants(r: torch.Tensor, config, ref: torch.Tensor, *, micro_rows: list = (),
                       ranks: tuple = ()) -> dict:
    """What common mistakes in an advantage computation give, from the same rewards."""
    g, n = config.num_generations, r.numel()
    b = n // g
    eps = float(getattr(config, "adv_eps", 1e-4))

    def z(grouped, ddof=1, scale=True, centre=True):
        m = grouped.mean(1, keepdim=True) if centre else 0.0
        s = grouped.std(1, keepdim=True, correction=ddof) if scale else 1.0
        return ((grouped - m) / (s + eps if scale else 1.0))

    grouped = r.view(b, g)
    out = {"advantage_sign_flipped": (-ref, "the advantages are negated: the update pushes down the better "
                                            "completions"),
           "advantage_grouping": (z(r.view(g, b).T).T.reshape(-1) if b > 1 else None,
                                  "the groups were formed with a stride of B (view(G, B) instead of view(B, G)): "
                                  "each 'group' mixes prompts"),
           "advantage_std_ddof": (z(grouped, ddof=0).reshape(-1), "the std is the population std (ddof 0), not "
                                                                  "TRL's unbiased std (ddof 1)"),
           "advantage_not_centered": (z(grouped, centre=False).reshape(-1), "the group mean is not subtracted: "
                                                                            "every completion is pushed by its raw "
                                                                            "reward"),
           "advantage_raw_rewards": (r, "the advantages are the raw rewards (no group baseline)")}
    groupings = other_groupings(n, g, micro=micro_rows, ranks=ranks) if config.scale_rewards == "group" else {}
    for name, key in groupings.items():
        out[f"advantage_grouping/{name}"] = (_standardised_over(r, key, eps), f"the advantages are the group "
                                             f"statistics taken over {name} instead of each group of G = {g} rows")
    return out


def other_groupings(n: int, g: int, *, micro: list = (), ranks: tuple = ()) -> dict:
    """{what the sets are: (N,) set index} of the groupings a loop may standardise over instead of its G-row
    groups: the whole batch, each micro-batch, each rank, contiguous sets of another size, interleaved rows."""
    rows = torch.arange(n)
    out = {f"the whole batch of N = {n} rows": torch.zeros(n, dtype=torch.long)}
    if len(micro) > 1:
        key = torch.empty(n, dtype=torch.long)
        for i, chunk in enumerate(micro):
            key[chunk] = i
        out[f"each micro-batch ({len(micro)} of {len(micro[0])} rows)"] = key
    if len(ranks) > 1:
        key = torch.empty(n, dtype=torch.long)
        for i, (a, b) in enumerate(ranks):
            key[a:b] = i
        out[f"each rank's rows ({len(ranks)} ranks)"] = key
    for size in (s for s in range(2, n) if n % s == 0 and s != g):
        out.setdefault(f"contiguous sets of {size} rows", rows // size)
        if size != n // g:                          # stride B is the named prompt-major mistake
            out[f"interleaved sets of {size} rows (rows i, i + {n // size}, …)"] = rows % (n // size)
    return out


def _standardised_over(r: torch.Tensor, key: torch.Tensor, eps: float) -> torch.Tensor:
    """(r − mean) / (std + eps) within each set of `key` (ddof 1, as TRL's group std)."""
    out = torch.empty_like(r)
    for k in key.unique():
        sel = key == k
        x = r[sel]
        out[sel] = (x - x.mean()) / ((x.std() if x.numel() > 1 else torch.zeros(())) + eps)
    return out
