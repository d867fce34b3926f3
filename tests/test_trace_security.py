"""Opening a trace never runs code, and a damaged or foreign trace is a named error.

A real trace (one tiny step, dataset reward) is saved once; every test copies and damages it. The fuzz
mutates trace.json (hypothesis: replace/delete/rename nodes, record names that point at callables such
as ``subprocess:run``) and trace.safetensors (drop/rename/retype tensors, truncate the file); nothing
but TraceError / IncompatibleTraceError may escape, and a canary file proves no payload ran. A few
hundred cases in the default run; ``ROOKWORLD_FUZZ_TRACES=5000`` (the slow test) for the full count.
"""
from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rookworld_debug.errors import IncompatibleTraceError, TraceError
from rookworld_debug.grpo.step import TRACE_VERSION, StepTrace
from tinymodels import use_spare_cores

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def saved(fixtures_dir, tmp_path_factory):
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.step import run_step

    use_spare_cores()
    cfg = StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"), batch_size=2,
                               num_generations=2, max_new_tokens=12, eval_max_new_tokens=8, heldout_n=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = run_step(cfg)
    return trace.save(tmp_path_factory.mktemp("trace") / "step")


def _copy(saved, tmp_path, payload=None):
    dst = tmp_path / f"t{random.getrandbits(40)}"
    shutil.copytree(saved, dst)
    if payload is not None:
        (dst / "trace.json").write_text(json.dumps(payload))
    return dst


def _payload(saved):
    return json.loads((saved / "trace.json").read_text())


def _records(node, out):
    """Every nested record dict of a payload."""
    if isinstance(node, dict):
        if "__record__" in node:
            out.append(node)
        for v in node.values():
            _records(v, out)
    elif isinstance(node, list):
        for v in node:
            _records(v, out)
    return out


def test_a_record_naming_a_callable_never_runs(saved, tmp_path):
    canary = tmp_path / "canary"
    for name in ("subprocess:run", "os:system", "builtins:exec", "rookworld_debug.grpo.step:run_step",
                 "rookworld_debug.errors:TraceError", "pathlib:Path.touch"):
        payload = _payload(saved)
        rec = _records(payload, [])[3]
        rec["__record__"] = name
        rec["fields"] = {"args": ["touch", str(canary)], "cmd": f"touch {canary}", "source": f"open('{canary}','w')",
                         "self": str(canary)}
        with pytest.raises(TraceError, match="not one of this package's records"):
            StepTrace.load(_copy(saved, tmp_path, payload))
        assert not canary.exists(), name


def test_newer_version_is_refused_naming_both(saved, tmp_path):
    payload = _payload(saved)
    payload["fields"]["version"] = 99
    with pytest.raises(IncompatibleTraceError, match=rf"99.*up to {TRACE_VERSION}"):
        StepTrace.load(_copy(saved, tmp_path, payload))


def test_unknown_and_missing_fields_are_named(saved, tmp_path):
    payload = _payload(saved)
    payload["fields"]["rollout"]["fields"]["surprise"] = 1
    with pytest.raises(TraceError, match=r"unknown field.*surprise.*Rollout") as err:
        StepTrace.load(_copy(saved, tmp_path, payload))
    assert "trace.json" in str(err.value)
    payload = _payload(saved)
    del payload["fields"]["rewards"]["fields"]["rewards"]
    with pytest.raises(TraceError, match=r"lacks field.*rewards"):
        StepTrace.load(_copy(saved, tmp_path, payload))


def test_missing_tensor_is_named(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = _copy(saved, tmp_path)
    tensors = load_file(str(dst / "trace.safetensors"))
    key = next(k for k in tensors if k.endswith("rewards"))
    del tensors[key]
    save_file(tensors, str(dst / "trace.safetensors"))
    with pytest.raises(TraceError, match=rf"tensor '{key}' is not in trace.safetensors"):
        StepTrace.load(dst)


def test_truncated_safetensors_is_named(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    data = (dst / "trace.safetensors").read_bytes()
    (dst / "trace.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceError, match="unreadable"):
        StepTrace.load(dst)


def test_a_clean_trace_still_round_trips(saved):
    t = StepTrace.load(saved)
    assert t.version == TRACE_VERSION and t.rollout.completion_ids.ndim == 2


# ------------------------------------------------------------------------------------------- fuzz
CALLABLES = ("subprocess:run", "os:system", "builtins:eval", "posix:system", "shutil:rmtree", "x", "", ":",
             "rookworld_debug.grpo.step:run_step", "rookworld_debug.config:StepConfig")
JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                    max_leaves=6)


def _nodes(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _nodes(v, path + (i,))


def mutate_payload(payload, data) -> dict:
    p = copy.deepcopy(payload)
    for _ in range(data.draw(st.integers(1, 3))):
        nodes = list(_nodes(p))              # again each time: an earlier mutation may have moved them
        path, _node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        if not path:
            continue
        parent = p
        for k in path[:-1]:
            parent = parent[k]
        op = data.draw(st.sampled_from(["junk", "delete", "callable", "rename", "version", "tensor", "marker"]))
        key = path[-1]
        if op == "junk":
            parent[key] = data.draw(JUNK)
        elif op == "delete" and isinstance(parent, dict):
            parent.pop(key, None)
        elif op == "callable":
            parent[key] = {"__record__": data.draw(st.sampled_from(CALLABLES)), "fields": {"args": ["touch", "CANARY"]}}
        elif op == "rename" and isinstance(parent, dict):
            parent[str(key) + data.draw(st.text(max_size=3))] = parent.pop(key)
        elif op == "version" and isinstance(p.get("fields"), dict):
            p["fields"]["version"] = data.draw(st.sampled_from([0, 2, 99, -1, "1", None, True, 1.5]))
        elif op == "tensor":
            parent[key] = {"__tensor__": data.draw(st.sampled_from(["nope", 3, None, "rollout.completion_ids"]))}
        elif op == "marker":
            parent[key] = {data.draw(st.sampled_from(["__dict__", "__tuple__", "__float__", "__repr__"])): data.draw(JUNK)}
    return p


def _fuzz(saved, tmp_path, n: int, fuzz_counts):
    payload = _payload(saved)
    work = tmp_path / "fuzz"
    shutil.copytree(saved, work)
    canary = tmp_path / "CANARY"
    cwd = os.getcwd()
    os.chdir(tmp_path)                      # a payload that ran "touch CANARY" would create the canary here
    outcomes = {"loaded": 0, "TraceError": 0, "IncompatibleTraceError": 0}

    @settings(max_examples=n, **FUZZ)
    @given(st.data())
    def run(data):
        (work / "trace.json").write_text(json.dumps(mutate_payload(payload, data)))
        try:
            StepTrace.load(work)
            outcomes["loaded"] += 1
        except IncompatibleTraceError:
            outcomes["IncompatibleTraceError"] += 1
        except TraceError:
            outcomes["TraceError"] += 1

    try:
        run()
    finally:
        os.chdir(cwd)
    assert not canary.exists()
    assert outcomes["TraceError"] > n // 4, outcomes        # the mutations do reach the checks
    fuzz_counts["trace.json mutations"] = fuzz_counts.get("trace.json mutations", 0) + n


def _fuzz_tensors(saved, tmp_path, n: int, fuzz_counts):
    from safetensors.torch import load_file, save_file
    import torch

    tensors = load_file(str(saved / "trace.safetensors"))
    keys = sorted(tensors)
    work = tmp_path / "fuzz_t"
    shutil.copytree(saved, work)
    raw = (saved / "trace.safetensors").read_bytes()

    @settings(max_examples=n, **FUZZ)
    @given(st.data())
    def run(data):
        op = data.draw(st.sampled_from(["drop", "rename", "retype", "bytes"]))
        if op == "bytes":
            cut = data.draw(st.integers(0, len(raw)))
            junk = data.draw(st.binary(max_size=16))
            (work / "trace.safetensors").write_bytes(raw[:cut] + junk)
        else:
            t = dict(tensors)
            k = data.draw(st.sampled_from(keys))
            if op == "drop":
                t.pop(k)
            elif op == "rename":
                t[k + "x"] = t.pop(k)
            else:
                t[k] = torch.zeros(3, dtype=torch.float64)
            save_file(t, str(work / "trace.safetensors"))
        try:
            trace = StepTrace.load(work)
        except TraceError:
            return
        trace.summary()                    # what loads, the headline view reads (shapes were checked at load)

    run()
    fuzz_counts["trace.safetensors mutations"] = (fuzz_counts.get("trace.safetensors mutations", 0)
                                                            + n)


def test_fuzz_trace_json_default(saved, tmp_path, fuzz_counts):
    _fuzz(saved, tmp_path, 300, fuzz_counts)


def test_fuzz_trace_safetensors_default(saved, tmp_path, fuzz_counts):
    _fuzz_tensors(saved, tmp_path, 100, fuzz_counts)


@pytest.mark.slow
def test_fuzz_trace_full(saved, tmp_path, fuzz_counts):
    n = int(os.environ.get("ROOKWORLD_FUZZ_TRACES", "5000"))
    _fuzz(saved, tmp_path, n, fuzz_counts)
    _fuzz_tensors(saved, tmp_path, n // 5, fuzz_counts)


# ------------------------------------------------------------------- types and shapes, not only fields
@pytest.mark.parametrize("key,shape", [("loss.completion_mask", (4, 5)), ("rollout.per_token_logps", (4, 99)),
                                       ("rewards.rewards_per_func", (3, 1)), ("advantages.group_mean", (7,)),
                                       ("rollout.is_truncated", (4, 2)), ("loss.loss", (2,))])
def test_tensors_whose_shapes_disagree_are_refused_at_load_naming_the_field(saved, tmp_path, key, shape):
    from safetensors.torch import load_file, save_file
    import torch
    dst = _copy(saved, tmp_path)
    tensors = load_file(str(dst / "trace.safetensors"))
    assert key in tensors, sorted(tensors)[:20]
    tensors[key] = torch.zeros(shape, dtype=tensors[key].dtype)
    save_file(tensors, str(dst / "trace.safetensors"))
    with pytest.raises(TraceError, match=re.escape(key)):
        StepTrace.load(dst)


def test_a_value_of_the_wrong_type_where_a_tensor_goes_is_refused(saved, tmp_path):
    payload = _payload(saved)
    rollout = payload["fields"]["rollout"]["fields"]
    rollout["completion_ids"] = "not a tensor"
    with pytest.raises(TraceError, match="rollout.completion_ids"):
        StepTrace.load(_copy(saved, tmp_path, payload))
    payload = _payload(saved)
    payload["fields"]["rollout"]["fields"]["completions"] = {"__tuple__": ["only one"]}
    with pytest.raises(TraceError, match="rollout.completions"):
        StepTrace.load(_copy(saved, tmp_path, payload))


def test_deeply_nested_trace_json_is_a_trace_error(saved, tmp_path):
    dst = _copy(saved, tmp_path)
    (dst / "trace.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceError, match="nested too deeply"):
        StepTrace.load(dst)
    text = (saved / "trace.json").read_text()
    deep = '{"__tuple__": [' * 5000 + "1" + "]}" * 5000                  # deep inside a valid record
    (dst / "trace.json").write_text(text.replace('"seed": 0', f'"seed": {deep}', 1))
    with pytest.raises(TraceError):
        StepTrace.load(dst)
