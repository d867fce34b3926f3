"""What if: overrides, paired verdicts, the self-check by stage, the one-step counterfactual and k-step branches
on the embedded tiny model, --from-findings, and the CLI as a user runs it (subprocess, stdin closed, timeout)."""
from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from rookworld_debug.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")


# ---------------------------------------------------------------------------------------------- pure parts
def test_sets_parse_aliases_and_refuse_bad_keys():
    from rookworld_debug.whatif.overrides import arms_from_sets, parse_sets
    assert parse_sets(["beta=0.1", "lr=1e-6", "eps=0.3"]) == {"beta": 0.1, "lr": 1e-6, "epsilon_low": 0.3,
                                                                "epsilon_high": 0.3}
    assert parse_sets(["loss_type=grpo", "max_grad_norm=null"]) == {"loss_type": "grpo", "max_grad_norm": None}
    arms = arms_from_sets([["beta=0.5"], ["lr=1e-4", "G=8"]])
    assert [a.name for a in arms] == ["unchanged", "beta=0.5", "lr=0.0001, num_generations=8"]
    for bad, field in ((["nonsense=1"], "nonsense"), (["beta"], "--set"), (["model=gpt2"], "model")):
        with pytest.raises(ConfigError) as e:
            parse_sets(bad)
        assert e.value.field == field


def test_an_override_the_config_refuses_names_the_field():
    from rookworld_debug import StepConfig
    from rookworld_debug.whatif.overrides import apply_overrides
    with pytest.raises(ConfigError) as e:
        apply_overrides(StepConfig(), {"loss_type": "nope"})
    assert "loss_type" in str(e.value)


def test_verdicts_on_hand_made_pairs():
    from rookworld_debug.whatif.stats import Symptom, bootstrap_mean_ci, seeds_needed, verdict
    kl = Symptom("kl_spike", "kl", "max", +1, threshold=0.1)
    v = verdict(kl, "fix", [0.01, 0.02, 0.015], [5.0, 8.0, 6.0])       # every seed back under the threshold
    assert v.verdict == "removed" and v.ci95[0] > 0 and v.mean_improvement == pytest.approx((5 + 8 + 6 - 0.045) / 3)
    v = verdict(kl, "fix", [4.0, 7.5, 5.0], [5.0, 8.0, 6.0])            # reduced but still beyond: not removed
    assert v.verdict == "not removed" and "reduced" in v.reason
    v = verdict(kl, "fix", [0.05, 9.0, 0.05], [5.0, 8.0, 6.0])          # mixed: cannot tell
    assert v.verdict == "cannot tell at this S" and v.seeds_needed > 3
    free = Symptom("entropy_collapse", "entropy", "min", -1)
    assert verdict(free, "same", [1.0, 2.0], [1.0, 2.0]).verdict == "not removed"   # no effect at all
    assert verdict(free, "one", [3.0], [1.0]).verdict == "cannot tell at this S"     # one seed decides nothing
    lo, hi = bootstrap_mean_ci([1.0, 2.0, 3.0, 4.0])
    assert lo < 2.5 < hi and bootstrap_mean_ci([1.0, 2.0, 3.0, 4.0]) == (lo, hi)
    # (t_.975 + t_.8)·sd/√S ≤ δ with sd of [1, 3] = √2, δ = 1: the normal bound 15.7 → 16; t adds a little
    need = seeds_needed([1.0, 3.0], 1.0)
    assert 17 <= need <= 20 and (2.131 + 0.866) * math.sqrt(2) / math.sqrt(need) <= 1.0


def test_symptom_thresholds_follow_the_recorded_history():
    from rookworld_debug.whatif.symptoms import symptom
    g = symptom("grad_norm_spike", {"grad_norm_pre_clip": [0.5, 0.52, 0.49, 0.51, 0.5]})
    assert g.threshold == pytest.approx(0.5 + 8 * 0.1)                  # median + 8·floor (MAD below the floor)
    assert symptom("kl_spike", {"kl": [0.001, 0.002]}).threshold == 1.0   # an absolute rule wins
    assert symptom("entropy_collapse").threshold is None                # no history, no absolute rule
    with pytest.raises(ConfigError):
        symptom("not_a_symptom")


def test_arms_from_findings_and_a_named_error_without_the_diagnosis():
    from rookworld_debug.diagnosis import Evidence, Finding, Fix
    from rookworld_debug.whatif.findings import arms_from_findings
    ev = (Evidence("kl", 9.0, "k3 token mean", "sampled rollout"),)
    fs = [Finding("lr_jump", "error", "the learning rate jumped", ev, Fix("restore it", {"lr": 1e-5},
                                                                          {"learning_rate": 1e-5}), score=2.0),
          Finding("beta_low", "warning", "β too small", ev, Fix("raise β", {"beta": 0.5}), score=1.0),
          Finding("code_only", "info", "a code bug", (), Fix("fix the code", code_change="…"))]
    arms, symptoms = arms_from_findings(fs)
    assert [a.name for a in arms] == ["unchanged", "lr_jump", "beta_low"] and symptoms == ("kl_spike",)
    assert arms_from_findings(fs, trl=True)[0][1].overrides == {"lr": 1e-5}
    with pytest.raises(ConfigError):
        arms_from_findings(fs[2:])


# ---------------------------------------------------------------------------------------------- the tiny model
def _cfg(**kw):
    from rookworld_debug import StepConfig
    base = dict(reward_mode="dataset", batch_size=2, num_generations=4, max_new_tokens=48, eval_max_new_tokens=32,
                heldout_n=2, device="cpu", lr=1e-5, top_k_alternatives=1)
    return StepConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved run_step trace and a run_steps run with a checkpoint after each step."""
    from rookworld_debug import run_step
    from rookworld_debug.grpo.multistep.loop import run_steps
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("whatif")
    run_step(_cfg()).save(out / "step")
    run_steps(_cfg(), 2, checkpoint_every=1, checkpoint_dir=out / "ckpt", keep_traces=False)
    return out


def test_one_step_self_check_passes_and_arms_differ(saved):
    from rookworld_debug.whatif import arms_from_sets, whatif
    res = whatif(saved / "step", arms_from_sets([["lr=1e-3"], ["max_grad_norm=0.01"]]))
    assert res.self_check.passed, res.self_check.describe()
    assert [s.stage for s in res.self_check.stages] == ["rewards", "advantages", "log-probs", "loss", "gradient",
                                                        "update"]
    base, big, clipped = res.one_step
    assert big.param_delta_norm > 10 * base.param_delta_norm               # Adam: update ∝ lr
    assert big.grad_norm_pre_clip == pytest.approx(base.grad_norm_pre_clip)  # same rollout, same gradient
    assert clipped.grad_norm_post_clip == pytest.approx(0.01, rel=1e-3)
    assert set(big.update_to_weight) == set(base.update_to_weight) and all(
        big.update_to_weight[k] >= base.update_to_weight[k] for k in base.update_to_weight)
    d = res.to_dict()
    json.dumps(d)                                                         # JSON-able (NaN → null)
    assert d["self_check"]["passed"] is True and d["arms"][1]["update"]["param_delta_norm"] > 0


def test_an_arm_that_changes_precision_or_placement_applies_it_or_is_refused_by_name(saved):
    """autocast=bf16 runs the arm's forwards under bf16 (a gradient unlike the unchanged arm's); an arm after it
    runs at the saved precision again; a reference device this machine lacks is refused, naming the setting."""
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.models.devices import usable
    from rookworld_debug.whatif import arms_from_sets, whatif
    res = whatif(saved / "step", arms_from_sets([["autocast=bf16"], ["lr=1e-5"]]))
    base, bf16, again = res.one_step
    assert bf16.grad_norm_pre_clip != pytest.approx(base.grad_norm_pre_clip, rel=1e-6)
    assert again.grad_norm_pre_clip == pytest.approx(base.grad_norm_pre_clip, rel=1e-6)
    if not usable("cuda:3"):
        with pytest.raises(ConfigError) as e:
            whatif(saved / "step", arms_from_sets([["reference_device=cuda:3"]]))
        assert e.value.field == "reference_device"


def test_a_wrong_start_fails_the_self_check_at_the_log_probs(saved):
    from rookworld_debug.whatif import SelfCheckError, arms_from_sets, whatif
    with pytest.raises(SelfCheckError) as e:
        whatif(saved / "step", arms_from_sets([["beta=0.5"]]), before=saved / "ckpt" / "step_00002")
    assert e.value.check.first_diverging == "log-probs"
    assert [s.ok for s in e.value.check.stages[:2]] == [True, True]       # rewards and advantages do not see weights


def test_a_run_steps_checkpoint_reproduces_its_next_step_and_branches(saved):
    from rookworld_debug.whatif import arms_from_sets, whatif
    res = whatif(saved / "ckpt" / "step_00001", arms_from_sets([["lr=1e-3"]]), steps=2, seeds=2)
    assert res.self_check.passed, res.self_check.describe()
    ok = {s.stage: s.ok for s in res.self_check.stages}
    assert ok["rewards"] and ok["loss"] and ok["gradient"] and ok["update"] and ok["log-probs"] is None
    runs = {(b.arm, b.seed): b for b in res.branches}
    assert len(runs) == 4 and [r["step"] for r in runs[("unchanged", res.branches[0].seed)].rows] == [1, 2]
    s0 = res.branches[0].seed
    # shared seeds: the first step of both arms samples the same rollout from the same weights → same reward
    assert runs[("unchanged", s0)].rows[0]["rollout_reward"] == runs[("lr=0.001", s0)].rows[0]["rollout_reward"]
    assert res.verdicts and all(v.seeds == 2 for v in res.verdicts)


def test_cli_whatif_as_a_user_runs_it(saved, tmp_path):
    r = subprocess.run([CLI, "whatif", str(saved / "step"), "--set", "beta=0.5", "--set", "lr=1e-4 max_grad_norm=0.5",
                        "--out", str(tmp_path / "o"), "--json", "--threads", "1"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["self_check"]["passed"] is True and [a["name"] for a in d["arms"]] == [
        "unchanged", "beta=0.5", "lr=0.0001, max_grad_norm=0.5"]
    page = (tmp_path / "o" / "whatif.html").read_text()
    assert "Self-check" in page and "update-to-weight" in page and "<script" not in page


@pytest.mark.parametrize("args, words", [
    (["--set", "bogus=1"], "bogus"),
    (["--set", "beta=-1"], "beta"),
    (["--set", "beta=0.5", "--before", "{ckpt}"], "self-check failed at stage 'log-probs'"),
    (["--set", "beta=0.5", "--before", "{missing}"], "--before"),
])
def test_cli_bad_input_is_one_named_line_exit_2(saved, tmp_path, args, words):
    args = [a.format(ckpt=saved / "ckpt" / "step_00002", missing=tmp_path) for a in args]
    r = subprocess.run([CLI, "whatif", str(saved / "step"), *args, "--out", str(tmp_path / "o"), "--threads", "1"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV)
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(err) == 1 and words in err[0] and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_arms_on_a_dask_cluster_match_the_local_run(saved):
    from distributed import Client, LocalCluster

    from rookworld_debug.whatif import arms_from_sets, whatif
    arms = arms_from_sets([["lr=1e-3"]])
    local = whatif(saved / "step", arms, steps=1, seeds=1)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True) as cluster, Client(cluster) as client:
        remote = whatif(saved / "step", arms, steps=1, seeds=1, cluster=client)
    assert [(b.arm, b.seed) for b in remote.branches] == [(b.arm, b.seed) for b in local.branches]
    for a, b in zip(local.branches, remote.branches):
        assert a.rows[0]["rollout_reward"] == b.rows[0]["rollout_reward"] and a.rows[0]["kl"] == pytest.approx(
            b.rows[0]["kl"], rel=1e-5, abs=1e-9)


@pytest.mark.slow
def test_an_unreachable_cluster_is_a_named_error(saved, tmp_path):
    r = subprocess.run([CLI, "whatif", str(saved / "step"), "--set", "lr=1e-3", "--steps", "1", "--seeds", "1",
                        "--cluster", "tcp://127.0.0.1:9", "--out", str(tmp_path / "o"), "--threads", "1"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 2 and "Dask scheduler" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_cli_from_findings(saved, tmp_path):
    """With the diagnosis installed: its findings' fixes become arms (or a named error when none has a setting to
    change); without it: a named error that says so. Either way one line, no traceback."""
    import rookworld_debug.diagnosis as diagnosis
    r = subprocess.run([CLI, "whatif", str(saved / "step"), "--from-findings", "--json", "--out", str(tmp_path / "o"),
                        "--threads", "1"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       env=ENV)
    if not hasattr(diagnosis, "diagnose_path"):
        assert r.returncode == 2 and "diagnose_path is missing" in r.stderr and "Traceback" not in r.stderr
    elif r.returncode == 0:
        d = json.loads(r.stdout)
        assert d["arms"][0]["name"] == "unchanged" and len(d["arms"]) >= 2
        assert all(a["source"].startswith("finding ") for a in d["arms"][1:])
    else:
        # no arm with a setting to change, or a fix that changes the sampling (it needs --steps): one named line
        assert r.returncode == 2 and ("configuration fix" in r.stderr or "needs k-step branches" in r.stderr) \
            and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


def test_a_g2_run_branched_to_g8_measures_reward_noise_next_to_the_prediction(tmp_path):
    from rookworld_debug import run_step
    from rookworld_debug.report.whatif_page import render
    from rookworld_debug.whatif import arms_from_sets, whatif
    # no held-out prompts: the branch's reward noise is measured on the sampled rows (greedy evals are not used)
    run_step(_cfg(num_generations=2, heldout_n=0)).save(tmp_path / "g2")
    res = whatif(tmp_path / "g2", arms_from_sets([["num_generations=8"]]), steps=3, seeds=2, symptoms=("reward_noise",))
    g = res.extra["group_size"]
    assert (g["G_old"], g["G_new"], g["predicted_ratio_sampling"]) == (2, 8, 0.25)
    assert len(g["measured_var_old"]) == len(g["measured_var_new"]) == 2 and g["g_prime_curve"]["sizes"][0] == 2
    assert [a.name for a in res.one_step] == ["unchanged"]           # G changes the sampling: k-step arms only
    assert "Group size G = 2 → 8" in render(res.to_dict())


@pytest.mark.parametrize("b", [None, float("nan"), -0.4])
def test_a_g_prime_sweep_without_a_positive_fit_is_a_note_not_a_crash(b):
    """Short completions can leave every subsampled group's gradient zero: the fit has no b at all."""
    from rookworld_debug.whatif.groupsize import _no_fit_note
    note = _no_fit_note(b)
    assert "no gradient-noise ratio" in note and ("has no fit" in note) == (b is None or b != b)
