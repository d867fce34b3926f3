"""Diagnosis: findings from the records, each with its evidence and fix, read right on real tiny-model steps.

A step whose policy has dropout on → "dropout active" with the step-0 log-prob gap as evidence; an on-policy step
whose KL value share is ~95 % but whose KL gradient share is small → no "KL dominates"; an oscillating run log →
"no net trend"; `rookworld-debug diagnose` as a user runs it (JSON, exit codes)."""
from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest
from cli import run_cli


def _step(fault=None, **settings):
    import torch
    torch.set_num_threads(1)
    from rookworld_debug.lab.faults import run_one
    return run_one(settings, patch=fault, seed=0)


@pytest.fixture(scope="module")
def healthy():
    return _step()


@pytest.fixture(scope="module")
def dropout(tmp_path_factory):
    from rookworld_debug.lab.faults import _dropout
    trace = _step(_dropout)
    path = trace.save(tmp_path_factory.mktemp("dropout") / "trace")
    return trace, path


def test_dropout_is_named_first_with_the_step0_gap(dropout):
    from rookworld_debug.diagnosis import diagnose_trace
    trace, _ = dropout
    found = diagnose_trace(trace, step=0)
    top = found[0]
    assert top.code == "dropout_active" and top.severity == "error", [f.code for f in found]
    ev = {e.name: e for e in top.evidence}
    assert ev["step0_logp_gap_mean_abs"].value > 1e-3          # the policy/reference gap before any update
    assert ev["repeat_forward_max_abs"].value > 1e-3           # two forwards of the same weights disagree
    assert top.fix.grpo_config == {"disable_dropout": True}
    assert all(e.definition and e.batch for e in top.evidence)


def test_healthy_step_has_no_error_findings(healthy):
    from rookworld_debug.diagnosis import diagnose_trace
    assert not [f.code for f in diagnose_trace(healthy, step=0) if f.severity == "error"]


def test_kl_value_share_is_not_the_gradient_share(healthy):
    """On-policy step, β·KL ≈ 95 % of the loss VALUE, KL gradient small: no "KL dominates". The same step with
    the KL gradient dominating: named (the check reads the gradient, never the value)."""
    from rookworld_debug.diagnosis import diagnose_trace
    from rookworld_debug.metrics import term_balance
    lo = dataclasses.replace(healthy.loss, kl_share=0.95, beta=0.1)
    small = dataclasses.replace(healthy.update, per_term_global={"pg": 1.0, "kl": 0.05, "entropy": 0.0})
    trace = dataclasses.replace(healthy, loss=lo, update=small)
    assert term_balance(lo, small).on_policy                   # ratio ≡ 1: the value share says nothing
    assert "kl_dominates" not in {f.code for f in diagnose_trace(trace, step=0)}
    big = dataclasses.replace(small, per_term_global={"pg": 0.1, "kl": 1.0, "entropy": 0.0})
    found = {f.code: f for f in diagnose_trace(dataclasses.replace(trace, update=big), step=0)}
    assert "kl_dominates" in found
    assert found["kl_dominates"].fix.step_config["beta"] < 0.1


def test_oscillating_log_has_no_net_trend_and_a_rising_one_does():
    from rookworld_debug.diagnosis import diagnose_run
    rng = random.Random(0)
    flat = [{"step": s, "loss": 0.0, "reward": 0.5 + rng.gauss(0, 0.05)} for s in range(1, 301)]
    found = {f.code: f for f in diagnose_run(flat)}
    f = found["no_net_trend"]
    ev = {e.name: e.value for e in f.evidence}
    assert abs(ev["trend_change"]) <= ev["trend_ci95_half_width"]
    assert ev["up_steps"] + ev["down_steps"] == 299 and ev["sign_test_p"] >= 0.05
    rising = [{"step": s, "loss": 0.0, "reward": 0.2 + s / 300 + rng.gauss(0, 0.05)} for s in range(1, 301)]
    assert "no_net_trend" not in {f.code for f in diagnose_run(rising)}


def test_log_history_list_and_trainer_state_file_read_alike(tmp_path):
    from rookworld_debug.diagnosis import diagnose_run
    hist = [{"step": s, "loss": 0.1, "kl": 0.001 if s < 8 else 10.0, "learning_rate": 1e-5 if s < 7 else 0.1,
             "reward": 0.0} for s in range(1, 12)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": hist}))
    a = [(f.code, f.step) for f in diagnose_run(hist)]
    b = [(f.code, f.step) for f in diagnose_run(tmp_path)]
    assert a == b and ("lr_too_large", 8) in a


def test_finding_round_trips_through_json(dropout):
    from rookworld_debug.diagnosis import Finding, diagnose_trace
    for f in diagnose_trace(dropout[0], step=0):
        d = json.loads(json.dumps(f.to_dict()))
        g = Finding.from_dict(d)
        assert (g.code, g.severity, g.cause, g.fix.step_config, g.fix.grpo_config) == \
            (f.code, f.severity, f.cause, dict(f.fix.step_config), dict(f.fix.grpo_config))
        assert [e.name for e in g.evidence] == [e.name for e in f.evidence]


def test_card_escapes_what_it_shows():
    from rookworld_debug.diagnosis import Evidence, Finding, Fix
    from rookworld_debug.viz import diagnosis_card
    f = Finding("x<y", "error", "<script>alert(1)</script>", (Evidence("<b>", math.nan, "d&d", "b\"b"),),
                Fix("<i>fix</i>", step_config={"lr": "<1>"}))
    html = diagnosis_card([f]).html
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>" not in html.replace("<b>Cause", "")\
        .replace("<b>Fix", "").replace("<b>Could", "")


def _cli(*args, timeout=120):
    return run_cli(*args, timeout=timeout)


@pytest.mark.slow                       # diagnose as a subprocess, several times
def test_diagnose_cli_json_and_exit_codes(dropout, healthy, tmp_path):
    _, path = dropout
    r = _cli("diagnose", str(path), "--json")
    assert r.returncode == 1, r.stderr[-2000:]                 # an error-level finding gates the script
    out = json.loads(r.stdout)
    first = out["findings"][0]
    assert first["code"] == "dropout_active" and {"code", "severity", "cause", "evidence", "fix"} <= set(first)
    ok = healthy.save(tmp_path / "healthy")
    r = _cli("diagnose", str(ok))
    assert r.returncode == 0 and "ERROR" not in r.stdout, r.stdout
    r = _cli("diagnose", str(tmp_path / "missing"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "error:" in r.stderr


def test_step_log_starts_with_the_diagnosis(dropout):
    from rookworld_debug.steplog import format_step_log
    log = format_step_log(dropout[0])
    assert log.startswith("DIAGNOSIS") and "dropout_active" in log.split("SETUP")[0]


def test_panel_rediagnoses_on_every_loss_knob(tmp_path, healthy):
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.widgets import tune_panel_from_trace
    p = tune_panel_from_trace(StepTrace.load(healthy.save(tmp_path / "t")))
    first = p.findings
    assert "rw-diagnosis" in p.w_findings.value
    p.set_loss_params(beta=0.5, loss_type="grpo")
    assert p.findings is not first and "rw-diagnosis" in p.w_findings.value
