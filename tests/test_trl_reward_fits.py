"""A reward function the replay cannot call (the loop's own, by name in a file) is still checked where the project's
RookWorld reward reproduces its values: on the right rows it agrees, on other rows (reversed, shifted) the
misalignment is the finding, at another scale no claim. Between consecutive captures, step k+1's rewards equal to
step k's row for row on other completions are the previous batch's (a reward one batch late)."""
from __future__ import annotations

import dataclasses

import pytest

from rookworld_debug.diagnosis.replay.consecutive import rewards_check as carried
from rookworld_debug.diagnosis.replay.data_phases import rewards_check
from rookworld_debug.grpo.step import StepTrace


@pytest.fixture(scope="module")
def steps(trl_checkpointed_run):
    return tuple(StepTrace.load(trl_checkpointed_run / "captures" / f"step-00000{k}") for k in (2, 3))


def _rewards(trace, values=None, names=None):
    rw = trace.rewards
    return dataclasses.replace(trace, rewards=dataclasses.replace(
        rw, rewards=rw.rewards if values is None else values, func_names=rw.func_names if names is None else names))


def _labels(trace):
    return [x for x in trace.setup.batch.completions for _ in range(trace.rollout.num_generations)]


def test_a_reward_of_the_loop_s_own_is_checked_against_the_rookworld_candidate(steps):
    t = steps[0]
    assert t.rewards.rewards.unique().numel() >= 3                    # else no permutation is evidence
    own = _rewards(t, names=("my_reward",))
    assert rewards_check(own, _labels(t)).status == "agree"
    reversed_ = rewards_check(_rewards(own, own.rewards.rewards.flip(0)), _labels(t))
    assert reversed_.status == "disagree" and reversed_.cause == "reward_rows_misaligned", reversed_
    assert "reverse row order" in reversed_.explanation
    # another scale or formula is the loop's own business: no claim
    assert rewards_check(_rewards(own, own.rewards.rewards * 0.5), _labels(t)).status == "not replayed"


def test_rewards_one_batch_late_are_named_between_consecutive_captures(steps):
    t2, t3 = steps
    assert carried(t2, t3).cause != "rewards_other_batch"
    late = carried(t2, _rewards(t3, t2.rewards.rewards.clone()))
    assert late.status == "disagree" and late.cause == "rewards_other_batch", late
    # the same completions again (a later pass over one rollout) carry the same rewards by right
    assert carried(t2, dataclasses.replace(t2)).cause != "rewards_other_batch"


def test_captures_one_batch_late_are_named_from_the_folder_s_captures(steps):
    from rookworld_debug.diagnosis.checks_run_invariants import check_captured_rewards
    t2, t3 = steps
    assert check_captured_rewards({2: t2, 3: t3}) == []
    # a reward function that scores the previous call's completions: step 3's values are step 2's rows' rewards
    late = check_captured_rewards({2: t2, 3: _rewards(t3, t2.rewards.rewards.clone(), names=("lagged",))})
    assert [f.code for f in late] == ["rewards_other_batch"] and late[0].step == 3 and late[0].severity == "error"
    assert "step 2's recorded rewards" in late[0].cause
