"""The project's rewards as TRL reward functions: TRL's call signature, None on the other task,
the shared cached engine pool, per-component values kept for the capture, named errors on bad input."""
from __future__ import annotations

import math

import pytest

from rookworld_debug.chess import rewards as chess_rewards
from rookworld_debug.data.loaders import load_bundled
from rookworld_debug.errors import ConfigError, DataError, FormatError
from rookworld_debug.trl.rewards import AReward, PReward, rookworld_reward_funcs, shared_engine


@pytest.fixture(scope="module")
def rows():
    train = load_bundled(split="train")
    p = [s for s in train if s.task == "P"][:2]
    a = [s for s in train if s.task == "A"][:2]
    samples = [p[0], a[0], p[1], a[1]]
    prompts = [s.prompt for s in samples]
    # a right answer, a garbled one, per task: values must differ
    completions = [p[0].completion, "garbage", "  M: e2e4", a[1].completion]
    return prompts, completions, [s.completion for s in samples]


def _trl_kwargs(labels):
    """What GRPOTrainer passes besides prompts/completions (dataset columns + its callbacks)."""
    return dict(completion_ids=[[1, 2]] * len(labels), label=labels, trainer_state=None,
                log_extra=lambda *a: None, log_metric=lambda *a: None)


def test_dataset_mode_equals_the_builtin_reward_and_none_on_the_other_task(rows):
    prompts, completions, labels = rows
    p, a = rookworld_reward_funcs("dataset")
    vp = p(prompts=prompts, completions=completions, **_trl_kwargs(labels))
    va = a(prompts=prompts, completions=completions, **_trl_kwargs(labels))
    assert [v is None for v in vp] == [False, True, False, True]
    assert [v is None for v in va] == [True, False, True, False]
    from rookworld_debug.chess.formats import parse_p
    want = chess_rewards.score_batch(prompts, completions, None,
                                     labels=[parse_p(q + c) if q.startswith("P:") else None
                                             for q, c in zip(prompts, labels)])
    total = [x if x is not None else y for x, y in zip(vp, va)]          # TRL's nansum over the two functions
    assert total == pytest.approx([b.total for b in want])
    assert total[0] == 1.0 and total[3] == 1.0 and total[1] < 0
    # the components behind each value, aligned with the rows TRL passed
    assert p.last_call.values == tuple(vp) and p.last_call.breakdowns[1] is None
    assert a.last_call.breakdowns[1].components["board"] == -1.0
    assert (p.__name__, a.__name__) == ("rookworld_p", "rookworld_a")


def test_engine_mode_uses_the_shared_cached_pool(rows):
    prompts, completions, _ = rows
    p = PReward("engine", depth=6, multipv=5, workers=1)
    assert p.engine is shared_engine(6, 5, 1)                              # one pool per settings, reused
    before = p.engine.stats
    v1 = p(prompts=prompts, completions=completions)
    mid = p.engine.stats
    v2 = PReward("engine", depth=6, multipv=5, workers=1)(prompts=prompts, completions=completions)
    after = p.engine.stats
    assert v1 == v2 and v1[1] is None and all(isinstance(x, float) and math.isfinite(x) for x in v1[::2])
    assert (after - mid).cache_misses == 0 and (after - mid).cache_hits > 0 and (mid - before).calls >= 1
    assert set(p.last_call.breakdowns[0].components) == {"best", "candidates", "eval"}


def test_bad_input_is_a_named_error(rows):
    prompts, completions, _ = rows
    with pytest.raises(ConfigError, match="'label' dataset column"):
        PReward("dataset")(prompts=prompts, completions=completions)
    with pytest.raises(FormatError, match="plain-text prompts"):
        AReward()(prompts=[[{"role": "user", "content": "A: x"}]], completions=["y"])
    with pytest.raises(DataError, match="2 prompts but 1 completions"):
        AReward()(prompts=prompts[:2], completions=completions[:1])
    with pytest.raises(ConfigError, match="reward_mode"):
        PReward("stockfish")


@pytest.mark.parametrize("fn", [lambda: AReward(), lambda: PReward("dataset")])
@pytest.mark.parametrize("bad", [None, "P: abc", 3])
def test_missing_or_scalar_batches_are_named(rows, fn, bad):
    prompts, completions, labels = rows
    with pytest.raises(DataError, match="list of strings"):
        fn()(prompts=prompts, completions=bad, **_trl_kwargs(labels))
    with pytest.raises(DataError, match="list of strings"):
        fn()(prompts=bad, completions=completions, **_trl_kwargs(labels))


def test_label_column_problems(rows):
    prompts, completions, labels = rows
    p = PReward("dataset")
    # a None label is a neutral row flagged no_label (score_batch's contract), not a crash
    v = p(prompts=prompts, completions=completions, **_trl_kwargs([None] + labels[1:]))
    assert v[0] == 0.0 and "no_label" in " ".join(p.last_call.breakdowns[0].flags)
    assert v[2] == p(prompts=prompts, completions=completions, **_trl_kwargs(labels))[2]
    # a column shorter (or longer) than the batch would drop rows in zip: refused by name
    for wrong in (labels[:2], labels + labels[:1]):
        with pytest.raises(DataError, match=r"'label' has \d+ entries for 4 prompts"):
            p(prompts=prompts, completions=completions, **_trl_kwargs(wrong))
