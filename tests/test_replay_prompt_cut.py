"""The prompt-cut fit on its own: the cut length is found from which rows disagree, and a pattern no cut makes
(a longer prompt agreeing where a shorter one does not) is left unexplained."""
from __future__ import annotations

import torch

from rookworld_debug.diagnosis.replay.prompt_cut import prompt_cut
from rookworld_debug.diagnosis.replay.records import PhaseCheck

TOL = 1e-4
LENGTHS = torch.tensor([63, 63, 55, 55, 40, 40])


def _setup(k_true: int):
    g = torch.Generator().manual_seed(0)
    ours = -torch.rand(6, 10, generator=g)
    shift = torch.rand(6, 10, generator=g) * 0.1 + 0.01

    def logps_cut(k):                       # a row's values change exactly when its prompt is longer than k
        return ours + shift * (LENGTHS > k).double()[:, None] * (1 + 0.01 * k)
    p_mask = (torch.arange(70)[None] >= 70 - LENGTHS[:, None]).long()       # left-padded
    rec = logps_cut(k_true)
    check = PhaseCheck("scoring", "per_token_logps (N, T)", "disagree", float((rec - ours).abs().max()), TOL)
    return check, rec, ours, logps_cut, p_mask


def test_a_cut_below_every_prompt_is_found_among_the_round_lengths():
    check, rec, ours, cut, p_mask = _setup(48)
    got = prompt_cut(check, rec, ours, torch.ones(6, 10), cut, p_mask)
    assert got.cause == "prompt_tokens_differ" and got.fit["params"]["keep_last"] == 48


def test_a_cut_between_lengths_is_read_from_the_rows_that_agree():
    check, rec, ours, cut, p_mask = _setup(57)
    got = prompt_cut(check, rec, ours, torch.ones(6, 10), cut, p_mask)
    assert got.fit["params"]["keep_last"] == 57 and "last 57 tokens" in got.explanation


def test_a_longer_prompt_agreeing_where_a_shorter_one_does_not_is_no_cut():
    check, rec, ours, cut, p_mask = _setup(48)
    rec = rec.clone()
    rec[0] = ours[0]                        # a 63-token row agrees while 55-token rows do not
    assert prompt_cut(check, rec, ours, torch.ones(6, 10), cut, p_mask) is check
