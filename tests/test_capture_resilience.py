"""The TRL capture never ends the user's training run (a real GRPOTrainer on the embedded tiny model): an
out_dir that is a file, a write that fails (a full disk), named steps the run never reaches — training completes,
`cap.errors` says what was lost, the trainer's log warns, and the end of training names the unreached steps.
Held flight-recorder steps written as a trigger's lead-up carry their weights' sha256. trl-demo refuses
impossible settings, as a user runs it."""
from __future__ import annotations

import errno
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def _trainer(out: Path, steps: int = 2):
    from rookworld_debug.trl.example import make_trainer
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    return make_trainer(out, max_steps=steps, max_completion_length=48)   # short budget: fast (mechanics only)


def _capture_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "rookworld_debug capture" in str(w.message)]


def test_an_out_dir_that_is_a_file_never_ends_training(tmp_path, caplog):
    from rookworld_debug.trl.capture import capture_steps
    trainer = _trainer(tmp_path / "run")
    bad = tmp_path / "not-a-folder"
    bad.write_text("a file where the captures should go")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture_steps(trainer, steps=[1, 2, 40], out_dir=bad)
        trainer.train()                                              # no exception: the run goes on
    assert trainer.state.global_step == 2
    assert sorted(cap.errors) == [1, 2] and cap.paths == {}
    assert all("not-a-folder" in e or "Not a directory" in e or "exists" in e for e in cap.errors.values()), cap.errors
    said = _capture_warnings(caught)
    assert any("is a file, not a folder" in m for m in said)               # at attach time
    assert any("step 1" in m and "training goes on" in m for m in said)
    assert cap.unreached == (40,) and any("[40] were never reached" in m for m in said)
    assert "never reached" in caplog.text                                   # and in the trainer's log


def test_a_failing_write_is_recorded_and_the_next_step_is_captured(tmp_path, monkeypatch):
    from rookworld_debug import StepTrace
    from rookworld_debug.grpo import step as step_mod
    from rookworld_debug.trl.capture import capture_steps
    real = step_mod.StepTrace.save

    def full_disk_once(self, path):
        if str(path).endswith("step-000001"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(self, path)
    monkeypatch.setattr(step_mod.StepTrace, "save", full_disk_once)
    trainer = _trainer(tmp_path / "run")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = capture_steps(trainer, steps=[1, 2], out_dir=tmp_path / "caps")
        trainer.train()
    assert trainer.state.global_step == 2
    assert list(cap.errors) == [1] and "No space left on device" in cap.errors[1]
    assert sorted(cap.paths) == [2] and StepTrace.load(cap.paths[2]).capture.global_step == 2
    import json
    index = json.loads((tmp_path / "caps" / "captures.json").read_text())["captures"]
    assert index[0]["step"] == 1 and index[0]["path"] is None and "No space left" in index[0]["error"]
    assert any("step 1" in m for m in _capture_warnings(caught))


def test_held_steps_written_as_lead_up_carry_their_weights_sha256(tmp_path):
    from rookworld_debug import StepTrace
    from rookworld_debug.models.provenance import weights_sha256
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.triggers import Firing
    trainer = _trainer(tmp_path / "run", steps=3)
    start = weights_sha256(trainer.model)

    def at_three(step, metrics, record):
        return Firing("at_three", float(step), 3.0, "user", "test trigger") if step == 3 else None
    cap = capture_steps(trainer, out_dir=tmp_path / "caps", keep_last=2, triggers=[at_three])
    trainer.train()
    assert sorted(cap.paths) == [1, 2, 3] and not cap.errors
    shas = {s: StepTrace.load(p).setup.provenance["weights_sha256"] for s, p in cap.paths.items()}
    assert all(isinstance(v, str) and len(v) == 64 for v in shas.values()), shas
    assert shas[1] == start and len(set(shas.values())) == 3            # each step's own start
    from rookworld_debug.steplog import format_step_log
    assert "weights sha256 None" not in format_step_log(StepTrace.load(cap.paths[1]))


@pytest.mark.parametrize("args,flag", [(["--lr-factor", "0"], "--lr-factor"), (["--lr-factor", "-10"], "--lr-factor"),
                                       (["--lr-factor", "nan"], "--lr-factor"), (["--lr-factor", "inf"], "--lr-factor"),
                                       (["--steps", "5", "--jump-at", "9"], "--jump-at"),
                                       (["--keep-last", "-1"], "--keep-last")])
def test_trl_demo_refuses_impossible_settings(tmp_path, args, flag):
    r = subprocess.run([str(REPO / ".venv/bin/rookworld-debug"), "trl-demo", "--out", str(tmp_path / "d"), *args],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    assert r.returncode == 2, (r.returncode, r.stderr[-1500:])
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("rookworld-debug trl-demo: error: ConfigError:") and flag in last
    assert "Traceback" not in r.stderr and not (tmp_path / "d").exists()     # refused before any work
