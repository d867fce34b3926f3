"""Consecutive steps replayed: six faults that live between two steps of the hand-written loop (a sampler not synced,
gradients not zeroed, the optimizer re-created, the policy reset, a reference that moves, a reward with memory) are
each named first among the pair's errors; healthy pairs have none; `diagnose` on a folder of two steps shows the
pair's finding; steps of different runs are a named note."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from cli import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{fault: (folder of step 1, folder of step 2)}: the loop's step 1 once, then step 2 under each fault."""
    from rookworld_debug.lab.between_steps import BETWEEN_FAULTS, sweep
    torch.set_num_threads(1)
    return sweep(tmp_path_factory.mktemp("between"), faults=("",) + tuple(BETWEEN_FAULTS))


@pytest.fixture(scope="module")
def pairs(runs):
    """{fault: (ConsecutiveReplay, its findings)} of each run's two steps."""
    return {fault: _pair(folders) for fault, folders in runs.items()}


def _pair(folders):
    from rookworld_debug.diagnosis.replay.consecutive import replay_consecutive
    from rookworld_debug.diagnosis.replay.consecutive_findings import consecutive_findings
    pair = replay_consecutive(*folders)
    return pair, consecutive_findings(pair)


def _errors(found):
    return [f for f in found if f.severity == "error"]


def _check(pair, quantity):
    return next(c for c in pair.checks if c.phase == quantity)


@pytest.mark.parametrize("fault", ["sampler_stale", "grads_carried", "optimizer_recreated", "policy_reset",
                                   "reference_moves", "reward_memory", "scheduler_extra_step"])
def test_a_fault_between_steps_is_named_first_with_its_evidence(pairs, fault):
    from rookworld_debug.lab.between_steps import BETWEEN_FAULTS
    quantity, code = BETWEEN_FAULTS[fault]
    pair, found = pairs[fault]
    errors = _errors(found)
    assert errors and errors[0].code == code, [(f.code, f.cause[:160]) for f in errors]
    assert [f.code for f in errors] == [code]                   # nothing else between the steps is an error
    c = _check(pair, quantity)
    assert c.status == "disagree" and c.cause == code and c.max_abs_diff > c.tolerance
    assert errors[0].step == 2 and pair.steps == (1, 2)
    assert errors[0].evidence[0].name == f"replay/consecutive/{quantity}/difference"


def test_the_fits_say_how_much_was_carried(runs, pairs):
    """The gradient carries step 1's clipped gradient (c = its clip factor); the reference moved half-way to the
    policy; the reward's bonus is the loop's 0.1; a reset policy's sampler, synced to it, is a warning only."""
    from rookworld_debug.grpo.trace.state import read_state
    from rookworld_debug.lab.between_steps import MEMORY_BONUS
    pair, _ = pairs["grads_carried"]
    g1 = read_state(runs["grads_carried"][0]).gradient
    clip = min(1.0, 1.0 / math.sqrt(sum(float(v.double().pow(2).sum()) for v in g1.values())))
    carried = _check(pair, "gradient").fit["params"]["previous step's gradient"]
    assert carried == pytest.approx(clip, rel=1e-3)
    pair, _ = pairs["reference_moves"]
    assert _check(pair, "reference").fit["params"]["alpha"] == pytest.approx(0.5, rel=1e-3)
    pair, _ = pairs["reward_memory"]
    assert _check(pair, "rewards").fit["params"]["shift"] == pytest.approx(MEMORY_BONUS, rel=1e-4)
    pair, found = pairs["policy_reset"]
    sampler = [f for f in found if f.code == "consecutive_sampler"]
    assert _check(pair, "sampler").status == "disagree" and sampler and sampler[0].severity == "warning"


def test_healthy_consecutive_steps_carry_over_every_quantity(pairs):
    pair, found = pairs[""]
    assert not _errors(found), [(f.code, f.cause[:160]) for f in _errors(found)]
    assert {c.phase: c.status for c in pair.checks} == dict.fromkeys(
        ("weights", "optimizer", "scheduler", "sampler", "reference", "gradient", "rewards", "batch"),
        "agree")                                           # rewards: A prompts repeat; the loop's decay per step
    draws = [c for c in pair.checks if c.quantity.startswith("sampler draws")]
    assert len(draws) == 1 and draws[0].status == "agree"  # new random numbers each step
    assert [f.code for f in found] == ["consecutive_agrees"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["dapo, μ = 2, schedule, no sampler copy", "bnpo, 1 micro-batch, β = 0"])
def test_healthy_loops_of_other_shapes_carry_over(tmp_path, shape):
    from rookworld_debug.lab.between_steps import HEALTHY_SHAPES, run_pair
    folders = run_pair(HEALTHY_SHAPES[shape], tmp_path)
    pair, found = _pair(folders)
    assert not _errors(found), [(f.code, f.cause[:160]) for f in _errors(found)]
    assert _check(pair, "weights").status == "agree" and _check(pair, "optimizer").status == "agree"


def test_diagnose_on_a_folder_of_two_steps_lists_the_pair(runs):
    """The optimizer re-created between the steps: each step replays clean on its own; only the pair finds it."""
    folder = runs["optimizer_recreated"][1].parent
    out = run_cli("diagnose", folder, "--json", timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert [p["steps"] for p in data["consecutive"]] == [[1, 2]]
    opt = next(c for c in data["consecutive"][0]["checks"] if c["phase"] == "optimizer")
    assert opt["status"] == "disagree" and opt["cause"] == "optimizer_state_reset"
    top = [f for f in data["findings"] if f["severity"] == "error"]
    assert top and top[0]["code"] == "optimizer_state_reset" and top[0]["step"] == 2
    assert sorted(r["step"] for r in data["replays"]) == [1, 2]
    assert all(r["first_disagreement"] is None for r in data["replays"])


def _other_run(src, dst, *, layers=None, trainable=None):
    """A copy of the recorded step `src` as if of another run: its weights cut to `layers` layers (another
    architecture) or its trainable names changed."""
    from rookworld_debug.grpo.trace import state as S
    from rookworld_debug.lab.between_steps import link_tree
    link_tree(src, dst)               # write_state replaces each file: the source's links are left as they were
    s = S.read_state(dst)

    def keep(d):
        if d is None or layers is None:
            return d
        return {k: v for k, v in d.items() if not k.startswith("transformer.h.") or int(k.split(".")[2]) < layers}
    config = {**s.model_config, **({"n_layer": layers} if layers is not None else {})}
    names = tuple(n for n in s.trainable if n in keep(s.before))
    S.write_state(dst, model_config=config, before=keep(s.before), after=keep(s.after), gradient=keep(s.gradient),
                  reference=keep(s.reference), optimizer=s.optimizer, optimizer_settings=s.optimizer_settings,
                  optimizer_state={n: st for n, st in s.optimizer_state.items() if n in names},
                  trainable=trainable if trainable is not None else names, sampler=keep(s.sampler))
    return dst


def test_steps_of_different_runs_are_a_named_note(runs, tmp_path):
    step1, step2 = runs[""]
    for other in (_other_run(step2, tmp_path / "arch" / "step-2", layers=1),
                  _other_run(step2, tmp_path / "names" / "step-2", trainable=("transformer.wte.weight",))):
        pair, found = _pair((step1, other))
        assert pair.note and [f.code for f in found] == ["steps_not_one_run"], pair.note
        assert found[0].severity == "warning" and "not of one run" in found[0].cause
    pair, found = _pair((step2, step2))
    assert [f.code for f in found] == ["steps_not_one_run"] and "both folders hold step 2" in pair.note


@pytest.mark.slow
def test_a_folder_holding_steps_of_different_runs_is_diagnosed_with_the_note(runs, tmp_path):
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    from rookworld_debug.lab.between_steps import link_tree
    step1, step2 = runs[""]
    _other_run(step2, tmp_path / "arch" / "step-2", layers=1)
    link_tree(step1, tmp_path / "arch" / "step-1")
    d = folder_diagnosis(tmp_path / "arch")              # each step still replayed; the pair is the note
    assert [p.note != "" for p in d.consecutive] == [True]
    assert "steps_not_one_run" in [f.code for f in d.findings]
    assert "check_failed" not in [f.code for f in d.findings]


def test_a_reward_seen_once_is_not_checkable(runs):
    """No (prompt, completion, label) in both steps: the reward check says so, it does not pass."""
    from rookworld_debug.diagnosis.replay.consecutive import rewards_check
    from rookworld_debug.grpo.step import StepTrace
    a, b = (StepTrace.load(f) for f in runs[""])
    other = dataclasses.replace(b, rollout=dataclasses.replace(b.rollout, prompts=tuple("x" + p for p in
                                                                                       b.rollout.prompts)))
    c = rewards_check(a, other)
    assert c.status == "not replayed" and "not checkable" in c.explanation


# the fourth held-out set's consecutive-step faults (FRESH_BETWEEN_FAULTS), as fixed after its first run: a pair each
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["adam_betas_changed_at_resume", "optimizer_state_blocks_reversed",
                                   "sampler_sync_skips_embeddings", "optimizer_stepped_again_after_step"])
def test_a_fresh_fault_between_steps_is_named_first(tmp_path, fault):
    from rookworld_debug.lab.between_steps import BASE, FRESH_BETWEEN_FAULTS, run_pair
    quantity, code = FRESH_BETWEEN_FAULTS[fault]
    pair, found = _pair(run_pair(BASE, tmp_path, fault))
    errors = _errors(found)
    assert errors and errors[0].code == code, [(f.code, f.cause[:160]) for f in errors]
    assert _check(pair, quantity).cause == code


# the sixth and seventh held-out sets' consecutive-step faults (SIXTH_BETWEEN_FAULTS, SEVENTH_BETWEEN_FAULTS) and the
# fifth's sampler rounding, as fixed after their first runs
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["lr_from_config_at_resume", "adam_moments_bf16_at_resume",
                                   "reference_shares_policy_blocks", "sampler_synced_in_bf16",
                                   "sampler_adapter_merged_twice", "sampler_qkv_layout_scrambled"])
def test_a_sixth_set_fault_between_steps_is_named_first(tmp_path, fault):
    from rookworld_debug.lab.between_steps import BASE, NOVEL_BETWEEN_FAULTS, SEVENTH_BETWEEN_FAULTS, \
        SIXTH_BETWEEN_FAULTS, run_pair
    quantity, code = {**NOVEL_BETWEEN_FAULTS, **SIXTH_BETWEEN_FAULTS, **SEVENTH_BETWEEN_FAULTS}[fault]
    pair, found = _pair(run_pair(BASE, tmp_path, fault))
    errors = _errors(found)
    assert errors and errors[0].code == code, [(f.code, f.cause[:160]) for f in errors]
    assert _check(pair, quantity).cause == code


@pytest.mark.slow
def test_a_scheduler_that_did_not_step_after_the_first_step_is_a_warning_naming_both_readings(tmp_path):
    # at the run's first step a schedule stepped per epoch and a skipped per-step schedule leave the same counts
    from rookworld_debug.lab.between_steps import BASE, run_pair
    pair, found = _pair(run_pair(BASE, tmp_path, "scheduler_skipped_on_saved_step"))
    assert not _errors(found)
    warned = [f for f in found if f.code == "scheduler_not_stepped"]
    assert warned and warned[0].severity == "warning" and "per epoch" in warned[0].cause


@pytest.mark.slow
def test_a_batch_handed_again_at_the_next_step_is_a_warning_naming_both_readings(tmp_path):
    # a dataset of exactly one batch repeats it by design: the evidence cannot tell that from a restarted iterator
    from rookworld_debug.lab.between_steps import BASE, run_pair
    pair, found = _pair(run_pair(BASE, tmp_path, "batch_repeated_at_resume"))
    assert not _errors(found)
    c = _check(pair, "batch")
    assert c.status == "suspect" and c.cause == "batch_repeated" and "by design" in c.explanation
    warned = [f for f in found if f.code == "batch_repeated"]
    assert warned and warned[0].severity == "warning" and "skip_first_batches" in warned[0].fix.description


# the eighth held-out set's consecutive-step faults named after its first run: the sampler as an affine mix of the
# start and the update (a·θ_start + c·(θ − θ_start)), and a rollout trained again at the next step
def _affine_case(a: float, c: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    start = {n: torch.randn(s, generator=g) for n, s in (("w", (6, 5)), ("b", (5,)), ("e", (9, 4)))}
    theta = {n: v + 0.01 * torch.randn(v.shape, generator=g) for n, v in start.items()}
    got = {n: a * start[n] + c * (theta[n] - start[n]) for n in start}
    unit = math.sqrt(sum(float((theta[n] - start[n]).pow(2).sum()) for n in start))
    return got, theta, start, unit


@pytest.mark.parametrize("a, c, code, said", [(1.0, 2.0, "sampler_weights_extrapolated", "merged twice"),
                                              (0.0, 1.0, "sampler_base_weights_discarded", "zeros"),
                                              (1.0, 0.25, "sampler_update_scaled", "c = 0.25 = 1/√16"),
                                              (1.0, 0.125, "sampler_update_scaled", "1/8"),
                                              (1.0, 0.37, "sampler_update_scaled", "c = 0.37")])
def test_the_sampler_fitted_as_start_and_update_is_named_by_its_two_scalars(a, c, code, said):
    from rookworld_debug.diagnosis.replay.consecutive_affine import AFFINE_CODES, AffineFit
    got, theta, start, unit = _affine_case(a, c)
    fit = AffineFit(got, theta, start, tuple(start), 1e-3 * unit, unit)
    named = {k: fit.named(k) for k in AFFINE_CODES}
    assert [k for k, v in named.items() if v is not None] == [code]
    weights, sentence = named[code]
    assert said in sentence and "3 parameters" in sentence and "residual" in sentence
    assert all(torch.allclose(weights[n], got[n], atol=1e-5) for n in start)
    assert fit.fit["params"]["c"] == pytest.approx(c, rel=1e-4)
    if c == 0.25:
        assert "rsLoRA" in sentence and "r = 16" in sentence


def test_a_sampler_no_mix_of_start_and_update_reproduces_names_nothing():
    from rookworld_debug.diagnosis.replay.consecutive_affine import AFFINE_CODES, AffineFit
    got, theta, start, unit = _affine_case(1.0, 0.25)
    got["w"] = got["w"] + 0.05 * torch.randn(got["w"].shape, generator=torch.Generator().manual_seed(3))
    fit = AffineFit(got, theta, start, tuple(start), 1e-3 * unit, unit)
    assert all(fit.named(k) is None for k in AFFINE_CODES) and fit.fit is None
    assert AffineFit(got, theta, None, tuple(start), 1e-3 * unit, unit).named(AFFINE_CODES[2]) is None


def _trace(ids, prompts=("p0", "p1"), iteration=0, recorded=True, mu=1, explicit=("num_iterations",)):
    from types import SimpleNamespace as NS
    ids = torch.tensor(ids)
    rollout = NS(completion_ids=ids, prompt_ids=torch.tensor([[1, 2], [1, 3]]), prompts=list(prompts),
                 completion_mask=torch.ones_like(ids), sampling_per_token_logps=-torch.ones(ids.shape),
                 per_token_logps=-torch.ones(ids.shape))
    return NS(rollout=rollout, recorded=NS(iteration=iteration, explicit=explicit) if recorded else None,
              rewards=NS(rewards=torch.tensor([1.0, 0.0])), advantages=NS(advantages=torch.tensor([0.5, -0.5])),
              config=NS(num_iterations=mu))


def test_a_rollout_trained_again_is_reused_unless_declared_a_later_pass():
    from rookworld_debug.diagnosis.replay.consecutive_reuse import rollout_reuse_check
    k = _trace([[5, 6, 7], [8, 9, 10]])
    c = rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 10]]))
    assert c is not None and c.status == "disagree" and c.cause == "rollout_reused" and c.phase == "batch"
    assert "2 rows" in c.explanation and "rewards, advantages" in c.explanation and "iteration 0" in c.explanation
    assert rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 10]], iteration=1)) is None      # a declared later pass
    assert rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 11]])) is None                    # one new row
    assert rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 10]], prompts=("p0", "p2"))) is None
    assert rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 10]], recorded=False)) is None    # nothing declared
    # a loop that never said how many passes it takes: a later pass it did not declare is a warning, not an error
    quiet = rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 10]], explicit=()))
    assert quiet.status == "suspect" and "num_iterations=μ" in quiet.explanation
    assert rollout_reuse_check(k, _trace([[5, 6, 7], [8, 9, 10]], mu=2)).status == "suspect"


@pytest.mark.slow
@pytest.mark.parametrize("fault, said", [("sampler_rslora_scale_ignored", "c = 0.25 = 1/√16"),
                                         ("sampler_base_weights_discarded", "0·θ_start + 1·(θ − θ_start)"),
                                         ("rollout_replayed_at_resume", "row for row")])
def test_an_eighth_set_fault_between_steps_is_named_first(tmp_path, fault, said):
    from rookworld_debug.lab.between_steps import BASE, EIGHTH_BETWEEN_FAULTS, run_pair
    quantity, code = EIGHTH_BETWEEN_FAULTS[fault]
    pair, found = _pair(run_pair(BASE, tmp_path, fault))
    errors = _errors(found)
    assert errors and errors[0].code == code, [(f.code, f.cause[:160]) for f in errors]
    c = _check(pair, quantity)
    assert c.cause == code and said in c.explanation
    assert [x.phase for x in pair.checks if x.status == "disagree"][0] == quantity
    if quantity == "sampler":
        assert c.fit and c.fit["kind"] == "affine_start_update" and any("fit" in e.name for e in errors[0].evidence)
