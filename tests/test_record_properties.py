"""The record API's calls under generated arguments: only the project's named errors escape.

One real GRPO step of the fuzzer's micro GPT-2 (tests/test_step_folder_fuzz.py) gives every call of StepRecorder a
valid argument; each generated example makes the loop's calls in order (some left out), each argument replaced
with some probability by a generated one (tensors of other shapes, dtypes, values — NaN, ±inf, ids past the
vocabulary — or on the meta device, which holds no data; None; other types; models on the meta device, without a
config, of another shape), a keyword of the constructor sometimes so too, and ends in build() or save(). Whatever
a call raises must be a RookWorldError (the classes of rookworld_debug/errors.py). ≥ 2,000 calls in the default
run (counted in the terminal summary); 20,000 in the slow one."""
from __future__ import annotations

import copy
import math
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_step_folder_fuzz import BETA, G, LABELS, PROMPTS, _logps, _one_torch_thread, _rollout  # noqa: F401

from rookworld_debug.errors import DataError, RookWorldError

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8,
          torch.bool, torch.complex64)
VALUES = (0.0, 1.0, -1.0, 0.5, 256.0, 257.0, 1e30, -1e30, math.nan, math.inf, -math.inf)


class _Junk:
    """An object no call expects."""


# ------------------------------------------------------------------------------------------ the valid step
@pytest.fixture(scope="module")
def step():
    """The fuzzer's micro model, reference, optimizer (with moments) and one step's valid arguments per call."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from tinymodels import embedded_tokenizer
    tok = embedded_tokenizer()
    eos = tok.eos_token_id
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64, vocab_size=len(tok),
                                           bos_token_id=eos, eos_token_id=eos)).eval()
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    p_ids, p_mask, ids, mask, texts, r, adv = _rollout(tok)
    with torch.no_grad():
        ref_lp = _logps(ref, p_ids, p_mask, ids, mask)
    lp = _logps(model, p_ids, p_mask, ids, mask)
    loss = -(lp * adv[:, None]).sum() / ids.shape[0]
    loss.backward()
    opt.step()                                          # moments in the optimizer's state
    lp = _logps(model, p_ids, p_mask, ids, mask)
    (-(lp * adv[:, None]).sum() / ids.shape[0]).backward()
    valid = {
        "batch": dict(prompts=PROMPTS, labels=LABELS),
        "sampler": dict(model=model),
        "model_before": dict(model=model, optimizer=opt, reference=ref),
        "rollout": dict(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=ids, completion_mask=mask,
                        completions=texts, sampling_logps=lp.detach()),
        "rewards": dict(rewards=r, per_func={"rookworld": r}),
        "advantages": dict(advantages=adv),
        "logprobs": dict(per_token_logps=lp.detach(), old=lp.detach(), ref=ref_lp, training=False),
        "loss": dict(loss=loss.detach(), per_token_loss=(lp * mask).detach()),
        "gradient": dict(model=model),
        "model_after": dict(model=model),
    }
    return dict(tok=tok, model=model, valid=valid)


# ------------------------------------------------------------------------------------------ generated arguments
def _tensor(draw, like):
    """A tensor unlike `like`: another dtype, another shape, other values, or on the meta device."""
    op = draw(st.integers(0, 4))
    base = like if torch.is_tensor(like) else torch.zeros(4, 3)
    if op == 0:
        return base.to(draw(st.sampled_from(DTYPES)))
    if op == 1:
        return base.to("meta")
    shape = draw(st.lists(st.integers(0, 5), max_size=3)) if op == 2 else list(base.shape)
    value = draw(st.sampled_from(VALUES))
    t = torch.full(shape, value) if op != 4 else base.double().clone()
    if op == 4 and t.numel():
        t.view(-1)[draw(st.integers(0, t.numel() - 1))] = value
    return t.to(draw(st.sampled_from(DTYPES[:4]))) if op == 3 else t


def _model(draw, step):
    m = step["model"]
    op = draw(st.integers(0, 5))
    if op == 0:
        return copy.deepcopy(m).to("meta")                       # a model built on the meta device: no data
    if op == 1:
        bad = copy.deepcopy(m)
        bad.transformer.ln_f.bias = torch.nn.Parameter(torch.empty(16, device="meta"))   # one parameter without data
        return bad
    if op == 2:
        return torch.nn.Linear(2, 2)                              # no .config
    if op == 3:
        return copy.deepcopy(m).half()
    if op == 4:
        bad = copy.deepcopy(m)
        for p in bad.parameters():          # gradients of NaN, or none
            p.grad = torch.full_like(p, math.nan) if draw(st.booleans()) else None
        return bad
    return draw(_other())


def _other():
    return st.sampled_from([None, 0, 1.5, True, "x", b"x", [], [1, "a"], {"a": 1}, _Junk(), math.nan, (None,)])


def _value(draw, name: str, valid, step):
    """A generated argument for parameter `name` whose valid value is `valid`."""
    if name in ("model", "reference"):
        return _model(draw, step)
    if name == "optimizer":
        m = copy.deepcopy(step["model"])
        return draw(st.sampled_from([_Junk(), "adamw", torch.optim.SGD(m.parameters(), lr=0.1),
                                     torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()), None]))
    if name in ("prompts", "labels", "completions"):
        return draw(st.one_of(_other(), st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none()),
                                                 max_size=6), st.text(max_size=8)))
    if name == "per_func":
        col = _tensor(draw, valid["rookworld"])
        return draw(st.sampled_from([{"rookworld": col}, {1: col}, {"a": None}, [col], col, "x", {"a": "b"}]))
    if name == "training":
        return draw(st.one_of(_other(), st.just(torch.tensor([1.0, 0.0]))))
    op = draw(st.integers(0, 4))
    if op < 3:
        return _tensor(draw, valid)
    return draw(_other()) if op == 3 else valid.tolist() if torch.is_tensor(valid) else valid


KEYWORDS = {"num_generations": [G, 0, 3, 2.5, "2", None], "batch_size": [2, 7, 0, "x"],
            "gradient_accumulation_steps": [1, 2, 3, 5, 0], "max_new_tokens": [64, 1, 3, 0, -1]}


# ------------------------------------------------------------------------------------------ the property
CALLS = ("batch", "sampler", "model_before", "rollout", "rewards", "advantages", "logprobs", "loss", "gradient",
         "model_after")


def _example(data, step, out: Path, counter: dict) -> None:
    from rookworld_debug.record import StepRecorder
    p = data.draw(st.sampled_from([0.0, 0.1, 0.3]), label="p")      # each argument replaced with probability p
    kw = dict(trainer="properties", loss_type="grpo", num_generations=G, beta=BETA, reward_mode="dataset")
    if data.draw(st.booleans(), label="hostile keywords"):
        kw.update({k: data.draw(st.sampled_from(v), label=k) for k, v in KEYWORDS.items()
                   if data.draw(st.integers(0, 3), label=f"{k}?") == 0})
    try:
        rec = StepRecorder(step["tok"], **kw)
    except RookWorldError:
        return
    counter["calls"] += 1
    made = []
    for name in CALLS:
        if data.draw(st.integers(0, 9), label=f"skip {name}") == 0:
            continue
        args = {k: _value(data.draw, k, v, step) if data.draw(st.floats(0, 1), label=f"{k}?") < p else v
                for k, v in step["valid"][name].items()}
        made.append((name, args))
        _call(getattr(rec, name), args, name, counter, made)
    end = data.draw(st.sampled_from(["build", "save", "save", "none"]), label="end")
    if end == "build":
        _call(rec.build, {}, "build", counter, made)
    elif end == "save":
        _call(rec.save, {"path": out / f"step-{counter['calls']}"}, "save", counter, made)


def _call(fn, args: dict, name: str, counter: dict, made: list) -> None:
    counter["calls"] += 1
    try:
        fn(**args)
    except RookWorldError:
        counter["named"] = counter.get("named", 0) + 1
    except Exception:  # noqa: BLE001 - the failure report: which call, which arguments, what escaped
        shown = "\n".join(f"  {n}({', '.join(f'{k}={_show(v)}' for k, v in a.items())})" for n, a in made)
        pytest.fail(f"StepRecorder.{name} raised a bare error after the calls\n{shown}\n{traceback.format_exc()}")


def _show(v) -> str:
    if torch.is_tensor(v):
        return f"tensor{tuple(v.shape)} {v.dtype} on {v.device}"
    if isinstance(v, torch.nn.Module):
        return f"{type(v).__name__} on {next(v.parameters(), torch.empty(0)).device}"
    return repr(v)[:60]


def _run(step, tmp_path, fuzz_counts, examples: int, least: int, derandomize: bool) -> None:
    counter = {"calls": 0}
    # no shrinking: a failure's report lists every call and argument of its example already
    run = settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
                   phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))(given(st.data())(
                       lambda data: _example(data, step, tmp_path, counter)))
    run()
    label = "StepRecorder calls with generated arguments"
    fuzz_counts[label] = fuzz_counts.get(label, 0) + counter["calls"]
    assert counter["calls"] >= least, counter
    assert counter.get("named", 0) >= examples // 4, counter      # the hostile arguments reached the checks


def test_record_calls_raise_only_named_errors(step, tmp_path, fuzz_counts):
    _run(step, tmp_path, fuzz_counts, examples=250, least=2000, derandomize=True)


@pytest.mark.slow
def test_record_calls_raise_only_named_errors_20000(step, tmp_path, fuzz_counts):
    _run(step, tmp_path, fuzz_counts, examples=2500, least=20000, derandomize=False)


# ------------------------------------------------------------------------------------------ what it found
def test_a_tensor_on_the_meta_device_is_named(step):
    """Was NotImplementedError: Cannot copy out of meta tensor; no data! (from the copy to the CPU)."""
    from rookworld_debug.record import StepRecorder
    rec = StepRecorder(step["tok"], num_generations=G)
    with pytest.raises(DataError, match="meta device"):
        rec.advantages(step["valid"]["advantages"]["advantages"].to("meta"))
    with pytest.raises(DataError, match="meta device"):
        rec.model_before(copy.deepcopy(step["model"]).to("meta"))
    for call in (rec.sampler, rec.model_after):
        with pytest.raises(DataError, match="no data"):
            call(copy.deepcopy(step["model"]).to("meta"))
    with pytest.raises(DataError, match="reference: parameter .* meta device"):
        rec.model_before(step["model"], reference=copy.deepcopy(step["model"]).to("meta"))
    assert "weights_before" not in rec.pieces          # the refused call kept nothing


def _rollout_args(step, **changed) -> dict:
    return {**step["valid"]["rollout"], **changed}


@pytest.mark.parametrize("call, kwargs, match", [
    ("batch", dict(prompts=None), "prompts: a sequence of strings expected"),                   # was a TypeError
    ("batch", dict(prompts=PROMPTS, labels=math.nan), "labels: a sequence of strings expected"),  # was a TypeError
    ("batch", dict(prompts=PROMPTS, labels=True), "labels: a sequence of strings expected"),      # was a TypeError
    ("rollout", dict(completions=True), "completions: a sequence of strings expected"),          # was a TypeError
    ("rollout", dict(completions=[" B: a1a2", None, "x", "y"]), "completions must be 4 strings"),
    ("logprobs", dict(training=torch.tensor([1.0, 0.0])), "training must be True or False"),   # was a RuntimeError
    ("model_before", dict(model="module"), "a transformers model"),
])
def test_what_the_property_found_is_named(step, call, kwargs, match):
    from rookworld_debug.record import StepRecorder
    rec = StepRecorder(step["tok"], num_generations=G)
    args = _rollout_args(step, **kwargs) if call == "rollout" else kwargs
    with pytest.raises(DataError, match=match):
        getattr(rec, call)(**args)


def test_a_refused_rollout_records_nothing(step, tmp_path):
    """Its rows were kept before the completions were refused, and build() then failed in the rewards phase with a
    bare ValueError ('returned 4 values for 2 completions')."""
    from rookworld_debug.record import StepRecorder
    rec = StepRecorder(step["tok"], num_generations=G)
    with pytest.raises(DataError, match="completions must be 4 strings"):
        rec.rollout(**_rollout_args(step, completions=[" B: a1a2", " M: a1a2"]))
    assert "rollout" not in rec.pieces
    with pytest.raises(DataError, match="needs at least its rollout"):
        rec.build()


def test_a_model_without_parameters_is_named(step):
    """Was StopIteration from next(model.parameters())."""
    from rookworld_debug.record import StepRecorder

    class Empty(torch.nn.Module):
        config = step["model"].config
    with pytest.raises(DataError, match="no parameters"):
        StepRecorder(step["tok"], num_generations=G).model_before(Empty())
