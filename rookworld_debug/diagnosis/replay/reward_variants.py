"""What recorded rewards may be instead of the RookWorld reward of each row against its label: the right rewards on
other rows or negated, plus a term in the completion's length, or minus a KL penalty folded into the reward; each a
candidate the rewards check compares within its tolerance.

    reward_variants(ref, g)                      -> {code: (values, sentence)}
    length_variant(recorded, ref, lengths)       -> {"reward_length_term": ...} or {}
    kl_reward_variant(trace, recorded, ref)      -> {"kl_in_reward": ...} or {}
"""
from __future__ import annotations

import torch

from rookworld_debug.grpo.phases.generation import loss_mask

from .compare import VALUE_TOL


def length_variant(recorded: torch.Tensor, ref: torch.Tensor, lengths: torch.Tensor) -> dict:
    """{"reward_length_term": (ref + c·length (+ b), the sentence)}: a shaping term in the completion's length that
    the declared reward does not have, fitted by least squares over the rows: c alone where at least 2 lengths are
    distinct, c and b where at least 3 are (k parameters fit any k points); {} with fewer than 4 finite rows."""
    ok = torch.isfinite(recorded) & torch.isfinite(ref)
    x, d = lengths.double()[ok], (recorded - ref)[ok]
    distinct = x.unique().numel()
    if int(ok.sum()) < 4 or distinct < 2:
        return {}
    if distinct >= 3:
        sol = torch.linalg.lstsq(torch.stack([x, torch.ones_like(x)], 1), d[:, None]).solution.squeeze(1)   # (2,)
        c, b = float(sol[0]), float(sol[1])
    else:                                           # one parameter: a term per token, no offset
        c, b = float((x * d).sum() / (x * x).sum()), 0.0
    fitted = ref + c * lengths.double() + b
    return {"reward_length_term": (fitted, f"the recorded rewards are the RookWorld reward {c:+.4g} per completion "
                                           f"token" + (f" {b:+.4g}" if abs(b) > 1e-6 else "") +
                                   f" (fitted over {int(ok.sum())} rows of {distinct} lengths): a length "
                                   "term the declared reward does not have (a penalty or bonus on length)")}


def kl_reward_variant(trace, recorded: torch.Tensor, ref: torch.Tensor) -> dict:
    """{"kl_in_reward": (ref − c·KL_row, the sentence)}: a KL penalty folded into the reward (PPO's token-level
    reward) while the loss keeps its own β·KL: KL_row = Σ_t (ℓ − ℓ_ref) over the row's tokens (k1, summed as
    token rewards are) or their mean, ℓ the sampler's recorded log-probs (else the policy's); c by least squares
    over the rows (one parameter), the first candidate that leaves every row within the tolerance; {} where the step
    has no reference log-probs or fewer than 4 finite rows."""
    r = trace.rollout
    if r.ref_per_token_logps is None:
        return {}
    m = loss_mask(r, trace.config).double()                                                   # (N, T)
    ok = torch.isfinite(recorded) & torch.isfinite(ref)
    if int(ok.sum()) < 4:
        return {}
    beta = float(trace.config.beta)
    for whose, lp in (("the sampler's", r.sampling_per_token_logps), ("the policy's", r.per_token_logps)):
        if lp is None:
            continue
        d = ((lp.double() - r.ref_per_token_logps.double()) * m).nan_to_num()                # (N, T)
        for how, x in (("summed over", d.sum(1)), ("averaged over", d.sum(1) / m.sum(1).clamp(min=1))):
            xx = float((x[ok] * x[ok]).sum())
            if xx <= 0:
                continue
            c = -float((x[ok] * (recorded - ref)[ok]).sum()) / xx
            fitted = ref - c * x
            if bool(((fitted - recorded)[ok].abs() <= VALUE_TOL * recorded[ok].abs().clamp(min=1)).all()):
                said = f"{c:.4g}" + (f" (= β = {beta:g})" if beta and abs(c - beta) <= 0.02 * beta else "")
                return {"kl_in_reward": (fitted, f"the recorded rewards are the RookWorld reward minus {said} × "
                                                 f"Σ(ℓ − ℓ_ref) {how} each row's tokens ({whose} log-probs against "
                                                 "the reference's): a KL penalty in the reward (PPO's token-level "
                                                 "reward) on top of the loss's own β·KL term, so the KL is "
                                                 "penalised twice; GRPO keeps it in the loss only")}
    return {}


def reward_variants(ref: torch.Tensor, g: int) -> dict:
    n, b = ref.numel(), ref.numel() // g
    out = {"reward_sign_flipped": (-ref, "the recorded rewards are the negated rewards: the step maximises the "
                                         "opposite of the task")}
    for s in (1, -1, g, -g):
        if 0 < abs(s) < n:
            out[f"reward_rows_misaligned/{s}"] = (torch.roll(ref, s), f"the recorded rewards are the right rewards "
                                                  f"shifted by {s} row(s): each completion got another row's reward")
    if b > 1:
        out["reward_rows_misaligned/stride"] = (ref.view(b, g).T.reshape(-1), "the rewards are in prompt-major "
                                                "order (stride B) while the rows are grouped: each completion got "
                                                "another row's reward")
    if n > 1:
        out["reward_rows_misaligned/reversed"] = (ref.flip(0), "the recorded rewards are the right rewards in "
                                                  "reverse row order: the reward function handed its values back "
                                                  "in another order than it was given the rows")
    if g > 1 and n % g == 0:          # a reward cached by prompt: every row of a group scored as one of its rows
        for j, which in ((0, "first"), (g - 1, "last")):
            out[f"reward_cached/{which}"] = (
                ref.view(b, g)[:, j:j + 1].expand(b, g).reshape(-1), f"each group's rows carry the reward of its "
                f"{which} row: the reward is cached by prompt (the other completions of a prompt are never scored), "
                "so the group has no spread and no signal")
    if n > 1:                         # a function that returned one number: the tensor assignment broadcast it
        for j, which in ((0, "first"), (n - 1, "last")):
            out[f"reward_ignores_completion/{which}"] = (
                ref[j:j + 1].expand(n), f"every row carries the reward of the batch's {which} row "
                f"({float(ref[j]):.6g}): the reward function returned one value for the batch and it was broadcast "
                f"to all {n} rows, so no other completion was scored and no group has a signal")
    return out
