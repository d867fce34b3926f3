"""The corrected step (`whatif STEP --fix`) against an oracle: for a fault of the hand-written loop whose effect is
confined to one step, the corrected update must be the update the HEALTHY loop takes from the same recorded state and
rollout — the loop's own functions (lab/handloop.py, fault="") fed the recorded ids, masks, rewards and reference
weights, backward, clip, its AdamW loaded with the recorded state, step.

The bound (fp32): the gradients within 1e-4 relative (measured ~2e-6: the two forwards are different code), and the
updates within 1e-4 relative plus what that gradient difference moves AdamW's step by. Adam divides each element by
its own √v̂, so an element whose gradient is float noise (the attention key biases: softmax is invariant to them, their
exact gradient is 0) moves by up to lr on a 1e-9 difference; first order, |∂Δθ_i/∂g_i| ≤ 3·lr·(1−β1)/(1−β1^t) /
(√v̂_i + ε) (the v̂ term adds at most 1.7× the m̂ term at t = 2, β = (0.9, 0.999)).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from cli import run_cli

# a small loop that still has non-zero advantages and KL: 1 prompt of G = 4, completions cut at 116 tokens (the
# embedded model's P completions are ~114–122 long), 2 steps (the second recorded: AdamW has a state)
SMALL = dict(num_prompts=1, max_new_tokens=116, steps=2)
DEFAULT_FAULTS = ("accum_no_divide", "adv_ddof0")
# (no_clip and loss_wrong_aggregation are inert in this small loop: the step replays clean, nothing to correct)
SLOW_FAULTS = ("loss_adv_sign", "loss_kl_sign", "grad_doubled_by_hook", "adv_no_std", "kl_beta_squared",
               "no_zero_grad", "logps_no_temperature", "ref_is_policy", "ref_logps_bf16_stored", "lr_changed",
               "lr_zero", "optimizer_reset", "no_step", "weight_decay_changed", "grad_value_clipped")
GRAD_TOL = 1e-4
UPDATE_TOL = 1e-4


def _config():
    from rookworld_debug.lab.handloop import LoopConfig
    return LoopConfig(**SMALL)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """fault -> its recorded step folder (each loop run once per module)."""
    from rookworld_debug.lab.handloop import run
    done = {}

    def get(fault):
        if fault not in done:           # on the worker's one thread: two would fight the other worker's
            done[fault] = tmp_path_factory.mktemp(fault) / "step-2"
            run(_config(), out=str(done[fault]), fault=fault)
        return done[fault]
    return get


def healthy_step(folder, c):
    """(Δθ, gradient before clipping, AdamW's bias-corrected √v̂ + ε, the AdamW settings) of the healthy loop's
    optimizer step from the step folder's recorded θ_before, optimizer state, rollout and reference weights."""
    from transformers import AutoModelForCausalLM
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.grpo.trace.state import read_state
    from rookworld_debug.lab import handloop as H
    from rookworld_debug.record import EMBEDDED_MODEL
    trace, state = StepTrace.load(folder), read_state(folder)
    model, ref = (AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL, dtype=torch.float32).eval() for _ in "12")
    model.load_state_dict(state.before, strict=False)
    ref.load_state_dict(state.reference, strict=False)
    named = list(model.named_parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr)
    sd = opt.state_dict()
    sd["state"] = {i: {k: v.clone() for k, v in state.optimizer_state[n].items()} for i, (n, _) in enumerate(named)
                   if state.optimizer_state.get(n)}
    opt.load_state_dict(sd)
    r = trace.rollout
    ids, mask, n = r.completion_ids, r.completion_mask, r.completion_ids.shape[0]
    with torch.no_grad():
        ref_logps = H.token_logps(ref, r.prompt_ids, r.prompt_mask, ids, mask, c.temperature)
    adv = H.advantages(trace.rewards.rewards, c.num_generations)
    opt.zero_grad()
    for rows in torch.arange(n).chunk(c.micro_batches):
        lp = H.token_logps(model, r.prompt_ids[rows], r.prompt_mask[rows], ids[rows], mask[rows], c.temperature)
        H.loss_of(lp, None, ref_logps[rows], adv[rows], mask[rows], c, n, mask.sum()).backward()
    grad = {k: p.grad.detach().double().clone() for k, p in named}
    torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_grad_norm)
    opt.step()
    g = opt.param_groups[0]
    b1, b2 = g["betas"]
    t = {k: float(opt.state[p]["step"]) for k, p in named}
    denom = {k: (opt.state[p]["exp_avg_sq"].double() / (1 - b2 ** t[k])).sqrt() + g["eps"] for k, p in named}
    sens = {k: 3 * g["lr"] * (1 - b1) / (1 - b1 ** t[k]) / denom[k] for k, _ in named}
    return {k: p.detach().double() - state.before[k].double() for k, p in named}, grad, sens


def _corrected_gradient(monkeypatch):
    """The corrected step's gradient before clipping, caught on its way to the optimizer."""
    import rookworld_debug.diagnosis.replay.update as U
    caught, real = {}, U.rerun_update

    def spy(before, grad, *a, **kw):
        caught.update({k: v.detach().double().clone() for k, v in grad.items()})
        return real(before, grad, *a, **kw)
    monkeypatch.setattr(U, "rerun_update", spy)
    return caught


def _norm(d, names):
    return math.sqrt(sum(float(d[n].pow(2).sum()) for n in names))


def _oracle(folder, fault, monkeypatch):
    from rookworld_debug.diagnosis.replay.corrected import corrected_step
    from rookworld_debug.grpo.step import StepTrace
    caught = _corrected_gradient(monkeypatch)
    res = corrected_step(StepTrace.load(folder), folder)
    assert res.phase, res.note
    d_h, g_h, sens = healthy_step(folder, _config())
    d_c, names = res.corrected_update, list(res.corrected_update)
    assert set(names) == set(d_h)
    grad_rel = _norm({n: caught[n] - g_h[n] for n in names}, names) / _norm(g_h, names)
    diff = _norm({n: d_c[n] - d_h[n] for n in names}, names)
    moved = _norm({n: sens[n] * (caught[n] - g_h[n]).abs() for n in names}, names)
    bound = UPDATE_TOL * _norm(d_h, names) + moved
    assert grad_rel <= GRAD_TOL, (fault, res.basis, grad_rel)
    assert diff <= bound, (fault, res.basis, diff / _norm(d_h, names), bound / _norm(d_h, names))
    print(f"{fault}: phase {res.phase}; ‖Δg‖/‖g‖ = {grad_rel:.3g}; ‖ΔΔθ‖/‖Δθ‖ = {diff / _norm(d_h, names):.3g} "
          f"(bound {bound / _norm(d_h, names):.3g}); {res.verdict()}")
    return res


@pytest.mark.parametrize("fault", DEFAULT_FAULTS)
def test_the_corrected_update_is_the_healthy_loops(fault, recorded, monkeypatch):
    res = _oracle(recorded(fault), fault, monkeypatch)
    assert res.update_cos < 1 - 1e-6 or res.grad_ratio != pytest.approx(1.0), "the fault changed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("fault", SLOW_FAULTS)
def test_the_corrected_update_is_the_healthy_loops_for_more_faults(fault, recorded, monkeypatch):
    _oracle(recorded(fault), fault, monkeypatch)


# ------------------------------------------------------------------------------- as a user runs it
def test_whatif_fix_json_names_the_verdicts_numbers(recorded):
    r = run_cli("whatif", recorded("accum_no_divide"), "--fix", "--json", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout, parse_constant=lambda x: pytest.fail(f"non-strict JSON: {x}"))
    assert d["phase"] == "gradient" and d["basis"].startswith("gradient_scaled"), d["basis"]
    # the micro-batch losses not divided by the 2 accumulation steps: the recorded gradient is twice the fix's
    assert d["grad_ratio"] == pytest.approx(0.5, rel=1e-4) and d["grad_cos"] == pytest.approx(1.0, abs=1e-6)
    assert d["grad_norm"]["recorded"] == pytest.approx(2 * d["grad_norm"]["corrected"], rel=1e-4)
    angle, flipped, n = d["update_angle_deg"], len(d["rows_flipped"]), len(d["rows"])
    assert f"the fix turns this step's update by {angle:.0f}°" in d["verdict"] and angle > 1
    assert d["verdict"].endswith(f"{flipped} of {n} completions change direction") and n == 4
    assert flipped == sum(row["flipped"] for row in d["rows"])
    assert abs(math.degrees(math.acos(d["update_cos"])) - angle) < 1e-6
    assert len(d["parameters"]) == 5 and d["parameters"][0]["difference"] >= d["parameters"][-1]["difference"]


def test_the_text_table_and_the_diagnosis_name_the_fix(recorded):
    from rookworld_debug.diagnosis.replay import replay_findings, replay_path
    from rookworld_debug.diagnosis.replay.corrected import corrected_step, describe
    from rookworld_debug.grpo.step import StepTrace
    folder = recorded("accum_no_divide")
    replay = replay_path(folder)
    text = describe(corrected_step(StepTrace.load(folder), folder, replay=replay))
    assert text.startswith("the fix turns this step's update by") and "‖g‖ before clipping" in text
    top = replay_findings(replay)[0]
    assert top.code == "gradient_scaled" and "`rookworld-debug whatif STEP --fix`" in top.fix.description


def test_a_step_without_weights_is_refused_by_name(tmp_path):
    from tinymodels import embedded_tokenizer, minimal_recorder
    from rookworld_debug.diagnosis import diagnose_path
    rec = minimal_recorder(embedded_tokenizer())
    rec.rewards(torch.tensor([1.0, 0.0]))
    rec.save(tmp_path)
    r = run_cli("whatif", tmp_path, "--fix", "--json", timeout=300)
    assert r.returncode == 2 and "NoWeightsError" in r.stderr and r.stdout == "", (r.stdout, r.stderr)
    assert not any("--fix" in f.fix.description for f in diagnose_path(tmp_path))


def test_fix_takes_no_arms(tmp_path):
    r = run_cli("whatif", tmp_path, "--fix", "--set", "beta=0.1", timeout=120)
    assert r.returncode == 2 and "ConfigError" in r.stderr and "--set" in r.stderr


# --------------------------------------------------------------------------------------------- the continuation
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_continuation_re_applies_a_ten_times_learning_rate_and_the_fix_lowers_the_kl(recorded):
    """lr_changed: the loop applied 10 × its declared rate (update_scaled a = 10). Two steps × three seeds from the
    recorded state: the bug arm runs at 10 × the recorded rate, the fix at the declared one; a ten times larger
    step moves the policy further from the reference, so the fix's largest KL is the smaller on every seed."""
    r = run_cli("whatif", recorded("lr_changed"), "--fix", "--steps", "2", "--seeds", "3", "--json", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    c = json.loads(r.stdout)["continuation"]
    assert c["bug"]["settings"]["lr"] == pytest.approx(10 * 1e-4, rel=1e-3) and c["steps"] == 2 and c["seeds"] == 3
    kl = next(v for v in c["verdicts"] if v["symptom"] == "kl_spike")
    assert all(b > f for f, b in zip(kl["fix_values"], kl["unchanged_values"])), kl
    from rookworld_debug.whatif.stats import VERDICTS
    assert {v["verdict"] for v in c["verdicts"]} <= set(VERDICTS) and len(c["verdicts"]) == 7
    # KL 1 nat/token is the spike's absolute rule: two steps of the tiny model stay far below it in both arms
    assert kl["verdict"] in ("removed", "cannot tell at this S", "absent in both") and kl["mean_improvement"] > 0
    assert c["seconds_per_step"] > 0


def test_the_continuation_judges_the_fix_on_the_paired_difference_alone():
    """A few steps from one recorded state reach the KL's absolute rule (1 nat/token) in neither arm: there the bug
    is judged on which way the fix moves each symptom over the shared seeds, and a symptom both arms give the same
    value on every seed is none of the bug's."""
    from rookworld_debug.whatif.continuation import _unmoved, paired_only
    from rookworld_debug.whatif.stats import verdict
    from rookworld_debug.whatif.symptoms import symptom
    fix, bug = [0.0094, 0.0018, 0.0060], [0.0095, 0.0019, 0.0061]       # a β too small: the bug's KL a bit larger
    assert verdict(symptom("kl_spike"), "the fix", fix, bug).verdict == "absent in both"     # the run's rule
    kl = paired_only(symptom("kl_spike"))
    assert kl.threshold is None and "paired difference" in kl.definition and "threshold" not in kl.definition
    assert _unmoved(verdict(kl, "the fix", fix, bug)).verdict == "removed"
    assert verdict(kl, "the fix", [0.0096, 0.0018, 0.0062], bug).verdict == "cannot tell at this S"   # seeds split
    same = _unmoved(verdict(paired_only(symptom("reward_drop")), "the fix", [0.1, 0.2, 0.3], [0.1, 0.2, 0.3]))
    assert same.verdict == "absent in both" and "the bug does not move it" in same.reason


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_continuation_re_applies_a_squared_kl_coefficient_and_the_fix_lowers_the_kl(recorded):
    """kl_beta_squared: the loop weights its KL term by β² = 0.0016 for its declared β = 0.04 (the terms' regression
    fits the coefficient). The bug arm runs at that β: a weaker pull to the reference, so on shared seeds its
    largest KL is the larger on every seed, and the fix removes that (measured: 3.6e-5 nats on 0.002–0.009)."""
    r = run_cli("whatif", recorded("kl_beta_squared"), "--fix", "--steps", "2", "--seeds", "3", "--json",
                timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    c = json.loads(r.stdout)["continuation"]
    assert c["bug"]["settings"]["beta"] == pytest.approx(0.04 ** 2, rel=1e-2), c["bug"]
    kl = next(v for v in c["verdicts"] if v["symptom"] == "kl_spike")
    assert all(b > f for f, b in zip(kl["fix_values"], kl["unchanged_values"])), kl
    assert kl["verdict"] == "removed", kl


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_continuation_re_applies_a_doubled_gradient_and_the_fix_halves_its_norm(recorded):
    """accum_no_divide: the micro-batch losses not divided by the 2 accumulation steps, a loss (and gradient) 2 ×
    the declared one. The bug arm is the declared objective with A, β and c_H × 2 (whatif/recorded_bug.py); on shared
    seeds both arms start from the same weights and sample the same completions, so the bug's gradient norm before
    clipping is twice the fix's at the first step, and the fix's largest norm is the smaller on every seed."""
    r = run_cli("whatif", recorded("accum_no_divide"), "--fix", "--steps", "2", "--seeds", "3", "--json", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    c = json.loads(r.stdout)["continuation"]
    assert c["bug"]["settings"]["loss_type"].endswith("_advantages_times_2"), c["bug"]
    assert c["bug"]["settings"]["beta"] == pytest.approx(2 * 0.04, rel=1e-4), c["bug"]
    g = next(v for v in c["verdicts"] if v["symptom"] == "grad_norm_spike")
    assert all(b > f for f, b in zip(g["fix_values"], g["unchanged_values"])) and g["mean_improvement"] > 0, g


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_continuation_re_applies_a_negated_advantage(recorded):
    r = run_cli("whatif", recorded("loss_adv_sign"), "--fix", "--steps", "2", "--seeds", "3", timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the bug re-applied as the declared objective with loss_advantage_sign: the advantages × −1" in r.stdout
    from rookworld_debug.whatif.stats import VERDICTS
    table = r.stdout.split("per step", 1)[1]
    assert sum(v in table for v in VERDICTS) >= 2, table


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_bug_that_is_no_setting_is_said_and_only_the_one_step_comparison_runs(recorded):
    r = run_cli("whatif", recorded("adv_ddof0"), "--fix", "--steps", "2", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "continuation: not run: the recorded bug (advantage_std_ddof) is not a setting" in r.stdout
    assert r.stdout.startswith("the fix turns this step's update by")
