"""`rookworld-debug diagnose` and `rookworld-debug report --trace` on a recorded step whose advantages have the wrong
sign: the command lists the findings notebook 01's diagnosis cell lists, in the same order; the step report (notebook
01 under papermill) shows the error finding `diagnose` names, the replay table with the advantages phase marked, its
recorded-vs-recomputed figure, and names the loop that wrote the step (not TRL)."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import torch

from cli import run_cli


@pytest.fixture(scope="module")
def faulty_step(tmp_path_factory) -> Path:
    """A step of the lab's hand-written loop, recorded through StepRecorder, its advantages negated before the
    loss saw them (what a loop whose advantages have the wrong sign records)."""
    from rookworld_debug.lab.handloop import LoopConfig, run
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("replay_report")
    rec = run(LoopConfig(num_prompts=2, num_generations=3, steps=1), out=str(root / "healthy"))
    rec.pieces["advantages"] = -rec.pieces["advantages"]
    return rec.save(root / "step")


def test_diagnose_as_a_command_lists_the_same_findings_as_the_notebook(faulty_step):
    from test_replay_view import _notebook_diagnosis
    found, _ = _notebook_diagnosis(faulty_step)
    r = run_cli("diagnose", faulty_step, "--json", timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]            # an error-level finding
    assert [f["code"] for f in json.loads(r.stdout)["findings"]] == [f.code for f in found]
    assert found[0].code == "advantage_sign_flipped"


@pytest.mark.slow          # a papermill run of notebook 01: about a minute on 2 CPU cores, more when they are shared
def test_report_trace_shows_the_error_diagnose_names_and_the_replay(faulty_step, tmp_path):
    from rookworld_debug.diagnosis.registry import diagnose_folder
    found = diagnose_folder(faulty_step)[0]               # what `rookworld-debug diagnose` prints (test_replay_view)
    codes = [f.code for f in found]
    assert codes[0] == "advantage_sign_flipped"
    r = run_cli("report", "--trace", faulty_step, "--out", tmp_path, "--no-progress", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (page,) = tmp_path.glob("*/run/report.html")
    text = page.read_text(encoding="utf-8")
    n_err = sum(f.severity == "error" for f in found)
    head = re.search(r"Diagnosis: (\d+) finding\(s\), (\d+) error-level", text)
    assert head and int(head[2]) == n_err >= 1, head and head[0]
    card = text[head.start():text.index("</section>", head.start())]
    shown = [c for c in codes if c != "phase_note"][:5]
    assert re.findall(r'data-code="([^"]+)"', card) == shown            # the card lists what diagnose lists
    rows = dict(re.findall(r'<tr class="[^"]*" data-phase="([^"]+)" data-status="([^"]+)"', text))
    assert rows["advantages"] == "disagree" and rows["rewards"] == "agree" and rows["scoring"] == "agree"
    assert re.search(r'class="[^"]*rw-replay-first[^"]*" data-phase="advantages"', text)
    assert re.search(r'class="rw-tok[^"]* rw-hl"', text)                 # the disagreeing rows' tokens
    assert "Replay \\u2014 advantages: recorded vs recomputed" in text     # the figure's title, in its JSON
    plain = html.unescape(text)
    assert "step-0 invariants: not recorded: the training loop 'lab hand-written loop'" in plain
    assert "not recorded by TRL" not in plain
