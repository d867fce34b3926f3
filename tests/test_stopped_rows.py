"""Rows without EOS that end short of the budget: the batch stopped at its first row's EOS (every finished row ends at
the last column), named as an error where the loop declared its budget or enough distinct rows show it, a warning
where one row could be chance, nothing where the widths are the budget's."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from rookworld_debug.diagnosis.replay.stopped_rows import stopped_rows_check

EOS = 0


def _trace(ids, budget, explicit=("max_new_tokens",)):
    rollout = SimpleNamespace(completion_ids=ids)
    return SimpleNamespace(rollout=rollout, config=SimpleNamespace(max_new_tokens=budget),
                           recorded=SimpleNamespace(explicit=explicit))


def _rows(ends: list, t: int, n_open: int) -> torch.Tensor:
    """Distinct rows: one per entry of `ends` (EOS at that column), then `n_open` rows without EOS, width `t`."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (len(ends) + n_open, t), generator=g)
    for i, e in enumerate(ends):
        ids[i, e] = EOS
        ids[i, e + 1:] = EOS                   # padded with the EOS id after it, as GPT-2 loops do
    return ids


def test_a_batch_stopped_at_its_first_eos_is_named_under_a_declared_budget():
    c = stopped_rows_check(_trace(_rows([11], 12, 5), budget=160), EOS)
    assert c.status == "disagree" and c.cause == "generation_stopped_for_batch"
    assert "column 12" in c.explanation and "160" in c.explanation


def test_without_a_declared_budget_one_finished_row_is_a_warning_three_an_error():
    one = stopped_rows_check(_trace(_rows([11], 12, 5), budget=12, explicit=()), EOS)
    assert one.status == "suspect" and one.cause == "generation_stopped_for_batch"
    three = stopped_rows_check(_trace(_rows([11, 11, 11], 12, 5), budget=12, explicit=()), EOS)
    assert three.status == "disagree"


def test_healthy_widths_agree_or_say_nothing():
    # rows finished at several places, the others cut at the budget: healthy
    c = stopped_rows_check(_trace(_rows([3, 7, 9], 12, 5), budget=12), EOS)
    assert c.status == "agree"
    assert stopped_rows_check(_trace(_rows([3, 7], 12, 0), budget=160), EOS) is None     # every row finished
    assert stopped_rows_check(_trace(_rows([], 12, 4), budget=12), EOS) is None          # none finished


def test_rows_cut_short_of_a_declared_budget_elsewhere_are_cut_early():
    c = stopped_rows_check(_trace(_rows([3, 7], 12, 4), budget=160), EOS)
    assert c.status == "disagree" and c.cause == "completion_cut_early"
