"""The flight recorder on a real TRL GRPOTrainer run (embedded tiny model). A callback multiplies the
learning rate by 10^4 after step JUMP-2, so the update of step JUMP-1 is huge and the KL at step JUMP jumps; the recorder (K held steps, the
built-in triggers) must write step JUMP and the K steps before it, name the trigger, keep captures.json up to
date, leave training bit-identical, and every written step must open as a StepTrace."""
from __future__ import annotations

import json
import os

import pytest
import torch

STEPS, JUMP, K = 6, 5, 2
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                                        "ignore::DeprecationWarning")


def _weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def _lr_jump():
    from transformers import TrainerCallback

    class LRJump(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kw):
            if state.global_step == JUMP - 2:   # the update of step JUMP-1 is huge: KL at step JUMP jumps
                for g in optimizer.param_groups:
                    g["lr"] *= 1e4
                    g["initial_lr"] = g.get("initial_lr", g["lr"]) * 1e4
    return LRJump()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer

    out = tmp_path_factory.mktemp("fr")
    runs = {}
    for name, with_capture in (("captured", True), ("plain", False)):
        trainer = make_trainer(out / name, max_steps=STEPS, learning_rate=1e-5, lr_scheduler_type="constant",
                               max_completion_length=48)              # short budget: fast
        trainer.add_callback(_lr_jump())
        cap = capture_steps(trainer, out_dir=out / "captures", keep_last=K, triggers="default") if with_capture else None
        trainer.train()
        runs[name] = {"trainer": trainer, "cap": cap, "w": _weights(trainer),
                      "logged": {d["step"]: d for d in trainer.state.log_history if "loss" in d}}
    runs["out"] = out
    return runs


def test_trigger_writes_the_jump_step_and_its_lead_up(run):
    cap = run["captured"]["cap"]
    assert cap.errors == {}
    index = json.loads((run["out"] / "captures" / "captures.json").read_text())
    by_step = {e["step"]: e for e in index["captures"]}
    assert JUMP in by_step, (by_step, [(s, d.get("kl")) for s, d in run["captured"]["logged"].items()])
    fired = [r for r in by_step[JUMP]["reasons"] if r["kind"] in ("absolute", "relative")]
    assert fired and all(r["trigger"] and "threshold" in r for r in fired)
    assert any(r["trigger"] == "kl" for r in fired), fired
    for s in range(JUMP - K, JUMP):             # the K held steps before it, marked as lead-up
        assert s in by_step and by_step[s]["reasons"][0]["kind"] == "lead-up"
    # a held step is written only as a lead-up or for its own firing (e.g. step 1: every completion truncated)
    for s, e in by_step.items():
        assert s >= JUMP - K or any(r["kind"] in ("absolute", "relative") for r in e["reasons"]), (s, e)
    assert len(by_step) < STEPS


def test_written_steps_open_and_carry_their_reasons(run):
    from rookworld_debug import StepTrace
    cap = run["captured"]["cap"]
    for step, path in cap.paths.items():
        tr = StepTrace.load(path)
        assert tr.capture.global_step == step
        assert tr.setup.provenance["capture_reasons"]
        logged = run["captured"]["logged"][step]["loss"]
        assert abs(tr.capture.trl_loss - logged) <= 1e-5


def test_recording_every_step_leaves_training_bit_identical(run):
    assert torch.equal(run["captured"]["w"], run["plain"]["w"])


def test_user_trigger_and_every(tmp_path):
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer
    from rookworld_debug.trl.triggers import Firing

    seen = []

    def on_step_three(step, metrics, record):
        seen.append((step, sorted(metrics)[:3], record["gen"]["completion_ids"].shape[0]))
        return Firing("mine", float(step), 3.0, "user") if step == 3 else None

    trainer = make_trainer(tmp_path / "t", max_steps=4, max_completion_length=48)
    cap = capture_steps(trainer, out_dir=tmp_path / "c", every=2, keep_last=1, triggers=[on_step_three])
    trainer.train()
    index = json.loads((tmp_path / "c" / "captures.json").read_text())
    reasons = {e["step"]: [r["trigger"] for r in e["reasons"]] for e in index["captures"]}
    assert reasons == {2: ["named"], 3: ["mine"], 4: ["named"]}, reasons
    assert [s for s, *_ in seen] == [1, 2, 3, 4]
