"""The sealed fault set is whole and runnable as documented: every fault has the phase it breaks and the cause a
diagnosis must name, each loop knows it, and the runner's command answers as a user runs it."""
from __future__ import annotations

import subprocess
import sys

from tests.cli import ENV, REPO


def test_every_sealed_fault_names_a_phase_and_a_cause_and_its_loop_knows_it():
    from rookworld_debug.lab.between_steps import ALL_BETWEEN_FAULTS, SEALED_BETWEEN_FAULTS
    from rookworld_debug.lab.faults_trl import SEALED_TRL_FAULTS
    from rookworld_debug.lab.handloop import ALL_FAULTS, SEALED_FAULTS, SEALED_SETTINGS, LoopConfig
    assert len(SEALED_FAULTS) + len(SEALED_BETWEEN_FAULTS) + len(SEALED_TRL_FAULTS) >= 15
    phases = {"generation", "rewards", "advantages", "scoring", "loss", "gradient", "update"}
    assert all(p in phases and c for p, c in SEALED_FAULTS.values())
    assert all(q and c for q, c in SEALED_BETWEEN_FAULTS.values())
    assert all(f.accept and f.how for f in SEALED_TRL_FAULTS)
    assert set(SEALED_FAULTS) <= set(ALL_FAULTS) and set(SEALED_BETWEEN_FAULTS) <= set(ALL_BETWEEN_FAULTS)
    for fault, kw in SEALED_SETTINGS.items():          # every setting is one the loop has
        assert fault in SEALED_FAULTS
        LoopConfig(**kw)


def test_the_probes_written_after_the_set_are_apart_from_it_and_their_loops_know_them():
    from rookworld_debug.lab.handloop import ALL_FAULTS, PROBE_FAULTS, PROBE_SETTINGS, SEALED_FAULTS, LoopConfig
    from rookworld_debug.lab.sealed import PROBE_SHAPES
    assert PROBE_FAULTS and not set(PROBE_FAULTS) & set(SEALED_FAULTS) and set(PROBE_FAULTS) <= set(ALL_FAULTS)
    assert all(p and c for p, c in PROBE_FAULTS.values())
    for fault, kw in PROBE_SETTINGS.items():
        assert fault in PROBE_FAULTS
        LoopConfig(**kw)
    for kw in PROBE_SHAPES:                             # the healthy shapes are settings the loop has
        LoopConfig(**kw)


def test_the_runners_help_answers_and_exits():
    r = subprocess.run([sys.executable, "-m", "rookworld_debug.lab.sealed", "--help"], cwd=REPO, env=ENV,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--out" in r.stdout and "sealed" in r.stdout, r.stderr[-2000:]


def test_the_table_counts_only_faults_that_changed_something():
    from rookworld_debug.lab.sealed import table
    rows = [{"set": "one step", "fault": "a", "expected_phase": "loss", "expected_cause": "x", "codes": ["x"],
             "errors": 1, "top1": True, "top3": True, "first_phase": "loss", "phase_right": True, "effective": True},
            {"set": "one step", "fault": "b", "expected_phase": "loss", "expected_cause": "y", "codes": [],
             "errors": 0, "top1": False, "top3": False, "first_phase": "", "phase_right": False,
             "effective": False},
            {"set": "TRL", "fault": "", "expected_phase": "", "expected_cause": "", "codes": ["z"], "errors": 1,
             "top1": False, "top3": False, "first_phase": "", "phase_right": None}]
    text = table(rows)
    assert "scored: 1; cause named first 1/1 (100 %)" in text
    assert "not scored (changed nothing the loop recorded): b" in text
    assert "healthy controls 1, with an error-level finding: 1" in text
