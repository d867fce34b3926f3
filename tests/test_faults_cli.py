"""`python -m rookworld_debug.lab.faults` on bad input, as a user runs it (subprocess, stdin closed, timeout):
every argument is checked before any case runs, and a results file is read through a closed schema. Each is one
named line, exit 2 (no traceback, no case run)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli import ENV, REPO


def _faults(*args, cwd):
    return subprocess.run([sys.executable if not (REPO / ".venv/bin/python").exists() else str(REPO / ".venv/bin/python"),
                           "-m", "rookworld_debug.lab.faults", *map(str, args)], cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, env=ENV)


def _one_line(r, *words):
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(err) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-1500:])
    assert all(w in err[0] for w in words), err


def _step_result(**kw) -> dict:
    return {"kind": "step", "fault": "dropout", "seed": 0, "accept": ["dropout_active"], "how": "h",
            "effective": True, "changed": ["loss"], "findings": [{"code": "dropout_active", "severity": "error"}],
            "first_named_step": 0, "diagnose_seconds": 0.1, "seconds": 1.0, "id": "dropout/0", **kw}


def test_unknown_only_is_refused_before_any_case(tmp_path):
    _one_line(_faults("--out", tmp_path / "o", "--only", "no-such-case", cwd=tmp_path), "ConfigError", "--only")
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_out_a_file_and_table_without_results(tmp_path):
    (tmp_path / "f").write_text("x")
    _one_line(_faults("--out", tmp_path / "f", cwd=tmp_path), "--out", "is a file")
    _one_line(_faults("--out", tmp_path / "empty", "--table", cwd=tmp_path), "DataError", "results.jsonl")


@pytest.mark.parametrize("line, words", [
    ("[1, 2]", "a result is a JSON object"),
    ('"text"', "a result is a JSON object"),
    (json.dumps({"kind": "step"}), "no 'id'"),
    (json.dumps(_step_result(findings="dropout")), "'findings'"),
    (json.dumps(_step_result(seed=10 ** 400)), "'seed'"),
    (json.dumps(_step_result(effective="yes")), "'effective'"),
    (json.dumps(_step_result(extra=1)), "unknown field"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_a_results_line_that_is_not_a_result(tmp_path, line, words):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps(_step_result()) + "\n" + line + "\n")
    _one_line(_faults("--out", out, "--table", cwd=tmp_path), "DataError", "results.jsonl:2", words)


def test_saved_results_make_the_table(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    ctrl = {"kind": "control", "fault": None, "name": "beta-0.1", "settings": {"beta": 0.1}, "findings": [],
            "errors": 0, "diagnose_seconds": 0.1, "seconds": 1.0, "id": "beta-0.1"}
    (out / "results.jsonl").write_text("\n".join(json.dumps(x) for x in (_step_result(), ctrl)) + "\n{cut")
    r = _faults("--out", out, "--table", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "top-1 accuracy: 1/1" in r.stdout and (out / "table.md").is_file()


def test_every_step_fault_patches_what_the_step_code_has():
    """A fault's patch names a function of the step code; a rename there must fail here, not as a crashed case in
    the benchmark's results. Each patch is applied to a session of the embedded model and entered (the session's
    models may be changed by an earlier patch: only the targets' presence is checked)."""
    import contextlib
    import dataclasses
    import warnings

    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.lab.faults import STEP_FAULTS
    from rookworld_debug.lab.faults_heldout import HELDOUT_STEP_FAULTS
    cfg = StepConfig(model="tiny", reward_mode="dataset", batch_size=2, num_generations=2, max_new_tokens=8,
                     eval_max_new_tokens=4, heldout_n=0)
    patched = [f for f in (*STEP_FAULTS, *HELDOUT_STEP_FAULTS) if f.patch is not None]
    assert patched
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = setup(cfg)
    for f in patched:
        ctx = f.patch(dataclasses.replace(s))     # AttributeError when a target is gone
        with ctx if ctx is not None else contextlib.nullcontext():
            pass
