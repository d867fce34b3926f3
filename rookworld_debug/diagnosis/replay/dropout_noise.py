"""Dropout left on in a scoring forward: recorded log-probs that differ from the eval-mode recompute as a
train-mode forward's do.

Dropout makes a forward random, so no recompute reproduces its values; what it does reproduce is their
DISTRIBUTION. Two train-mode forwards of the same weights (dropout at the model's own rate, and at GPT-2's 0.1,
which a model's config carries unless set otherwise) give the size and the mean of the gap that dropout opens to
the eval-mode log-probs; recorded values whose gap has that size and mean, where no deterministic mechanism
reproduces them, were made with dropout on (a model left in train mode: a reference deep-copied from a policy in
training, or model.train() before scoring).
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from .records import DISAGREE, PhaseCheck

GPT2_DROPOUT = 0.1        # the rate GPT-2's config (and most HF configs) carry
DRAWS = 2                 # train-mode forwards per rate: their own spread says how far a draw wanders
SIZE_RATIO = (0.7, 1.4)   # the recorded gap's RMS over the draws' RMS: inside, it is dropout's size
MEAN_SHARE = 0.25         # |mean gap − the draws' mean gap| at most this share of their RMS


@contextmanager
def _train_mode(model, rate: float):
    """`model` in train mode with every dropout at `rate`; its modes and rates restored after."""
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    rates, mode = [m.p for m in drops], model.training
    try:
        for m in drops:
            m.p = rate
        model.train()
        yield
    finally:
        for m, p in zip(drops, rates):
            m.p = p
        model.train(mode)


@torch.no_grad()
def _draw(model, r, rate: float, seed: int) -> torch.Tensor:
    from rookworld_debug.grpo.phases.scoring import per_token_logps_and_entropy
    with _train_mode(model, rate), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return per_token_logps_and_entropy(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                           r.temperatures)[0]


def dropout_noise(check: PhaseCheck, recorded: torch.Tensor, ours: torch.Tensor, model, r, mask) -> PhaseCheck:
    """`check` with the cause dropout_active where the recorded gap to the eval-mode recompute `ours` has the size
    and mean of a train-mode forward's (module doc); unchanged otherwise (an agreement, a named cause, a model
    without dropout modules)."""
    if check.status != DISAGREE or check.cause or model is None or \
            not any(isinstance(m, torch.nn.Dropout) for m in model.modules()):
        return check
    m = mask.bool()
    gap = (recorded.double() - ours.double())[m]
    rates = sorted({float(x.p) for x in model.modules() if isinstance(x, torch.nn.Dropout) and x.p > 0} |
                   {GPT2_DROPOUT})
    for rate in rates:
        draws = [(_draw(model, r, rate, seed).double() - ours.double())[m] for seed in range(DRAWS)]
        rms = [float(d.pow(2).mean().sqrt()) for d in draws]
        size, mean = sum(rms) / DRAWS, sum(float(d.mean()) for d in draws) / DRAWS
        ratio = float(gap.pow(2).mean().sqrt()) / size if size > 0 else float("inf")
        if SIZE_RATIO[0] <= ratio <= SIZE_RATIO[1] and abs(float(gap.mean()) - mean) <= MEAN_SHARE * size:
            why = (f"the recorded values differ from the eval-mode forward as a train-mode forward's do: RMS "
                   f"{float(gap.pow(2).mean().sqrt()):.3g} and mean {float(gap.mean()):.3g} nats over {int(m.sum())} "
                   f"tokens, where {DRAWS} forwards with dropout {rate:g} on give RMS "
                   + " and ".join(f"{x:.3g}" for x in rms) + f", mean {mean:.3g}: dropout was on in this forward "
                   "(the model in train mode), so its log-probs are random draws, not the model's")
            return dataclasses.replace(check, cause="dropout_active", explanation=why,
                                       fit={"kind": "dropout", "params": {"rate": rate, "rms_ratio": ratio,
                                                                          "draw_rms": rms, "draw_mean": mean},
                                            "residual": None})
    return check
