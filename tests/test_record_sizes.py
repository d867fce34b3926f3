"""A size the loop declares to StepRecorder that disagrees with the step it recorded is refused by name (the
keyword, the declared and the recorded number) when the trace is built or saved; the trace's config was built from
the recorded rows, so the declared number was silently dropped. The step is the record property test's (the
fuzzer's micro GPT-2, B = 2 prompts, G = 2, N = 4 rows)."""
from __future__ import annotations

import pytest
from test_record_properties import G, PROMPTS, _one_torch_thread, step  # noqa: F401 - its fixtures

from rookworld_debug.errors import DataError


def _recorded(step, prompts=PROMPTS, **declared):
    from rookworld_debug.record import StepRecorder
    rec = StepRecorder(step["tok"], **{"num_generations": G, **declared})
    for name, args in step["valid"].items():
        getattr(rec, name)(**(dict(args, prompts=prompts) if name == "batch" else args))
    return rec


@pytest.mark.parametrize("declared, prompts, match", [
    (dict(batch_size=7), PROMPTS, r"batch_size: declared 7, but the step recorded 2 prompts"),
    (dict(num_generations=4), PROMPTS, r"num_generations: declared 4, but the step recorded 2 completions per prompt"),
    (dict(num_generations=2), PROMPTS[:1], r"num_generations: declared 2, but the step recorded 4 completions per "),
    (dict(num_generations=3), PROMPTS, r"num_generations: declared 3, but the step recorded 4 rows"),
    (dict(gradient_accumulation_steps=5), PROMPTS, r"gradient_accumulation_steps: declared 5, .*5 micro-batches "
                                                   r"need at least 5 rows"),
    (dict(micro_batch_size=2), PROMPTS, r"micro_batch_size: declared 2, so 4 recorded rows make 2 micro-batches"),
    (dict(max_new_tokens=3), PROMPTS, r"max_new_tokens: declared 3, but the step recorded a completion of \d+ tokens"),
])
def test_a_declared_size_the_step_disagrees_with_is_refused_by_name(step, tmp_path, declared, prompts, match):
    rec = _recorded(step, prompts=prompts, **declared)
    with pytest.raises(DataError, match=match):
        rec.build()
    with pytest.raises(DataError, match=match):
        rec.save(tmp_path / "step")
    assert not (tmp_path / "step").exists()


def test_declared_sizes_that_agree_are_kept(step):
    """batch_size, G and the micro-batches as recorded; max_new_tokens the loop's budget, not the row width."""
    longest = int(step["valid"]["rollout"]["completion_mask"].bool().any(0).nonzero().max()) + 1
    trace = _recorded(step, batch_size=2, gradient_accumulation_steps=2, max_new_tokens=64).build()
    assert (trace.config.batch_size, trace.config.num_generations) == (2, G)
    assert trace.recorded.gradient_accumulation_steps == 2
    assert trace.config.max_new_tokens == 64 and longest < 64
    assert _recorded(step).build().config.max_new_tokens == step["valid"]["rollout"]["completion_ids"].shape[1]
    assert _recorded(step, max_new_tokens=longest).build().config.max_new_tokens == longest
    # 4 rows in micro-batches of ⌈4/3⌉ = 2 rows, each loss ÷ 3: what a loop chunking its rows computes
    assert _recorded(step, gradient_accumulation_steps=3).build().recorded.gradient_accumulation_steps == 3
