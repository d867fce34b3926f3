"""Whether step k+1's sampler drew with step k's random numbers (diagnosis/replay/consecutive_draws.py): two steps
sampled by torch.multinomial from different distributions (other prompts, moved weights), with one generator
seeded again before each step (the bug) or left running (healthy). The matches at the same position are judged
against their expectation under independent draws; healthy pairs must pass seed after seed."""
from __future__ import annotations

import pytest
import torch

from rookworld_debug.diagnosis.replay.consecutive_draws import _verdict
from rookworld_debug.diagnosis.replay.records import AGREE, DISAGREE

N, T, V = 8, 96, 64


def _pair(seed: int, reseed: bool):
    """(matches (N, T), p_{k+1}(y_k) (N, T), both (N, T)): step k and k+1 drawn position by position."""
    g = torch.Generator().manual_seed(seed)
    logits_k = torch.randn(N, T, V, generator=g) * 1.5
    logits_k1 = logits_k + torch.randn(N, T, V, generator=g)           # another batch: related, not the same
    gen = torch.Generator().manual_seed(1000 + seed)
    y_k = torch.stack([torch.multinomial(logits_k[:, t].softmax(-1), 1, generator=gen).squeeze(1)
                       for t in range(T)], 1)
    if reseed:
        gen.manual_seed(1000 + seed)                                     # the same stream again
    y_k1 = torch.stack([torch.multinomial(logits_k1[:, t].softmax(-1), 1, generator=gen).squeeze(1)
                        for t in range(T)], 1)
    prob = logits_k1.softmax(-1).gather(-1, y_k[..., None]).squeeze(-1).double()
    return y_k == y_k1, prob, torch.ones(N, T, dtype=torch.bool)


@pytest.mark.parametrize("seed", range(8))
def test_independent_draws_pass(seed):
    c = _verdict(*_pair(seed, reseed=False))
    assert c.status == AGREE and not c.cause, c.explanation


def test_a_stream_seeded_again_before_each_step_is_named_with_its_counts():
    c = _verdict(*_pair(0, reseed=True))
    assert c.status == DISAGREE and c.cause == "sampling_seed_repeated", c.explanation
    params = c.fit["params"]
    assert params["matches"] > params["expected"] + 10 and params["positions"] == N * T
    assert f"{params['matches']} times in {N * T}" in c.explanation
