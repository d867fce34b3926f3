"""Bad input gets a named error or a flag, never a bare exception or a silently dropped record.

Loaders (file:line:why, BOM, skip only on request and flagged), batch selection (prompt_indices, mixed),
context length and devices (checked before generation / before the model loads), ASCII-strict formats,
degenerate labels.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from rookworld_debug.chess import rewards as R
from rookworld_debug.chess.formats import PSample, parse_a, parse_number, parse_p, parse_p_completion
from rookworld_debug.config import StepConfig
from rookworld_debug.data import loaders
from tinymodels import tiny_step_config
from rookworld_debug.errors import ConfigError, DataError, FormatError

P_LINE = ("P: rnbqkbnr/ppp1pppp/8/3p4/8/P7/1PPPPPPP/RNBQKBNR w KQkq - 0 2                               "
          "M: d2d4 g2g3 e2e3 g1f3 c2c4      E: 0.03 -0.3 -0.16 0.0 0.01                B: d2d4")
A_LINE = ("A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
          "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0")


def _jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# ------------------------------------------------------------------------------------------ loaders
@pytest.mark.parametrize("bad", [5, "just a string", [P_LINE], None, True])
def test_jsonl_record_that_is_not_an_object_is_a_named_error(tmp_path, bad):
    f = _jsonl(tmp_path / "d.jsonl", [{"text": P_LINE}, {"text": A_LINE}, json.dumps(bad)])
    with pytest.raises(DataError, match=r"d\.jsonl:3: JSONL record must be an object"):
        loaders.load_file(f)


@pytest.mark.parametrize("text", [5, None, 1.5, ["P:"], {"a": 1}])
def test_jsonl_text_that_is_not_a_string_is_a_named_error(tmp_path, text):
    f = _jsonl(tmp_path / "d.jsonl", [{"text": P_LINE}, {"text": text}])
    with pytest.raises(DataError, match=r"d\.jsonl:2: malformed sample: sample text must be a string"):
        loaders.load_file(f)
    with pytest.raises(DataError, match=r"d\.jsonl:2: .*'split' must be a string"):
        loaders.load_file(_jsonl(tmp_path / "d.jsonl", [{"text": P_LINE}, {"text": A_LINE, "split": 3}]))


def test_non_ascii_or_lone_surrogate_text_is_a_named_error(tmp_path):
    f = _jsonl(tmp_path / "s.jsonl", [{"text": P_LINE}, '{"text": "' + A_LINE[:20] + '\\ud800"}'])
    with pytest.raises(DataError, match=r"s\.jsonl:2: malformed sample: non-ASCII character U\+D800"):
        loaders.load_file(f)


def test_non_utf8_file_and_directory_are_named_errors(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes((P_LINE + "\n" + A_LINE + "\nP: caf\xe9\n").encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.txt:3: not UTF-8"):
        loaders.load_file(f)
    with pytest.raises(DataError, match="directory"):
        loaders.load_file(tmp_path)


def test_utf8_bom_is_accepted_in_jsonl_and_txt(tmp_path):
    bom = "\ufeff"
    j = tmp_path / "bom.jsonl"
    j.write_text(bom + json.dumps({"text": P_LINE}) + "\n" + json.dumps({"text": A_LINE}) + "\n", encoding="utf-8")
    t = tmp_path / "bom.txt"
    t.write_text(bom + P_LINE + "\n" + A_LINE + "\n", encoding="utf-8")
    for f in (j, t):
        samples, rep = loaders.load_file(f, with_report=True)
        assert [s.task for s in samples] == ["P", "A"] and rep.skipped == 0     # the first sample is kept
        assert samples[0].text == P_LINE


def test_malformed_line_is_an_error_naming_file_and_1_based_line_counting_blanks(tmp_path):
    f = tmp_path / "data.txt"
    f.write_text(f"{P_LINE}\n\n{A_LINE}\nP: not a position M: x E: y B: z\n")
    with pytest.raises(DataError) as e:
        loaders.load_file(f)
    assert f"{f}:4: malformed sample" in str(e.value) and "on_bad_sample='skip'" in str(e.value)
    j = _jsonl(tmp_path / "data.jsonl", [{"text": P_LINE}, {"text": "hello"}])
    with pytest.raises(DataError, match=r"data\.jsonl:2: malformed sample"):
        loaders.load_file(j)


def test_skipping_is_opt_in_and_every_skip_is_reported(tmp_path):
    f = tmp_path / "data.txt"
    f.write_text(f"{P_LINE}\nbad one\n\n{A_LINE}\nbad two\n")
    samples, rep = loaders.load_file(f, with_report=True, on_bad_sample="skip")
    assert len(samples) == 2 and rep.skipped == 2
    assert [n.split(": ")[0] for n in rep.notes] == [f"skipped {f}:2", f"skipped {f}:5"]
    with pytest.raises(ConfigError, match="on_bad_sample"):
        loaders.load_file(f, on_bad_sample="ignore")
    with pytest.raises(ConfigError, match="on_bad_sample"):
        StepConfig(on_bad_sample="drop")


def _dataset_file(tmp_path):
    lines = [x.text for x in loaders.load_bundled(split="train")[:12]]
    lines.insert(3, "P: this line is broken")
    return tmp_path / "nine.txt", lines


def test_run_step_refuses_a_file_with_a_bad_line_and_flags_skips_when_asked(tmp_path, tiny_byte_model_dir):
    """The old loader went on with 8 of 9 samples and no flag. Now: DataError by default; with
    on_bad_sample='skip' the step runs and the skip is in StepTrace.flags and in the step log (a view)."""
    from rookworld_debug.grpo.step import run_step
    from rookworld_debug.steplog import format_step_log

    f, lines = _dataset_file(tmp_path)
    f.write_text("\n".join(lines) + "\n")
    cfg = tiny_step_config(tiny_byte_model_dir, dataset=str(f), top_k_alternatives=0)
    with pytest.raises(DataError, match=r"nine\.txt:4: malformed"):
        run_step(cfg)
    trace = run_step(cfg.replace(on_bad_sample="skip"))
    flags = " | ".join(trace.flags)
    assert "1 malformed dataset record(s) skipped" in flags and f"{f}:4" in flags
    assert f"{f}:4" in format_step_log(trace)


# ---------------------------------------------------------------------------------- batch selection
def test_duplicate_and_mismatched_prompt_indices_are_config_errors():
    samples = loaders.load_bundled(split="train")
    with pytest.raises(ConfigError) as e:
        StepConfig(prompt_indices=(3, 3), batch_size=2)
    assert e.value.field == "prompt_indices" and "distinct" in str(e.value)
    for kw in (dict(batch_size=4, indices=[0, 1]), dict(batch_size=2, indices=[5, 5]), dict(indices=[])):
        with pytest.raises(ConfigError) as e:
            loaders.select_batch(samples, task="P", **kw)
        assert e.value.field == "prompt_indices"
    with pytest.raises(ConfigError) as e:
        loaders.select_batch(samples, task="P", batch_size=2, indices=[0, len(samples) + 7])
    assert e.value.field == "prompt_indices" and f"0..{len(samples) - 1}" in str(e.value)
    p = [i for i, s in enumerate(samples) if s.task == "P"][:2]
    assert loaders.select_batch(samples, task="P", batch_size=2, indices=p).indices == tuple(p)
    assert loaders.select_batch(samples, task="P", indices=p).indices == tuple(p)   # size from the list


def test_prompt_indices_none_is_the_documented_seeded_draw():
    help_ = StepConfig.glossary()["prompt_indices"]["help"]
    assert "file order" not in help_ and "random.Random(seed)" in help_
    samples = loaders.load_bundled(split="train")
    cand = [i for i, s in enumerate(samples) if s.task == "P"]
    for seed in (0, 1, 7):
        b = loaders.select_batch(samples, task="P", batch_size=4, seed=seed)
        assert b.indices == tuple(random.Random(seed).sample(cand, 4))


def test_mixed_batches_contain_both_tasks_alternating():
    samples = loaders.load_bundled(split="train")
    assert "alternating" in StepConfig.glossary()["task"]["help"]
    for seed in range(12):
        for b_size in (2, 3, 4, 5):
            b = loaders.select_batch(samples, task="mixed", batch_size=b_size, seed=seed)
            assert b.tasks == tuple("PA"[i % 2] for i in range(b_size)), (seed, b_size, b.tasks)
    with pytest.raises(ConfigError, match="both tasks"):
        loaders.select_batch(samples, task="mixed", batch_size=1)
    with pytest.raises(ConfigError, match="both tasks"):
        StepConfig(task="mixed", batch_size=1)


# ------------------------------------------------------------------------------- context and devices
@pytest.fixture
def no_generation(monkeypatch):
    """Generation must never start when the config cannot fit the context."""
    import rookworld_debug.grpo.phases.evaluation as ev
    import rookworld_debug.grpo.phases.shared as phases
    import rookworld_debug.grpo.step as step

    def refuse(*a, **k):
        raise AssertionError("generation started before the context check")

    monkeypatch.setattr(phases, "generate_with_greedy", refuse)      # where the step samples
    monkeypatch.setattr(step, "greedy_evals", refuse)
    monkeypatch.setattr(ev, "greedy_completions", refuse)


def _ctx(model_dir) -> int:
    return json.loads((model_dir / "config.json").read_text())["n_positions"]


@pytest.mark.parametrize("field,extra", [("max_new_tokens", 0), ("max_new_tokens", -10),
                                         ("eval_max_new_tokens", 50)])
def test_token_limits_past_the_context_are_config_errors_before_generation(tiny_byte_model_dir, no_generation,
                                                                          field, extra):
    """n_positions alone (0), n_positions − 10 (fits alone, not after the prompt), n_positions + 50."""
    from rookworld_debug.grpo.step import run_step

    ctx = _ctx(tiny_byte_model_dir)
    cfg = tiny_step_config(tiny_byte_model_dir, heldout_n=2).replace(**{field: ctx + extra})
    with pytest.raises(ConfigError) as e:
        run_step(cfg)
    assert e.value.field == field and f"n_positions={ctx}" in str(e.value)


def test_inject_too_long_or_invalid_text_is_a_config_error(tiny_byte_model_dir, no_generation):
    from rookworld_debug.grpo.step import run_step

    cfg = tiny_step_config(tiny_byte_model_dir)
    ctx = _ctx(tiny_byte_model_dir)
    for inject, why in (({0: " x" * ctx}, f"n_positions={ctx}"), ({1: "M: e2e4 \ud800"}, "Unicode"),
                        ({0: 5}, "string"), ({9: "M: e2e4"}, "row 9")):
        with pytest.raises(ConfigError, match=why) as e:
            run_step(cfg, inject=inject)
        assert e.value.field == "inject"


def test_unavailable_or_invalid_device_is_a_config_error_before_any_model_loads(monkeypatch):
    import rookworld_debug.models as models
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.models.devices import check_device

    def must_not_load(*a, **k):
        raise AssertionError("the model was loaded before the device check")

    monkeypatch.setattr(models, "load_policy_and_reference", must_not_load)
    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ConfigError) as e:
        setup(StepConfig(device=missing, reward_mode="dataset"))
    assert e.value.field == "device" and "requested but" in str(e.value)
    for bad in ("gpu0", "cuda:x", "tpu"):
        with pytest.raises(ConfigError) as e:
            check_device(bad)
        assert e.value.field == "device"
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="device"):
        models.load_policy_and_reference("tiny", device="gpu0")
    assert check_device("cpu") == torch.device("cpu")


# ---------------------------------------------------------------------------------- ASCII formats
def test_numbers_are_ascii_only():
    for s in ("١٢.٥", "１２", "1２", "٣", "12.5\u200b"):
        assert parse_number(s) is None, s
    assert parse_number("12.5") == 12.5 and parse_number("-0.3") == -0.3


def test_non_ascii_digits_or_separators_make_a_completion_malformed_and_flagged():
    label = parse_p(P_LINE)
    completion = P_LINE[P_LINE.index("M:"):]
    assert R.score_p_dataset(completion, label).total == 1.0
    fullwidth = completion.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
    ideographic = completion.replace(" ", "\u3000")
    for bad in (fullwidth, ideographic):
        b = R.score_p_dataset(bad, label)
        assert not b.format_ok and any("non-ASCII" in f for f in b.flags), b.flags
        assert b.total < 1.0
        assert not parse_p_completion(bad).ok
    with pytest.raises(FormatError, match="non-ASCII"):
        parse_p(P_LINE.replace("0.03", "０.03"))
    with pytest.raises(FormatError, match="non-ASCII"):
        parse_a(A_LINE.replace("+0.001", "+０.001"))
    a_prompt, a_completion = A_LINE.rsplit("+", 4)[0] + "+", "+".join(A_LINE.rsplit("+", 4)[1:])
    b = R.score_a(a_prompt, a_completion.replace("0.001", "０.００１"))
    assert not b.format_ok and any("non-ASCII" in f for f in b.flags)


def test_degenerate_labels_give_a_flagged_row_not_an_exception():
    label = parse_p(P_LINE)
    completion = P_LINE[P_LINE.index("M:"):]
    for bad in (PSample(label.fen, (), (), label.best), PSample(label.fen, label.moves, ("x",) * 5, label.best),
                PSample(label.fen, label.moves, label.evals[:2], label.best),
                PSample(label.fen, label.moves, label.evals, "")):
        b = R.score_p_dataset(completion, bad)
        assert b.flags == ("bad_prompt",) and b.total == 0.0 and "label" in b.details["error"]


# ------------------------------------------------------------------------------------ lost trace
def test_numerical_fault_after_the_update_still_returns_the_trace_with_the_flag(tiny_byte_model_dir):
    """lr=1e12 wrecks the weights: the post-update greedy evaluation meets NaN logits. The step used to raise
    NumericalError and lose the trace with every flag explaining it; now the trace comes back flagged."""
    from rookworld_debug.grpo.step import run_step
    from rookworld_debug.steplog import format_step_log

    cfg = tiny_step_config(tiny_byte_model_dir, lr=1e12, max_grad_norm=None, task="A", num_generations=4,
                           max_new_tokens=24, eval_max_new_tokens=24, top_k_alternatives=0)
    # the label and garbage in group 0: rewards differ whatever the model samples → a non-zero gradient
    label = loaders.select_batch(loaders.load_bundled(split="train"), task="A", batch_size=2, seed=0).completions[0]
    trace = run_step(cfg, inject={0: label, 1: "zz"})
    assert trace.update is not None and trace.evaluation is None
    fault = [f for f in trace.flags if f.startswith("post-update evaluation failed")]
    assert fault and "NaN" in fault[0]
    assert "post-update evaluation failed" in format_step_log(trace)
