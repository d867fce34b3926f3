"""The rookworld-rlvr mini's scorer, group helpers and baselines on bad input: lengths that do not match, empty
batches, group sizes < 1, pitfalls nested in a list (also through `step --set`, as a user runs it), and a learned
baseline whose values hold a NaN (filled with the valid mean, as documented, not zeroing the group)."""
from __future__ import annotations

import math

import pytest
import torch
from cli import run_cli

from rookworld_debug.errors import ConfigError, DataError

P = "P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 "


def test_the_scorer_refuses_rows_that_do_not_pair_up():
    from rookworld_debug.chess import rlvr_rewards as R
    with pytest.raises(DataError, match="2 prompts, 1 completions"):
        R.score_batch([P, P], ["M: e2e4"])
    with pytest.raises(DataError, match="1 ground truths"):
        R.score_breakdowns([P, P], ["M: e2e4", "M: d2d4"], ["M: e2e4"])
    assert len(R.score_breakdowns([P, P], ["M: e2e4", "x"], None)) == 2          # every row scored


@pytest.mark.parametrize("labels", [(), ("M: e2e4",)])
def test_rlvr_gt_without_a_label_per_row_is_a_named_error(labels):
    from rookworld_debug.grpo.phases.rewards import compute_rewards
    with pytest.raises(DataError, match="rlvr_gt"):
        compute_rewards([P, P], ["M: e2e4", "x"], ["P", "P"], labels=labels, reward_mode="rlvr_gt")


@pytest.mark.parametrize("call, error, words", [
    (lambda R, B: R.group_advantages([], 4), DataError, "no rewards"),
    (lambda R, B: R.group_advantages([1.0, 2.0], -1), ConfigError, "group_size"),
    (lambda R, B: R.group_advantages([1.0, 2.0], 0), ConfigError, "group_size"),
    (lambda R, B: B.compute_advantages(torch.tensor([1.0, 2.0]), 0), ConfigError, "group_size"),
    (lambda R, B: B.compute_advantages(torch.tensor([1.0, 2.0]), -2), ConfigError, "group_size"),
    (lambda R, B: B.compute_advantages(torch.tensor([]), 2), DataError, "non-empty"),
    (lambda R, B: B.compute_advantages(torch.tensor([1.0, 2.0]), 2, "learned", values=torch.zeros(3)), DataError,
     "one value per reward"),
])
def test_empty_and_degenerate_groups_are_named(call, error, words):
    from rookworld_debug.chess import rlvr_rewards as R
    from rookworld_debug.grpo.families.rlvr_mini import baselines as B
    with pytest.raises(error, match=words):
        call(R, B)


def test_rlvr_advantages_refuse_an_empty_batch_and_mismatched_values():
    from rookworld_debug.grpo.families.rlvr_mini.advantages import rlvr_advantages
    with pytest.raises(DataError):
        rlvr_advantages([], 2)
    with pytest.raises(DataError, match="values"):
        rlvr_advantages([1.0, 0.0], 2, baseline_type="learned", values=torch.zeros(4))


def test_a_nan_reward_with_the_learned_baseline_is_filled_with_the_valid_mean():
    """Group 0 holds one NaN: its baseline is the mean of values whose NaN is the batch's valid mean, the
    batch is normalised, the NaN row gets 0 and the group's other rows keep their signal."""
    from rookworld_debug.grpo.families.rlvr_mini.advantages import rlvr_advantages
    from rookworld_debug.grpo.families.rlvr_mini.baselines import compute_advantages
    r = torch.tensor([1.0, 0.0, math.nan, 0.5, 0.2, 0.9, 0.1, 0.3], dtype=torch.float64)
    got = rlvr_advantages(r, 4, baseline_type="learned", values=r.clone()).advantages
    fill = float(r[~torch.isnan(r)].mean())
    filled = torch.where(torch.isnan(r), torch.tensor(fill, dtype=torch.float64), r)
    want = compute_advantages(filled, 4, "learned", values=filled.clone())                 # the mini on filled data
    want[2] = 0.0
    assert torch.allclose(got, want, atol=1e-12), (got, want)
    assert float(got[:4].abs().sum()) > 1.0 and got[2] == 0.0


def test_pitfalls_nested_in_a_list_are_a_config_error():
    from rookworld_debug.config import StepConfig
    for v in ([["prompt_mask_left_pad"]], [{"a": 1}], [1]):
        with pytest.raises(ConfigError, match="rlvr_pitfalls"):
            StepConfig().replace(rlvr_pitfalls=v)
        with pytest.raises(ConfigError, match="rlvr_pitfalls"):
            StepConfig.from_dict({"rlvr_pitfalls": v})


def test_step_set_with_nested_pitfalls_is_one_named_line(tmp_path):
    r = run_cli("step", "--set", 'rlvr_pitfalls=[["prompt_mask_left_pad"]]', "--set", "loss_type=rlvr_mini",
                "--out", tmp_path / "o", timeout=120)
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(err) == 1 and "rlvr_pitfalls" in err[0] and "Traceback" not in r.stderr, \
        r.stderr[-1500:]
