"""`rookworld-debug run --keep-steps` keeps every step with its weights, and `diagnose` on them checks what carries
over between consecutive ones: on a healthy run of this package's own step every carry-over check that can run
agrees (the weights, the optimizer's state, the reference, the gradient, the rewards)."""
from __future__ import annotations

import json

import pytest

from cli import run_cli


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_run_keeps_its_steps_and_what_carries_over_between_them_replays_clean(tmp_path):
    out = tmp_path / "run"
    r = run_cli("run", "--steps", "2", "--keep-steps", "--no-progress", "--heldout-every", "10", "--set",
                "reward_mode=dataset", "--set", "max_new_tokens=48", "--set", "batch_size=2", "--out", out,
                cwd=tmp_path, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = sorted(p.name for p in (out / "steps").iterdir())
    assert steps == ["step-00001", "step-00002"]
    assert all((out / "steps" / s / "state").is_dir() for s in steps)       # the weights, kept
    d = run_cli("diagnose", out / "steps", "--json", timeout=1200)
    j = json.loads(d.stdout)
    # a healthy run: no error but the one its 48-token budget causes (P completions run ~115 tokens: all cut);
    # a later step of the run is after an update, so its policy is not the reference (no reference_not_start)
    errors = {f["code"] for f in j["findings"] if f["severity"] == "error"}
    assert errors <= {"all_truncated"}, (errors, d.stderr[-3000:])
    assert len(j["replays"]) == 2 and len(j["consecutive"]) == 1          # each step, and the pair
    pair = j["consecutive"][0]
    ran = {c["phase"]: c["status"] for c in pair["checks"] if c["status"] != "not replayed"}
    assert ran.get("weights") == "agree" and ran.get("optimizer") == "agree", pair["checks"]
    assert set(ran.values()) == {"agree"}, pair["checks"]
