"""The same config and seed give a bit-identical StepTrace on CPU.

Two complete `run_step` calls from scratch (model loaded from disk, data, Stockfish, optimizer each time):
every tensor of the trace is `torch.equal`, every JSON field equal except wall-clock timings. Mixed P:/A:
batch with the Stockfish reward, so sampling, both reward paths, the engine, advantages, loss, update and
evaluation are all covered.
"""
from __future__ import annotations

import json

import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.grpo.trace import serialize
from rookworld_debug.grpo.step import StepTrace, run_step

# wall-clock fields (durations, the provenance load timestamp); everything else must be identical
TIME_KEYS = {"timings", "seconds", "engine/seconds", "timestamp"}


def _strip_times(obj, path=""):
    """The encoded trace payload with every wall-clock value replaced by a marker."""
    if isinstance(obj, dict):
        if "__dict__" in obj:            # encoded dict: [[key, value], ...]
            return {"__dict__": [[k, "<time>" if k in TIME_KEYS else _strip_times(v, f"{path}.{k}")]
                                 for k, v in obj["__dict__"]]}
        return {k: "<time>" if k in TIME_KEYS else _strip_times(v, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip_times(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    return obj


def _diff(a, b, path=""):
    """First differing path of two JSON-like values (for a readable failure)."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: missing on one side"
            d = _diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b or (a != a and b != b) else f"{path}: {a!r} vs {b!r}"


def test_same_config_and_seed_give_a_bit_identical_step_trace(tiny_byte_model_dir, tmp_path):
    cfg = StepConfig(model=str(tiny_byte_model_dir), task="mixed", batch_size=2, num_generations=4,
                     max_new_tokens=16, eval_max_new_tokens=8, heldout_n=2, reward_mode="engine", engine_depth=2,
                     engine_workers=2, top_k_alternatives=3, seed=11, lr=1e-3, entropy_coef=0.01)
    traces = []
    for _ in range(2):
        t = run_step(cfg)
        if t.setup.engine is not None:
            t.setup.engine.close()
        traces.append(t)
    a, b = traces
    assert a.update is not None and b.update is not None and a.evaluation is not None
    assert a.update.loss_record_diff < 1e-5                                # the step optimised the recorded loss
    (pa, ta), (pb, tb) = serialize.encode(a), serialize.encode(b)
    assert set(ta) == set(tb) and len(ta) > 20
    unequal = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert unequal == [], unequal                                          # every tensor bit-identical
    d = _diff(_strip_times(pa), _strip_times(pb))
    assert d is None, d                                                    # every JSON field identical
    # and a saved/loaded trace is still identical (the files are what views re-render from)
    c = StepTrace.load(a.save(tmp_path / "a"))
    pc, tc = serialize.encode(c)
    assert set(tc) == set(ta) and all(torch.equal(ta[k], tc[k]) for k in ta)
    assert _diff(json.loads(json.dumps(pa)), json.loads(json.dumps(pc))) is None
