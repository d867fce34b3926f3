"""`rookworld-debug trl-demo` diagnosed as a user runs it (subprocess, stdin closed, timeout).

With 48 new tokens every completion is cut: the first finding says so (no learning signal). With the default
budget the completions end, the run is healthy until the learning-rate jump, and the jump step reads
"update too large: learning rate"; the Diagnosis card on the triage page and on the jump step's report is read in
Chromium offline."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli import run_cli as _cli

JUMP = 8                     # trl-demo's default: the session's shared demo run


def test_demo_with_48_tokens_first_finding_is_truncation(tmp_path):
    out = tmp_path / "run48"
    r = _cli("trl-demo", "--out", str(out), "--steps", "4", "--jump-at", "3", "--max-completion-length", "48",
             "--no-checkpoints", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _cli("diagnose", str(out), "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    first = json.loads(r.stdout)["findings"][0]
    assert first["code"] == "all_truncated" and first["step"] == 1, first
    assert "no learning signal" in first["cause"].lower()
    assert first["fix"]["grpo_config"]["max_completion_length"] > 48
    cap = json.loads((out / "captures" / "captures.json").read_text())
    assert cap["captures"][0]["top_finding"]["code"] == "all_truncated"     # the flight recorder says why
    # one fix value per cause: the log of the steps before the jump (all cut) and the captured step 1 propose the
    # same budget
    from rookworld_debug import StepTrace
    from rookworld_debug.diagnosis.registry import diagnose_run, diagnose_trace
    from rookworld_debug.diagnosis.runlog import rows_from_history
    rows = rows_from_history(json.loads((out / "trainer_state.json").read_text())["log_history"])[:2]
    run_fix = {f.code: f.fix for f in diagnose_run(rows)}["all_truncated"]
    step_fix = {f.code: f.fix for f in diagnose_trace(StepTrace.load(out / "captures" / "step-000001"))}["all_truncated"]
    assert run_fix.grpo_config == step_fix.grpo_config == first["fix"]["grpo_config"], (run_fix, step_fix)
    assert run_fix.description == step_fix.description


@pytest.fixture(scope="module")
def healthy_demo(tmp_path_factory, trl_demo_run):
    out = tmp_path_factory.mktemp("demo") / "run"
    shutil.copytree(trl_demo_run, out)                    # triage writes into the run folder: a copy of its own
    return out


def test_healthy_demo_until_the_jump_then_learning_rate(healthy_demo):
    r = _cli("diagnose", str(healthy_demo), "--json", cwd=healthy_demo.parent)
    found = json.loads(r.stdout)["findings"]
    codes = {f["code"]: f for f in found}
    for code in ("all_truncated", "truncation"):          # only after the jump broke the policy, never before
        assert codes.get(code, {}).get("step", JUMP) >= JUMP, [(f["code"], f["step"]) for f in found]
    assert found[0]["code"] == "lr_too_large"
    assert codes["lr_too_large"]["step"] == JUMP and codes["lr_too_large"]["title"] == "update too large: learning rate"
    assert not [f for f in found if f["severity"] == "error" and f["step"] is not None and f["step"] < JUMP - 1]
    state = json.loads((healthy_demo / "trainer_state.json").read_text())["log_history"]
    assert max(d.get("completions/clipped_ratio", 0) for d in state if d.get("step", 99) < JUMP - 1) < 0.9


def _read(path: Path, selector: str) -> list[str]:
    from conftest import offline_page
    with offline_page(path) as pg:
        pg.wait_for_selector(selector, timeout=30000)
        return [el.inner_text() for el in pg.locator(selector).all()]


@pytest.mark.slow
def test_diagnosis_card_on_triage_page_and_step_report_in_chromium(healthy_demo):
    r = _cli("triage", str(healthy_demo), "--no-step-reports", "--no-progress", cwd=healthy_demo.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    t = json.loads((healthy_demo / "triage" / "triage.json").read_text())
    at_jump = [f for f in t["flagged"] if f["step"] == JUMP]
    assert at_jump and at_jump[0]["top_finding"]["code"] == "lr_too_large"
    cards = _read(healthy_demo / "triage" / "triage.html", "section.rw-diagnosis")
    assert cards and "update too large: learning rate" in cards[0] and "Fix:" in cards[0]
    rows = _read(healthy_demo / "triage" / "triage.html", "tr.rw-step-finding")
    assert any(row.startswith(str(JUMP)) and "update too large" in row for row in rows), rows
    trace = healthy_demo / "captures" / f"step-{JUMP:06d}"
    r = _cli("report", "--trace", str(trace), "--out", str(healthy_demo / "rep"), "--no-progress",
             cwd=healthy_demo.parent)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    html = next((healthy_demo / "rep").rglob("report.html"))
    text = _read(html, "section.rw-diagnosis")
    assert text and "Diagnosis" in text[0] and "Evidence" in text[0]
