"""A step of the user's own training loop, recorded through `rookworld_debug.record.StepRecorder`, and diagnosis by
replay: the two example trainers run as a user runs them and their steps replay clean; faults written into a
hand-written loop (lab.handloop), one per phase, are localised to their phase and named; missing pieces and hostile
state files are said, not guessed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(argv, cwd, timeout=300):
    return subprocess.run(argv, cwd=cwd, env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module", params=["manual_loop", "mini_loop"])
def example_step(request, tmp_path_factory) -> Path:
    """The example trainer, run as the README says: it trains 2 steps and records step 2."""
    out = tmp_path_factory.mktemp(request.param) / "step-2"
    r = _run([sys.executable, str(ROOT / "examples" / f"{request.param}.py"), "--out", str(out)], ROOT)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert f"recorded step 2: {out}" in r.stdout and "Traceback" not in r.stderr
    return out


def test_example_step_replays_clean_through_the_cli(example_step):
    r = _run([CLI, "diagnose", str(example_step), "--json"], ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    codes = [f["code"] for f in json.loads(r.stdout)["findings"]]
    assert "replay_agrees" in codes and not any(c.startswith("replay_") and c != "replay_agrees" for c in codes)
    assert "replay_incomplete" not in codes, codes                 # weights, gradient, optimizer: all recorded


def test_every_phase_of_an_example_step_is_replayed(example_step):
    from rookworld_debug.diagnosis.replay import PHASES, replay_path
    rep = replay_path(example_step)
    assert rep.first_disagreement is None and not rep.skipped
    assert {c.phase for c in rep.checks} == set(PHASES)
    assert rep.weights == "the weights the loop recorded (state/)"


def test_no_replay_skips_it(example_step):
    r = _run([CLI, "diagnose", str(example_step), "--json", "--no-replay"], ROOT)
    assert r.returncode == 0 and not any(f["code"].startswith("replay_") for f in json.loads(r.stdout)["findings"])


def test_recorded_step_opens_as_a_trace_in_the_step_report(example_step, tmp_path):
    """`rookworld-debug report --trace DIR`: notebook 01 under papermill on the recorded step → report.html."""
    from rookworld_debug.grpo.step import StepTrace
    trace = StepTrace.load(example_step)
    assert trace.recorded is not None and trace.recorded.step == 2 and trace.recorded.trainer.endswith("example")
    r = _run([CLI, "report", "--trace", str(example_step), "--out", str(tmp_path), "--no-progress"], ROOT, 600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert abs(summary["metrics"]["rollout_reward"] - float(trace.rewards.rewards.mean())) < 1e-6


# ------------------------------------------------------------------------------- faults written into a loop
# one fault per phase; each is a change to the loop's own code (lab/handloop.py), recorded through the API
PER_PHASE = ["rows_prompt_major", "reward_shift", "adv_grouping_stride", "logps_unshifted", "loss_adv_sign",
             "accum_no_divide", "optimizer_reset"]


@pytest.mark.parametrize("fault", PER_PHASE)
def test_a_fault_in_a_hand_written_loop_is_localised_and_named(fault, tmp_path):
    from rookworld_debug.diagnosis import diagnose_path
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.lab.handloop import FAULTS, LoopConfig, run
    phase, cause = FAULTS[fault]
    run(LoopConfig(), out=str(tmp_path), fault=fault)
    assert replay_path(tmp_path).first_disagreement.phase == phase
    top = diagnose_path(tmp_path)[0]
    assert top.severity == "error" and top.code == cause, [top.code, top.cause]
    assert top.evidence[0].name == f"replay/{phase}/difference" and top.fix.description


def test_the_healthy_hand_written_loop_replays_clean(tmp_path):
    from rookworld_debug.diagnosis import diagnose_path
    from rookworld_debug.lab.handloop import LoopConfig, run
    run(LoopConfig(loss_type="bnpo", beta=0.1, num_generations=3), out=str(tmp_path))
    found = diagnose_path(tmp_path)
    assert not [f for f in found if f.severity == "error"], [(f.code, f.cause) for f in found]
    assert "replay_agrees" in [f.code for f in found]


# ------------------------------------------------------------------------------- missing pieces, bad input
@pytest.fixture(scope="module")
def tokenizer():
    from tinymodels import embedded_tokenizer
    return embedded_tokenizer()


def _minimal(tokenizer, **kw):
    from tinymodels import minimal_recorder
    return minimal_recorder(tokenizer, **kw)


def test_a_step_with_only_its_rollout_and_rewards_says_what_it_could_not_check(tokenizer, tmp_path):
    from rookworld_debug.diagnosis import diagnose_path
    rec = _minimal(tokenizer)
    rec.rewards(torch.tensor([1.0, 0.0]))
    rec.save(tmp_path)
    found = {f.code: f for f in diagnose_path(tmp_path)}
    assert "replay_incomplete" in found
    missing = found["replay_incomplete"].cause
    assert "scoring" in missing and "the loop recorded no weights" in missing and "update" in missing
    from rookworld_debug.grpo.step import StepTrace
    assert any(m.startswith("weights_before:") for m in StepTrace.load(tmp_path).recorded.missing)


def test_pieces_whose_shapes_disagree_are_refused_by_name(tokenizer):
    from rookworld_debug.errors import DataError
    rec = _minimal(tokenizer)
    rec.logprobs(torch.zeros(2, 5))
    with pytest.raises(DataError, match="policy_logps: shape"):
        rec.build()
    with pytest.raises(DataError, match="rollout: completion_ids"):
        rec.rollout(prompt_ids=torch.zeros(2, 3), prompt_mask=torch.ones(2, 3), completion_ids=torch.zeros(2, 3),
                    completion_mask=torch.ones(2, 4))


def test_a_hostile_state_file_is_refused_by_name(example_step, tmp_path):
    """state.json names its architecture and optimizer; names outside the tables are never looked up."""
    import shutil

    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.trace.state import read_state
    bad = tmp_path / "step"
    shutil.copytree(example_step, bad)
    meta = json.loads((bad / "state" / "state.json").read_text())
    (bad / "state" / "state.json").write_text(json.dumps({**meta, "model_type": "os.system", "optimizer": "eval"}))
    assert read_state(bad).optimizer == ""            # an unknown optimizer: kept as "not replayable"
    with pytest.raises(TraceError, match="rebuilds"):
        replay_path(bad)
    (bad / "state" / "state.json").write_text(json.dumps({**meta, "files": ["../../etc/passwd"]}))
    with pytest.raises(TraceError, match="not recorded-state files"):
        read_state(bad)


# ------------------------------------------------------------------------------- the project's steps, TRL's
def test_a_first_step_that_kept_no_weights_replays_on_its_reloaded_model(tmp_path):
    import warnings

    from rookworld_debug import StepConfig, run_step
    from rookworld_debug.diagnosis.replay import replay_path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_step(StepConfig(reward_mode="dataset", batch_size=2, num_generations=3, max_new_tokens=64,
                            eval_max_new_tokens=8, heldout_n=0, keep_weights="never")).save(tmp_path)
    assert not (tmp_path / "state").exists()
    rep = replay_path(tmp_path)
    assert rep.first_disagreement is None, rep.first_disagreement
    assert "reloaded (its weights hash matches" in rep.weights
    replayed = {c.phase for c in rep.checks if c.status == "agree"}
    assert {"generation", "rewards", "advantages", "scoring", "loss", "gradient"} <= replayed
    assert [c.phase for c in rep.skipped] == ["update"]            # no weights after the update were kept


def test_a_trl_capture_that_agrees_with_its_replay_says_so(trl_demo_run):
    from rookworld_debug.diagnosis.replay import replay_findings, replay_path
    first = sorted(trl_demo_run.glob("captures/step-*"))[0]
    found = {f.code: f for f in replay_findings(replay_path(first))}
    assert "replay_agrees" in found and "advantages" in found["replay_agrees"].cause
    assert "TRL capture kept no weights" in found["replay_incomplete"].cause


@pytest.mark.parametrize("kw,field", [({"loss_type": "nope"}, "loss_type"), ({"bogus": 1}, "bogus"),
                                      ({"beta": -1.0}, "beta"), ({"precision": "int8"}, "precision")])
def test_the_declared_objective_is_checked_when_it_is_declared(tokenizer, kw, field):
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.record import StepRecorder
    with pytest.raises(ConfigError, match=rf"^{field}"):
        StepRecorder(tokenizer, num_generations=2, **kw)


def test_right_padded_prompts_are_moved_left(tokenizer):
    from rookworld_debug.record.recorder import left_padded
    ids = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 1]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    out_ids, out_mask = left_padded(ids, mask)
    assert out_ids.tolist() == [[0, 0, 5, 6], [7, 8, 9, 1]] and out_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
