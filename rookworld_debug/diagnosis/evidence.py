"""What the checks read from a `StepTrace`: masked token statistics, each with its definition and batch.

Shape legend: N rows (B prompts × G completions), T completion tokens, m_it the completion mask.
A TRL capture has no sampling-time log-probs (NaN), no step-0 invariants and no post-update evaluation:
every helper returns None where its input is missing, and a check that needs it says nothing.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from rookworld_debug.diagnosis.findings import Evidence

ROLLOUT = "sampled rollout"
LOG = "run log"


def ev(name: str, value, definition: str, batch: str = ROLLOUT, where: str = "") -> Evidence:
    v = float(value) if value is not None else math.nan
    return Evidence(name=name, value=v, definition=definition, batch=batch, where=where)


def mask(trace) -> torch.Tensor:
    return trace.rollout.completion_mask.bool()                                           # (N, T)


def first_step(trace) -> Optional[int]:
    """The step the trace is about, as TRL numbers it (a capture's global step), else None."""
    cap, rec = trace.capture, getattr(trace, "recorded", None)
    if cap is not None:
        return int(cap.global_step)
    return rec.step if rec is not None else None


def before_any_update(trace, step: Optional[int] = None) -> bool:
    """True when the policy that sampled this rollout has not been updated yet: the reference must equal it.
    run_step: no `init_policy`/warm-up, the first step of a multi-step run, and (when known) step 0; a TRL capture:
    global step 1, first batch."""
    cap = trace.capture
    if cap is not None:
        return int(cap.global_step) == 1 and int(getattr(cap, "generation_step", 1)) <= 1
    rec = getattr(trace, "recorded", None)
    if rec is not None:                 # the loop's own step number: 1 = its first update (None: no claim)
        return rec.step == 1
    c = trace.config
    if getattr(c, "init_policy", None) or getattr(c, "warmup_steps", 0) or trace.counts.get("run/step", 0):
        return False                    # started from other weights, warmed up, or a later step of a `run`
    return step in (None, 0)


def sampler_gap(trace) -> Optional[torch.Tensor]:
    """(n,) ℓ^sampler − ℓ^trainer on masked tokens (sampling-time log-prob minus the recomputed one), or None."""
    r = trace.rollout
    s = r.sampling_per_token_logps
    if s is None or s.numel() == 0:
        return None
    m = mask(trace)
    trainer = r.per_token_logps
    if getattr(trace.recorded, "iteration", 0):      # a later pass: the policy moved since sampling, π_old did not
        trainer = trace.recorded.old_per_token_logps
        if trainer is None:
            return None
    d = (s.float() - trainer.float())[m]
    if d.numel() == 0 or bool(torch.isnan(d).all()):
        return None
    return d[~torch.isnan(d)]


def ref_gap(trace) -> Optional[torch.Tensor]:
    """(n,) ℓ − ℓ^ref on masked tokens, or None without a reference."""
    r = trace.rollout
    if r.ref_per_token_logps is None:
        return None
    m = mask(trace)
    d = (r.per_token_logps.float() - r.ref_per_token_logps.float())[m]
    return d if d.numel() else None


def repeat_forward_gap(trace) -> Optional[torch.Tensor]:
    """(n,) ℓ(update's grad forward) − ℓ(rollout scoring forward) on the first optimizer step's rows: the same
    weights and tokens scored twice (on-policy first step), so any difference is a non-deterministic forward."""
    its = getattr(trace, "iterations", ()) or ()
    if not its or not its[0].updates:
        return None
    u = its[0].updates[0]
    if u.per_token_logps is None or not u.rows:
        return None
    rows = slice(*u.rows)
    m = mask(trace)[rows]
    a = u.per_token_logps.float()
    b = trace.rollout.per_token_logps.float()[rows]
    if a.shape != b.shape:
        return None
    d = (a - b)[m]
    return d if d.numel() else None


def stats(d: torch.Tensor) -> dict:
    """Mean, mean |·|, max |·|, share of positive values of a token-level difference."""
    d = d.double()
    return {"mean": float(d.mean()), "mean_abs": float(d.abs().mean()), "max_abs": float(d.abs().max()),
            "pos_share": float((d > 0).double().mean()), "n": int(d.numel())}


def position_gap(trace, gap_fn=None) -> Optional[tuple]:
    """(mean |gap| at the first completion token, mean |gap| at the later tokens) of the sampler–trainer gap."""
    r = trace.rollout
    s = r.sampling_per_token_logps
    if s is None or bool(torch.isnan(s[mask(trace)]).all()):
        return None
    m = mask(trace)
    d = (s.float() - r.per_token_logps.float()).abs().masked_fill(~m, 0.0)                # (N, T)
    first = d[:, 0][m[:, 0]]
    rest = d[:, 1:][m[:, 1:]]
    if first.numel() == 0 or rest.numel() == 0:
        return None
    return float(first.mean()), float(rest.mean())


def row_gap(trace) -> Optional[torch.Tensor]:
    """(N,) mean |ℓ^sampler − ℓ^trainer| per row over its masked tokens (NaN for empty rows)."""
    r = trace.rollout
    s = r.sampling_per_token_logps
    m = mask(trace)
    if s is None or bool(torch.isnan(s[m]).all()):
        return None
    d = (s.float() - r.per_token_logps.float()).abs().masked_fill(~m, 0.0)
    return d.sum(1) / m.sum(1).clamp(min=1)


def left_pad(trace) -> torch.Tensor:
    """(N,) left-padding of each row's prompt (P − prompt length)."""
    pm = trace.rollout.prompt_mask
    return (pm.shape[1] - pm.sum(1)).long()


def group_view(x: torch.Tensor, g: int) -> torch.Tensor:
    return x.reshape(-1, g)


def identical_rows_rewards(trace) -> tuple[int, int]:
    """(pairs of rows with the same prompt and the same completion text, how many of them got different rewards).
    The text is what the reward read: the loss mask may leave out a row the reward still scored (masked truncation
    zeroes a truncated row's mask), so in-mask ids would make different completions look alike."""
    r, rw = trace.rollout, trace.rewards.rewards
    seen: dict = {}
    pairs = differ = 0
    ids, m = r.completion_ids, r.completion_mask.bool()
    texts = list(r.completions) if len(r.completions or ()) == ids.shape[0] else None
    for i in range(ids.shape[0]):
        key = (r.prompts[i], texts[i] if texts is not None else tuple(ids[i][m[i]].tolist()))
        if key in seen:
            j = seen[key]
            pairs += 1
            a, b = float(rw[i]), float(rw[j])
            if not (math.isnan(a) and math.isnan(b)) and not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
                differ += 1
        else:
            seen[key] = i
    return pairs, differ


def entropy_at_temperature_one(trace) -> Optional[tuple]:
    """(mean token entropy of the sampling distribution, the same distribution at temperature 1), both over the
    recorded top-k alternatives (renormalised): logits/T are known up to a constant, so T·(log-probs) are the
    logits at T = 1 up to the same constant. None when no top-k was recorded."""
    r = trace.rollout
    tk = r.topk_logps
    if tk is None or tk.ndim != 3 or tk.shape[-1] < 2:
        return None
    m = mask(trace)
    t = r.temperatures.float()[:, None, None]                                              # (N, 1, 1)
    lp_t = torch.log_softmax(tk.float(), -1)                                               # (N, T, K)
    lp_1 = torch.log_softmax(tk.float() * t, -1)
    h_t = -(lp_t.exp() * lp_t).sum(-1)[m]
    h_1 = -(lp_1.exp() * lp_1).sum(-1)[m]
    if h_t.numel() == 0:
        return None
    return float(h_t.mean()), float(h_1.mean())


def step_of(trace, step: Optional[int]) -> Optional[int]:
    return step if step is not None else first_step(trace)
