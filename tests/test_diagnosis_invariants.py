"""Invariants of a healthy step and run, each a finding when its records break it: the optimizer applied what the
gradient asked, the reference is frozen, the optimized loss is the displayed one, the policy moved toward its
advantages, no setting inverts the objective; run logs: weights that never move, KL exactly 0 after updates, a
training reward that rises while an independent task score falls. Ranking puts a broken invariant before the
signal-quality findings it produces. Records are a real tiny-model step's, changed only where a fault would."""
from __future__ import annotations

import csv
import dataclasses
import json
import time

import pytest
from cli import run_cli


@pytest.fixture(scope="module")
def healthy():
    import torch
    torch.set_num_threads(1)
    from rookworld_debug.lab.faults import P_TASK, run_one
    return run_one(dict(P_TASK), seed=0)


def _codes(trace, step=0):
    from rookworld_debug.diagnosis import diagnose_trace
    return [(f.code, f.severity) for f in diagnose_trace(trace, step=step)]


def test_healthy_step_breaks_no_invariant(healthy):
    codes = {c for c, _ in _codes(healthy)}
    assert not codes & {"optimizer_no_op", "reference_tracks_policy", "loss_path_mismatch",
                        "update_against_advantages", "objective_inverted", "forward_mismatch"}, codes
    assert not [c for c, s in _codes(healthy) if s == "error"]


def test_weights_that_did_not_move_are_an_optimizer_no_op(healthy):
    import torch
    u = dataclasses.replace(healthy.update, param_delta_norm=0.0)
    e = dataclasses.replace(healthy.evaluation, delta_logp=torch.zeros_like(healthy.evaluation.delta_logp))
    found = _codes(dataclasses.replace(healthy, update=u, evaluation=e))
    assert found[0] == ("optimizer_no_op", "error"), found
    # the same records with lr = 0: nothing was asked, nothing is wrong
    u0 = dataclasses.replace(u, lr=0.0)
    assert "optimizer_no_op" not in {c for c, _ in _codes(dataclasses.replace(healthy, update=u0, evaluation=e))}


def test_reference_equal_to_a_moved_policy_is_named(healthy):
    r = dataclasses.replace(healthy.rollout, ref_per_token_logps=healthy.rollout.per_token_logps.clone())
    t = dataclasses.replace(healthy, rollout=r)
    assert ("reference_tracks_policy", "error") in _codes(t, step=3)
    assert "reference_tracks_policy" not in {c for c, _ in _codes(t, step=0)}   # before any update: as it must be


def test_loss_the_optimizer_saw_differs_from_the_record(healthy):
    u = dataclasses.replace(healthy.update, loss_record_diff=2e-3)
    its = (dataclasses.replace(healthy.iterations[0], updates=(u, *healthy.iterations[0].updates[1:])),
           *healthy.iterations[1:])
    found = _codes(dataclasses.replace(healthy, update=u, iterations=its))
    assert ("loss_path_mismatch", "error") in found, found


def test_update_against_its_advantages(healthy):
    e = dataclasses.replace(healthy.evaluation, corr_adv_delta_logp=-0.97, frac_moved_with_advantage=0.0)
    found = _codes(dataclasses.replace(healthy, evaluation=e))
    assert found[0] == ("update_against_advantages", "error"), found
    assert healthy.evaluation.corr_adv_delta_logp > 0          # the healthy step moved with its advantages


def test_settings_that_invert_the_objective(healthy):
    rw = dataclasses.replace(healthy.rewards, weights=tuple(-1.0 for _ in healthy.rewards.weights))
    found = _codes(dataclasses.replace(healthy, rewards=rw))
    assert found[0] == ("objective_inverted", "error"), found
    neg = dataclasses.replace(healthy, config=healthy.config.replace(entropy_coef=-0.5))
    assert ("entropy_coef_negative", "warning") in _codes(neg)


def test_a_forward_mismatch_without_dropout_is_not_called_dropout(healthy):
    u = healthy.iterations[0].updates[0]
    moved = dataclasses.replace(u, per_token_logps=u.per_token_logps + 0.01)
    its = (dataclasses.replace(healthy.iterations[0], updates=(moved, *healthy.iterations[0].updates[1:])),)
    codes = [c for c, _ in _codes(dataclasses.replace(healthy, iterations=its))]
    assert codes[0] == "forward_mismatch" and "dropout_active" not in codes, codes


def test_rank_puts_a_broken_invariant_before_its_symptoms():
    from rookworld_debug.diagnosis.findings import Finding, Fix, rank
    def f(code, sev, score):
        return Finding(code=code, severity=sev, cause=code, evidence=(), fix=Fix(""), score=score)
    found = rank([f("grad_clip_binding", "error", 9.9), f("tiny_sigma_groups", "warning", 5.0),
                  f("sampler_precision", "warning", 6.0), f("truncation", "warning", 4.5)])
    assert [x.code for x in found] == ["sampler_precision", "truncation", "grad_clip_binding", "tiny_sigma_groups"]
    plain = rank([f("grad_clip_binding", "error", 6.0), f("truncation", "warning", 9.0)])
    assert [x.code for x in plain] == ["grad_clip_binding", "truncation"]      # no upstream: severity first


def _rows(n=6, **cols):
    return [{"step": k + 1, "learning_rate": 1e-5, "grad_norm": 0.5, **{c: v[k] for c, v in cols.items()}}
            for k in range(n)]


def test_run_invariants_on_rows():
    from rookworld_debug.diagnosis.registry import diagnose_rows
    kl0 = diagnose_rows(_rows(kl=[0.0] * 6, beta=[0.1] * 6, param_delta_norm=[0.02] * 6))
    assert kl0[0].code == "reference_tracks_policy" and kl0[0].step == 2, [f.code for f in kl0]
    still = diagnose_rows(_rows(kl=[0.0] * 6, beta=[0.1] * 6, param_delta_norm=[0.0] * 6))
    assert still[0].code == "optimizer_no_op" and still[0].step == 1
    healthy = diagnose_rows(_rows(kl=[0.0, 1e-4, 2e-4, 3e-4, 4e-4, 5e-4], beta=[0.1] * 6,
                                  param_delta_norm=[0.02] * 6))
    assert not [f for f in healthy if f.severity == "error"]
    apart = diagnose_rows(_rows(reward=[0.1, 0.2, 0.3, 0.41, 0.5, 0.6], heldout_reward=[0.6, 0.5, 0.41, 0.3, 0.2, 0.1]))
    assert apart[0].code == "reward_task_diverge" and apart[0].severity == "error"
    together = diagnose_rows(_rows(reward=[0.1, 0.2, 0.3, 0.41, 0.5, 0.6], heldout_reward=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]))
    assert "reward_task_diverge" not in {f.code for f in together}
    inv = diagnose_rows([{"step": 1, "learning_rate": -1e-5, "grad_norm": 0.5}])
    assert inv[0].code == "objective_inverted"


def test_run_invariants_on_a_long_log_are_fast():
    from rookworld_debug.diagnosis.registry import diagnose_rows
    n = 10_000
    rows = _rows(n, kl=[1e-3] * n, beta=[0.1] * n, param_delta_norm=[0.02] * n, reward=[k % 7 / 7 for k in range(n)],
                 heldout_reward=[k % 5 / 5 for k in range(n)])
    t0 = time.perf_counter()
    diagnose_rows(rows)
    assert time.perf_counter() - t0 < 10.0


def test_diagnose_cli_reads_a_run_table(tmp_path):
    """`rookworld-debug diagnose RUN` on a run folder whose table.csv shows KL 0 after updates: exit 1, named."""
    run = tmp_path / "run"
    run.mkdir()
    cols = ["step", "beta", "lr", "kl", "grad_norm_pre_clip", "param_delta_norm", "rollout_reward"]
    with open(run / "table.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for k in range(4):
            w.writerow([k, 0.1, 1e-5, 0.0, 0.4, 0.02, 0.1 * k])
    p = run_cli("diagnose", run, "--json", timeout=120)
    assert p.returncode == 1, p.stderr
    found = json.loads(p.stdout)["findings"]
    assert found[0]["code"] == "reference_tracks_policy" and found[0]["step"] == 2
    assert found[0]["evidence"] and all(e["definition"] for e in found[0]["evidence"])


@pytest.mark.slow
def test_real_injections_are_named_first():
    """The optimizer built over a copy of the policy; the reference that is the policy object (live session)."""
    import torch
    torch.set_num_threads(1)
    from rookworld_debug.lab.faults import P_TASK, run_one
    from rookworld_debug.lab.faults_heldout import _optimizer_over_copy, _reference_is_policy
    assert _codes(run_one(dict(P_TASK), patch=_optimizer_over_copy, seed=1))[0] == ("optimizer_no_op", "error")
    assert _codes(run_one(dict(P_TASK), patch=_reference_is_policy, seed=1))[0] == ("reference_tracks_policy", "error")
