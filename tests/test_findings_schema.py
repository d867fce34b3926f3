"""A finding read from a file (captures.json, triage.json, a results line) goes through a closed schema with types:
each wrong type is a DataError naming the field, and the Diagnosis card shows such a dict as a flagged item."""
from __future__ import annotations

import json
import math

import pytest

from rookworld_debug.errors import DataError


def _good() -> dict:
    return {"code": "dropout_active", "title": "dropout active", "severity": "error", "cause": "c",
            "evidence": [{"name": "kl", "value": "nan", "definition": "d", "batch": "b", "where": ""}],
            "fix": {"description": "d", "step_config": {"lr": 1e-6}, "grpo_config": {}, "code_change": None},
            "alternatives": ["a"], "score": 9.0, "step": 3}


def test_a_finding_round_trips_and_keeps_its_types():
    from rookworld_debug.diagnosis import Finding
    f = Finding.from_dict(json.loads(json.dumps(_good())))
    assert f.step == 3 and math.isnan(f.evidence[0].value) and f.alternatives == ("a",)
    assert Finding.from_dict(f.to_dict()) == f


@pytest.mark.parametrize("change, field", [
    ({"code": None}, "code"), ({"code": ""}, "code"), ({"fix": "lower the lr"}, "fix"),
    ({"fix": {"step_config": "lr=1"}}, "fix.step_config"), ({"fix": {"code_change": 3}}, "fix.code_change"),
    ({"alternatives": 3}, "alternatives"), ({"alternatives": "ab"}, "alternatives"),
    ({"score": 10 ** 400}, "score"), ({"score": "high"}, "score"), ({"step": True}, "step"), ({"step": -1}, "step"),
    ({"step": 1.5}, "step"), ({"severity": ["error"]}, "severity"), ({"severity": "fatal"}, "severity"),
    ({"evidence": {"name": "kl"}}, "evidence"), ({"evidence": [3]}, "evidence[0]"),
    ({"evidence": [{"value": True}]}, "evidence[0].value"), ({"extra": 1}, "finding"), ({"cause": 5}, "cause"),
])
def test_each_wrong_type_is_a_named_error(change, field):
    from rookworld_debug.diagnosis import Finding
    d = _good()
    for k, v in change.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    with pytest.raises(DataError) as e:
        Finding.from_dict(d)
    assert f"'{field}'" in str(e.value)


@pytest.mark.parametrize("bad", [None, [], "x", 3])
def test_a_finding_that_is_not_an_object(bad):
    from rookworld_debug.diagnosis import Finding
    with pytest.raises(DataError, match="not a JSON object"):
        Finding.from_dict(bad)


def test_the_card_flags_an_unreadable_finding_and_escapes_it():
    from rookworld_debug.viz import diagnosis_card
    html = diagnosis_card([_good(), {**_good(), "code": "<img src=x onerror=1>", "alternatives": "ab"}]).html
    assert html.count('class="rw-finding') == 2 and "unreadable_finding" in html and "<img" not in html
