"""Checks: is there a learning signal, and why not?

A group gives policy-gradient signal only when its rewards differ. "No signal" is split by why, from the
records of the zero-σ groups themselves:
* every completion truncated (no answer to score) — the completion lengths sit at max_new_tokens;
* identical completions: sampling temperature too low (at T = 1 the same distribution would spread) or a prompt
  whose answer is deterministic (it would not spread at T = 1 either);
* different completions, equal rewards: the reward does not read the completion (constant, or the prompt only);
* the same completion scored twice differently: the reward is not a function of the completion (noise).
"""
from __future__ import annotations

import math

import torch

from rookworld_debug.diagnosis import evidence as E
from rookworld_debug.diagnosis.checks_trl_generation import declared_greedy
from rookworld_debug.diagnosis.context import current_step
from rookworld_debug.diagnosis.findings import Finding, Fix

# a temperature whose distribution holds less than half the entropy it would have at T = 1 is what makes the
# completions identical (the ratio, not the level: a deterministic prompt has ~0 entropy at any T)
ENTROPY_RATIO = 0.5
# without recorded top-k (a TRL capture) only the setting itself is known: below 0.3 a softmax keeps little
LOW_T_NO_TOPK = 0.3


def _zero(trace):
    adv = trace.advantages
    g = adv.num_generations
    b = adv.group_mean.numel()
    zero = set(adv.zero_std_groups) | set(getattr(adv, "degenerate_groups", ()))
    return sorted(zero), b, g


def _signal_evidence(trace, zero, b):
    return [E.ev("frac_reward_zero_std", trace.advantages.frac_reward_zero_std, "TRL `frac_reward_zero_std`: "
                 "share of rows whose group's reward std is 0 (advantage 0, no policy-gradient signal)",
                 where="report: Advantages; triage: frac_reward_zero_std"),
            E.ev("zero_std_groups", len(zero), f"groups (of B = {b}) with equal rewards")]


def check_truncation(trace) -> list[Finding]:
    r = trace.rollout
    n = r.is_truncated.numel()
    frac = float(r.is_truncated.float().mean()) if n else 0.0
    if frac == 0.0:
        return []
    lengths = r.completion_mask.sum(1).float()
    term = lengths[~r.is_truncated]
    evs = [E.ev("completions/clipped_ratio", frac, "TRL: share of completions with no EOS within max_new_tokens",
                where="report: Generation; triage: completions/clipped_ratio"),
           E.ev("max_new_tokens", r.max_new_tokens, "the completion budget (TRL max_completion_length)", "config"),
           E.ev("completions/mean_terminated_length", float(term.mean()) if term.numel() else math.nan,
                "TRL: mean length of the completions that ended with EOS")]
    need = _needed_tokens(trace)
    fix = truncation_fix(need, trace.config.eval_max_new_tokens)
    step = E.step_of(trace, current_step())
    if frac >= 0.9:
        zero, b, _ = _zero(trace)
        return [Finding(
            code="all_truncated", severity="error",
            cause=f"No learning signal: {frac:.0%} of the completions are cut at max_new_tokens = {r.max_new_tokens} "
                  "before they end, so the reward scores unfinished answers and the groups barely differ.",
            evidence=(*evs, *_signal_evidence(trace, zero, b)), fix=fix,
            alternatives=("a policy that never emits EOS (degenerate repetition) reads the same",),
            score=9.5, step=step)]
    return [Finding(
        code="truncation", severity="warning",
        cause=f"max_new_tokens = {r.max_new_tokens} is too small for some completions: {frac:.0%} are cut before "
              "they end; their rewards score unfinished answers (and bias toward short completions).",
        evidence=tuple(evs), fix=fix, alternatives=("a policy that rambles without EOS",), score=4.0 + frac, step=step)]


def _needed_tokens(trace) -> int:
    r = trace.rollout
    term = r.completion_mask.sum(1).float()[~r.is_truncated]
    return budget_that_fits(r.max_new_tokens, float(term.max()) if term.numel() else 0.0)


def budget_that_fits(budget: float, longest_terminated: float) -> int:
    """The completion budget the truncation fixes propose (the step's and the run's alike): 1.5 × the longest
    completion that ended, else 2 × the current budget; at least 1.25 × the budget, a multiple of 16."""
    base = 1.5 * longest_terminated if longest_terminated > 0 else 2.0 * budget
    return int(math.ceil(max(base, 1.25 * budget) / 16.0) * 16)


def truncation_fix(need: int, eval_budget: int = 0) -> Fix:
    return Fix(f"Raise the completion budget so completions can end (to ~{need} tokens for this task).",
               step_config={"max_new_tokens": need, "eval_max_new_tokens": max(need, eval_budget)},
               grpo_config={"max_completion_length": need})


def check_no_signal(trace) -> list[Finding]:
    """Zero-σ groups split by their completions: identical (temperature / deterministic prompt) or different."""
    if trace.rollout.is_truncated.float().mean() >= 0.9:
        return []                                     # check_truncation names it
    zero, b, g = _zero(trace)
    if not zero:
        return []
    uniq = trace.rollout.unique_per_group
    same = [k for k in zero if int(uniq[k]) == 1]
    spread = [k for k in range(b) if int(uniq[k]) > 1]                 # groups whose completions differ
    tied = [k for k in spread if k in zero]
    step = E.step_of(trace, current_step())
    frac = len(zero) / max(b, 1)
    base = _signal_evidence(trace, zero, b)
    low_t, evs_t = _low_temperature(trace, zero, same, base)
    out = []
    trunc = trace.rollout.is_truncated.reshape(-1, g)                                       # (B, G)
    cut = sum(int(trunc[k].sum()) for k in tied) >= max(1, len(tied) * g // 2)
    if spread and len(tied) == len(spread) and not cut:   # cut rows: unfinished answers score alike (truncation)
        # no group whose completions differ got different rewards: a reward that read them would separate some
        sure = len(tied) >= 2 and not low_t
        out.append(Finding(
            code="reward_ignores_completion", severity="error" if sure else "warning",
            cause="The reward does not read the completion: every group whose completions differ still got equal "
                  "rewards (a constant reward, or one computed from the prompt only), so their advantages are 0.",
            evidence=(*base, E.ev("groups_with_distinct_completions", len(spread), "groups whose G completions are "
                                  "not all identical (unique_per_group > 1)"),
                      E.ev("of_them_zero_std", len(tied), "of those, groups whose rewards are all equal")),
            fix=Fix("Make the reward a function of the completion (check which argument it reads).",
                    code_change="the reward function must score `completions[i]`, not the prompt or a constant"),
            alternatives=("a reward too coarse to tell these completions apart reads the same",),
            score=(8.5 if sure else 6.5) + len(tied) / max(b, 1), step=step))
    greedy = _greedy(trace, same, g)
    if greedy is not None:
        out.append(Finding(
            code="sampling_greedy", severity="error",
            cause="The completions were not sampled: each group's G completions are one and the same, which sampling "
                  "at the declared temperature would almost never give (greedy decoding: do_sample off, or one seed "
                  "per prompt), so every group's rewards and advantages are equal and the step learns nothing.",
            evidence=(*base, *greedy), fix=Fix(
                "Sample the completions (do_sample=True) at the declared temperature.",
                grpo_config={"generation_kwargs": {"do_sample": True}},
                code_change="generate with do_sample=True (TRL: no 'do_sample': False in generation_kwargs) and a "
                            "generator that differs per row"),
            alternatives=("temperature_too_low: a temperature lower than declared also makes them identical",),
            score=9.0 + frac, step=step))
    if same and low_t and greedy is None:
        out.append(Finding(
            code="temperature_too_low", severity="error" if frac >= 0.75 else "warning",
            cause=f"No learning signal: the sampling temperature {float(trace.rollout.temperatures.float().mean()):g} "
                  "makes the G completions identical (at T = 1 the same policy would spread), so their rewards and "
                  "advantages are equal.",
            evidence=tuple(evs_t), fix=Fix("Sample at a temperature that lets completions differ (≈ 1).",
                                           step_config={"p_temperature": 1.0, "a_temperature": 1.0},
                                           grpo_config={"temperature": 1.0}),
            alternatives=("no_signal_deterministic",), score=8.0 + frac, step=step))
    elif same:
        out.append(Finding(
            code="no_signal_deterministic", severity="warning",
            cause="No learning signal from prompts whose answer is deterministic for this policy: the G completions "
                  "are identical even at this temperature, so the group's advantages are 0.",
            evidence=tuple(evs_t), fix=Fix("Use prompts the policy is unsure about, or more generations per prompt.",
                                           step_config={"num_generations": 2 * g},
                                           grpo_config={"num_generations": 2 * g}),
            alternatives=("temperature_too_low (when the temperature is below 1)",),
            score=2.0 + 2.0 * len(same) / max(b, 1), step=step))
    return out


# a chance below this that sampling gives the identical completions seen is no longer chance
GREEDY_CHANCE = 1e-6


def _greedy(trace, same: list, g: int):
    """The evidence that groups of identical completions were not sampled, or None: under sampling at the declared
    temperature, G draws repeat the first one with chance Π_t p_t^(G−1) (p_t its tokens' recorded probabilities);
    the joint log-chance of every identical group below log GREEDY_CHANCE cannot be chance. No claim under a
    declared top-k / top-p (`_filtered`)."""
    r = trace.rollout
    lp = r.sampling_per_token_logps if r.sampling_per_token_logps is not None else r.per_token_logps
    if not same or g < 2 or lp is None or _filtered(trace) or declared_greedy(trace):
        return None                             # (a TRL capture whose config says so: checks_trl_generation)
    m = r.completion_mask.bool().reshape(-1, g, lp.shape[1])                           # (B, G, T)
    first = (lp.reshape(-1, g, lp.shape[1])[:, 0].double() * m[:, 0]).sum(1)            # (B,) log p(completion)
    rows = torch.tensor(same)
    log_chance = float((g - 1) * first[rows].sum())
    if not math.isfinite(log_chance) or log_chance > math.log(GREEDY_CHANCE):
        return None
    tokens = int(m[rows, 0].sum())
    return (E.ev("identical_groups", len(same), "groups whose G completions are one and the same"),
            E.ev("identical_group_tokens", tokens, "tokens of one completion of each such group"),
            E.ev("log10_chance_if_sampled", log_chance / math.log(10), f"log10 of Π over those groups of "
                 f"p(completion)^(G−1) = {g - 1}: the chance that sampling at the declared temperature repeats each "
                 "group's first completion G−1 times (p from the recorded log-probs)"))


def _filtered(trace) -> bool:
    """The sampler declares top-k or top-p: it samples from a truncated distribution whose probabilities exceed the
    recorded tempered ones (a token the filter leaves alone is certain), so they bound no chance."""
    from rookworld_debug.grpo.phases.decoding import active_warpers
    try:
        settings = [trace.config.sampling_for(t) for t in trace.rollout.tasks]
    except (AttributeError, TypeError):
        return True                              # the sampler's settings are unknown: no claim
    k = torch.tensor([int(s[2] or 0) for s in settings])
    p = torch.tensor([float(s[1] if s[1] is not None else 1.0) for s in settings])
    k, p = active_warpers(k, p, "cpu")
    return k is not None or p is not None


def _low_temperature(trace, zero, same, base):
    """(is the temperature what makes the completions identical?, the evidence)."""
    ent = E.entropy_at_temperature_one(trace)
    t = float(trace.rollout.temperatures.float().mean())
    evs = [*base, E.ev("zero_std_groups_identical", len(same), "zero-σ groups whose G completions are identical"),
           E.ev("temperature", t, "mean sampling temperature of the rows", "config")]
    if ent is not None:
        evs += [E.ev("entropy_sampling", ent[0], "mean token entropy (nats) of the sampling distribution over its "
                     "recorded top-k"), E.ev("entropy_at_T1", ent[1], "the same distribution at temperature 1")]
        return t < 1.0 and ent[0] < ENTROPY_RATIO * ent[1], evs
    return t < LOW_T_NO_TOPK, evs


def check_reward_determinism(trace) -> list[Finding]:
    """The same (prompt, completion) scored twice must get the same reward."""
    pairs, differ = E.identical_rows_rewards(trace)
    if differ == 0:
        return []
    return [Finding(
        code="reward_not_deterministic", severity="error",
        cause="The reward is not a function of the completion: identical completions of the same prompt got "
              "different rewards, so part of every advantage is noise from the reward itself.",
        evidence=(E.ev("identical_completion_pairs", pairs, "pairs of rows with the same prompt and the same "
                       "completion ids"),
                  E.ev("pairs_with_different_reward", differ, "of those, pairs whose rewards differ",
                       where="report: Rewards table")),
        fix=Fix("Make the reward deterministic in (prompt, completion): no random numbers, no state between calls.",
                code_change="remove randomness / hidden state from the reward function"),
        alternatives=("update_mostly_noise: a noisy reward also makes the update mostly noise",),
        score=9.0, step=E.step_of(trace, current_step()))]


def check_unscorable(trace) -> list[Finding]:
    rw = trace.rewards.rewards
    n = rw.numel()
    bad = int(torch.isnan(rw).sum())
    if bad == 0:
        return []
    share = bad / max(n, 1)
    return [Finding(
        code="unscorable_rows", severity="error" if share >= 0.25 else "warning",
        cause=f"{bad} of {n} completions have no score (every reward function returned None/NaN): their advantage "
              "is forced to 0 and their group's statistics use fewer rows.",
        evidence=(E.ev("unscorable_rows", bad, "rows whose summed reward is NaN (every function returned None/NaN "
                       "or a function returned ±inf)", where="report: Rewards table"),
                  E.ev("unscorable_share", share, "their share of the N rows")),
        fix=Fix("Return a number for every completion (e.g. the malformed-answer penalty instead of None).",
                code_change="reward functions return a float for every row; reserve None for rows another function scores"),
        alternatives=("truncation: unfinished completions are often what a reward refuses to score",),
        score=7.0 + share, step=E.step_of(trace, current_step()))]


def check_label_vs_engine(trace) -> list[Finding]:
    """P: rows whose dataset label disagrees with the engine's best move (both known)."""
    rw = trace.rewards
    ml, m1 = getattr(rw, "matches_label", ()), getattr(rw, "matches_sf1", ())
    pairs = [(a, b) for a, b in zip(ml or (), m1 or ()) if a is not None and b is not None]
    if len(pairs) < 4:
        return []
    disagree = sum(a != b for a, b in pairs) / len(pairs)
    if disagree < 0.25:
        return []
    return [Finding(
        code="label_disagrees_engine", severity="info",
        cause=f"On {disagree:.0%} of the P: rows the dataset label's move and the engine's best move disagree about "
              "the completion's move: a reward against the label teaches a different move than one against the engine.",
        evidence=(E.ev("label_engine_disagreement", disagree, "share of P: rows where 'matches the dataset B:' ≠ "
                       "'matches Stockfish #1'", where="report: Rewards table"),),
        fix=Fix("Choose the reward's target deliberately (engine mode scores against Stockfish).",
                step_config={"reward_mode": "engine"}),
        score=1.0 + disagree, step=E.step_of(trace, current_step()))]
