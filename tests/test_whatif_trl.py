"""What if on a real TRL run (embedded tiny model, a checkpoint after every step): the self-check replays a
captured step from the checkpoint before it (and against the one after it), a wrong checkpoint is refused naming
the first diverging stage, arms change the update; the k-step branch runs TRL's GRPOTrainer."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": str(REPO)}                                  # this checkout, not the installed copy
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def run(trl_checkpointed_run):
    return trl_checkpointed_run


def test_self_check_passes_and_arms_differ(run):
    from rookworld_debug.trl.whatif_branch import trl_whatif
    from rookworld_debug.whatif import arms_from_sets
    res = trl_whatif(run / "captures" / "step-000002", arms_from_sets([["lr=1e-3"], ["beta=0.5"]]),
                     before=run / "run" / "checkpoint-1")
    assert res.self_check.passed, res.self_check.describe()
    stages = {s.stage: s for s in res.self_check.stages}
    assert stages["update"].ok and "checkpoint-2" in stages["update"].definition   # compared with the checkpoint after
    base, big, beta = res.one_step
    assert big.param_delta_norm > 10 * base.param_delta_norm
    assert beta.loss != pytest.approx(base.loss) and beta.grad_norm_pre_clip != pytest.approx(base.grad_norm_pre_clip)
    assert res.steps == 0 and res.branches == ()


def test_a_wrong_checkpoint_is_refused_naming_the_first_stage(run):
    from rookworld_debug.trl.whatif_branch import trl_whatif
    from rookworld_debug.whatif import Arm, SelfCheckError
    with pytest.raises(SelfCheckError) as e:
        trl_whatif(run / "captures" / "step-000003", (Arm("unchanged", {}),), before=run / "run" / "checkpoint-1")
    check = e.value.check
    assert check.first_diverging == "log-probs" and [s.ok for s in check.stages[:2]] == [True, True]
    assert "checkpoint step 1" in str(e.value)                     # the note says which checkpoint it was


def test_cli_on_a_capture(run, tmp_path):
    cap = str(run / "captures" / "step-000002")
    r = subprocess.run([CLI, "whatif", cap, "--before", str(run / "run" / "checkpoint-1"), "--set", "lr=1e-3",
                        "--json", "--out", str(tmp_path / "o"), "--threads", "1"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["source"]["kind"] == "TRL capture" and d["self_check"]["passed"] is True
    r = subprocess.run([CLI, "whatif", cap, "--set", "lr=1e-3"], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and "--before" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([CLI, "whatif", cap, "--before", str(run / "run" / "checkpoint-1"), "--set", "delta_x=2"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 2 and "delta_x" in r.stderr and "Traceback" not in r.stderr


def test_k_step_branch_in_grpo_trainer_shares_seeds(run):
    from trl import GRPOTrainer

    from rookworld_debug.models import load_policy_and_reference
    from rookworld_debug.models.loading import TINY_DIR
    from rookworld_debug.trl.example import tiny_dataset
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    from rookworld_debug.trl.whatif_branch import trl_whatif
    from rookworld_debug.whatif import arms_from_sets
    tok = load_policy_and_reference("tiny").tokenizer

    def factory(args):
        return GRPOTrainer(model=str(TINY_DIR), reward_funcs=rookworld_reward_funcs("dataset"), args=args,
                           train_dataset=tiny_dataset(), processing_class=tok)
    res = trl_whatif(run / "captures" / "step-000003", arms_from_sets([["lr=1e-2"]]), before=run / "run" / "checkpoint-2",
                     steps=2, seeds=2, trainer_factory=factory)
    runs = {(b.arm, b.seed): b for b in res.branches}
    assert len(runs) == 4 and all([r["step"] for r in b.rows] == [3, 4] for b in res.branches)
    for s in (0, 1):      # step 3 starts from the same checkpoint with the same seed: the same rollout reward
        assert runs[("unchanged", s)].rows[0]["rollout_reward"] == runs[("lr=0.01", s)].rows[0]["rollout_reward"]
    assert runs[("unchanged", 0)].rows[0]["rollout_reward"] != runs[("unchanged", 1)].rows[0]["rollout_reward"] or \
        runs[("unchanged", 0)].rows[0]["kl"] != runs[("unchanged", 1)].rows[0]["kl"]
    assert res.verdicts


def _run_folder(root: Path, captured: dict, checkpoints: tuple) -> Path:
    """A TRL run folder's layout: captures/captures.json naming step folders (reasons as the recorder writes them)
    and checkpoint-N folders with an optimizer.pt."""
    caps = root / "captures"
    entries = []
    for step, kind in captured.items():
        (caps / f"step-{step:06d}").mkdir(parents=True)
        (caps / f"step-{step:06d}" / "trace.json").write_text("{}")
        entries.append({"step": step, "path": f"step-{step:06d}", "reasons": [{"trigger": "kl" if kind != "lead-up"
                        else "lead-up", "kind": kind}]})
    (caps / "captures.json").write_text(json.dumps({"format": 1, "captures": entries}))
    for n in checkpoints:
        (root / f"checkpoint-{n}").mkdir()
        (root / f"checkpoint-{n}" / "optimizer.pt").write_bytes(b"")
    return root


def test_a_run_folder_branches_the_update_before_the_flagged_step(tmp_path):
    from rookworld_debug.errors import CheckpointError
    from rookworld_debug.trl.whatif_branch import is_run_folder, pick_branch
    lead = {5: "lead-up", 6: "lead-up", 7: "lead-up", 8: "relative"}
    run = _run_folder(tmp_path / "a", lead, (6, 7))
    assert is_run_folder(run) and not is_run_folder(run / "captures" / "step-000008")
    p = pick_branch(run)
    assert (p.step, p.flagged, p.before.name) == (7, 8, "checkpoint-6") and "step 8 was flagged (kl)" in p.why
    assert pick_branch(run, run / "checkpoint-7").step == 8                 # --before checkpoint-N: step N + 1
    p = pick_branch(_run_folder(tmp_path / "b", lead, (7,)))               # only the checkpoint before the flagged
    assert (p.step, p.before.name) == (8, "checkpoint-7")
    with pytest.raises(CheckpointError, match="step 8 was flagged.*checkpoint-6 or checkpoint-7"):
        pick_branch(_run_folder(tmp_path / "c", lead, ()))
    r = subprocess.run([CLI, "whatif", str(tmp_path / "c"), "--set", "lr=1e-5"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 2 and "CheckpointError" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
