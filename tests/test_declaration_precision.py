"""When another precision may be tried as the explanation of a log-prob difference: rounding touches every row, so
a difference that spares half the rows at the declared precision is never absorbed by a wider tolerance."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from rookworld_debug.diagnosis.replay.compare import compare
from rookworld_debug.diagnosis.replay.declaration import confined_to_rows

TOL = 1.25e-4


def _case(rec, ours, mask):
    check = compare("scoring", "per_token_logps (N, T)", rec, ours, TOL, mask=mask, unit="token")
    return check, SimpleNamespace(rollout=SimpleNamespace(completion_mask=mask))


def test_a_difference_in_a_later_micro_batch_alone_is_not_rounding():
    g = torch.Generator().manual_seed(0)
    ours = -torch.rand(8, 30, generator=g) * 3
    mask = torch.ones(8, 30, dtype=torch.long)
    rec = ours.clone()
    rec[4:] += 0.05 * torch.randn(4, 30, generator=g)          # rows 4-7 scored at other weights
    check, trace = _case(rec, ours, mask)
    assert check.status == "disagree" and confined_to_rows(check, trace)


def test_bf16_rounding_of_every_row_may_be_tried_as_a_precision():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 30, 50, generator=g) * 3
    ids = torch.randint(0, 50, (8, 30), generator=g)
    ours = logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    rec = logits.bfloat16().float().log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    mask = torch.ones(8, 30, dtype=torch.long)
    check, trace = _case(rec, ours, mask)
    assert check.status == "disagree" and not confined_to_rows(check, trace)


def test_more_than_half_the_rows_off_is_not_confined():
    ours = -torch.ones(8, 10)
    rec = ours.clone()
    rec[:5] -= 0.01
    check, trace = _case(rec, ours, torch.ones(8, 10, dtype=torch.long))
    assert not confined_to_rows(check, trace)
