"""Saved traces name their records by a stable name (the class name), so record modules can move; a trace
written by the version-1 format ("module:Class" names) still loads. tests/fixtures/trace_v1 is one tiny step
(2-layer byte GPT-2, B=1, G=2, 8 tokens, dataset reward) saved by the version-1 writer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rookworld_debug.errors import TraceError
from rookworld_debug.grpo.trace import serialize
from rookworld_debug.grpo.step import TRACE_VERSION, StepTrace

V1 = Path(__file__).parent / "fixtures" / "trace_v1"


def _names(payload) -> set:
    """The record names a trace.json payload holds."""
    from test_trace_security import _records
    return {r["__record__"] for r in _records(payload, [])}


def test_a_version_1_trace_still_loads():
    names = _names(json.loads((V1 / "trace.json").read_text()))
    assert names and all(n.startswith("rookworld_debug.") and ":" in n for n in names)   # really the old format
    t = StepTrace.load(V1)
    assert t.version == 1 and t.config.batch_size == 1 and t.config.num_generations == 2
    assert t.rollout.completion_ids.shape[0] == 2 and t.rollout.completion_ids.shape[1] <= 8
    assert t.update is not None and len(t.iterations) == 1
    assert torch.isfinite(t.loss.loss) and t.summary()["loss"] == pytest.approx(float(t.loss.loss))


def test_a_resaved_version_1_trace_names_records_by_class_and_round_trips(tmp_path):
    t = StepTrace.load(V1)
    out = StepTrace(**{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "version": TRACE_VERSION}).save(tmp_path / "s")
    names = _names(json.loads((out / "trace.json").read_text()))
    assert names and all(":" not in n and n in serialize.record_types() for n in names)
    back = StepTrace.load(out)
    assert back.version == TRACE_VERSION
    assert torch.equal(back.rollout.completion_ids, t.rollout.completion_ids)
    assert back.summary() == pytest.approx(t.summary(), nan_ok=True)


@pytest.mark.parametrize("name", ["rookworld_debug.errors:TraceError", "os:system", "rookworld_debug.grpo.step:run_step",
                                  "TraceError", "run_step", "somewhere.else:StepTrace"])
def test_names_outside_the_record_table_are_refused(tmp_path, name):
    dst = tmp_path / "t"
    shutil.copytree(V1, dst)
    payload = json.loads((dst / "trace.json").read_text())
    payload["fields"]["rollout"]["__record__"] = name
    (dst / "trace.json").write_text(json.dumps(payload))
    with pytest.raises(TraceError, match="not one of this package's records"):
        StepTrace.load(dst)


def test_stable_names_are_unique_and_module_free():
    table = serialize.record_types()
    assert "StepTrace" in table and all(":" not in n and cls.__qualname__ == n for n, cls in table.items())
    assert serialize.stable_name("rookworld_debug.trl.record:TRLCapture") == "TRLCapture"   # an older home
    assert serialize.stable_name("rookworld_debug.grpo.step:StepTrace") == "StepTrace"
    assert serialize.stable_name(["StepTrace"]) is None
