"""Fitted parameters named in the step's own quantities: a scale that is a ratio of two token counts of the step is
said as that ratio and what each count is; one that matches nothing says so; advantages standardised over another
grouping name the grouping; a keyword the loop passed itself and contradicts is an error; num_iterations > 1
without `iteration` is a note, with the pass read from the records."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rookworld_debug.diagnosis.replay.resolve import resolve, resolve_checks, step_quantities

G, B, T = 4, 2, 6


@pytest.fixture(scope="module")
def tokenizer():
    from tinymodels import embedded_tokenizer
    return embedded_tokenizer()


def _recorder(tokenizer, *, truncated=(0, 1, 2, 3), g=G, **declared):
    """N = 8 rows of T = 6 tokens; `truncated` rows have no EOS (the loop masks them out, as TRL's
    mask_truncated_completions does); the others end at an EOS at position 2 + row % 3."""
    from rookworld_debug.record import StepRecorder
    eos = tokenizer.eos_token_id
    n = B * G
    ids = torch.full((n, T), 65)
    mask = torch.zeros(n, T, dtype=torch.long)
    for i in range(n):
        if i in truncated:
            continue
        end = 2 + i % 3
        ids[i, end], ids[i, end + 1:] = eos, eos
        mask[i, :end + 1] = 1
    rec = StepRecorder(tokenizer, num_generations=g, mask_truncated_completions=True, **declared)
    enc = tokenizer(["A: 8/8/8/8/8/8/8/K6 w - - 0 1+a1a2++"] * n, return_tensors="pt", padding=True)
    rec.rollout(prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask, completion_ids=ids, completion_mask=mask)
    rec.rewards(REWARDS)                  # identical completions (rows 0–3; rows 4 and 7) score alike
    return rec


REWARDS = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.2, 0.5, 0.9, 0.2])


def _q(trace) -> dict:
    return {q.key: q.value for q in step_quantities(trace)}


def test_the_step_defines_its_counts_from_its_own_masks(tokenizer):
    trace = _recorder(tokenizer).build()
    q = _q(trace)
    mask = trace.rollout.completion_mask
    assert q["tokens_in_loss"] == float(mask.sum()) == 4 + 5 + 3 + 4   # rows 4–7: EOS at 2 + i % 3, kept
    assert q["tokens_with_truncated"] == q["tokens_in_loss"] + 4 * T    # the 4 truncated rows run to T
    assert (q["N"], q["B"], q["G"], q["T"], q["NT"]) == (8, 2, 4, T, 8 * T)
    assert q["rows_truncated"] == 4 and "tokens_ended" not in q       # the same set as the in-loss tokens here


def test_a_ratio_of_two_counts_is_named_with_both_counts(tokenizer):
    trace = _recorder(tokenizer).build()
    q = _q(trace)
    k = q["tokens_in_loss"] / q["tokens_with_truncated"]
    got = resolve(k * (1 + 2e-7), step_quantities(trace), 1e-6)
    assert got.expression == f"{int(q['tokens_in_loss'])} / {int(q['tokens_with_truncated'])}"
    assert "in-loss tokens" in got.meaning and "truncated rows" in got.meaning
    assert "the denominator counts the truncated rows' tokens" in got.mechanism
    assert got.tried > 100 and got.sentence().startswith(f"{k:.4g} = ")


def test_a_number_the_step_does_not_define_says_so(tokenizer):
    qs = step_quantities(_recorder(tokenizer, beta=0.04).build())
    got = resolve(0.4903, qs, 1e-6)
    assert got.expression is None and "matches none of the step's own quantities" in got.sentence()
    assert str(got.tried) in got.sentence()


def test_equal_quantities_are_all_named(tokenizer):
    """B = 2 and the 2 micro-batches: a scale of 1/2 is either; the step cannot tell them apart."""
    qs = step_quantities(_recorder(tokenizer, gradient_accumulation_steps=2).build())
    got = resolve(0.5, qs, 1e-9)
    assert got.expression == "1 / 2" and got.also and "cannot tell them apart" in got.sentence()


def test_a_loss_total_that_is_a_ratio_of_counts_is_a_named_scale(tokenizer):
    from rookworld_debug.diagnosis.replay.compare import scalar
    trace = _recorder(tokenizer).build()
    q = _q(trace)
    ours = 0.8731
    c = scalar("loss", "loss: the loop's backpropagated loss", ours * q["tokens_in_loss"] / q["NT"], ours, 1e-5)
    (got,) = resolve_checks(trace, [c])
    assert got.cause == "loss_scaled"
    assert f"{int(q['tokens_in_loss'])} / {int(q['NT'])}" in got.explanation
    assert "every completion position, padding included" in got.explanation
    assert got.fit["resolved"][0]["equals"] == f"{int(q['tokens_in_loss'])} / {int(q['NT'])}"
    # a ratio no quantity gives: no cause is claimed, the tried candidates are kept
    c = scalar("loss", "loss", ours * 0.61237, ours, 1e-5)
    (got,) = resolve_checks(trace, [c])
    assert got.cause == "" and got.fit["resolved"][0]["equals"] is None


def test_a_count_ratio_of_one_total_is_no_scale_when_negative_or_refuted_by_the_gradient(tokenizer):
    """One number always fits a scale, so a match to the step's counts is a claim only when nothing refutes it: a
    negative ratio is no ratio of counts; a gradient that is not k × the declared one refutes a loss scaled by k;
    a gradient scaled alike (a scale fit, or every term's coefficient k × declared) confirms it."""
    from rookworld_debug.diagnosis.replay.compare import scalar
    from rookworld_debug.diagnosis.replay.records import DISAGREE, PhaseCheck
    trace = _recorder(tokenizer).build()
    q = _q(trace)
    ours, k = 0.8731, q["tokens_in_loss"] / q["NT"]
    (neg,) = resolve_checks(trace, [scalar("loss", "loss", -k * ours, ours, 1e-5)])
    assert neg.cause == "" and neg.fit["resolved"] == []

    def grad(fit):
        return PhaseCheck("gradient", "gradient", DISAGREE, 0.5, 1e-3, cause="replay_gradient", fit=fit)
    loss = scalar("loss", "loss", k * ours, ours, 1e-5)
    other = {"kind": "terms", "residual": 0.9, "params": {"policy term": {"fitted": 0.02, "declared": 1.0}}}
    got, _ = resolve_checks(trace, [loss, grad(other)])
    assert got.cause == "" and got.fit["refuted_by"] == "gradient" and "by coincidence" in got.explanation
    alike = {"kind": "terms", "residual": 1e-6, "params": {"policy term": {"fitted": k, "declared": 1.0},
                                                            "KL term (per unit β)": {"fitted": 0.04 * k, "declared": 0.04}}}
    for fit in ({"kind": "scaled", "params": {"scale": k}}, alike):
        got, _ = resolve_checks(trace, [loss, grad(fit)])
        assert got.cause == "loss_scaled", fit


def test_a_total_a_few_tolerances_off_is_named_only_by_a_variant_far_closer_and_alone():
    from rookworld_debug.diagnosis.replay.compare import scalar
    ours, rec = 7.852e-05, 1.04615e-04                  # 2.6 tolerances apart
    c = scalar("loss", "loss", rec, ours, 1e-5, variants={"a": (1.04614e-04, "A"), "b": (9.0e-05, "B")})
    assert c.cause == "a" and c.explanation == "A"
    c = scalar("loss", "loss", rec, ours, 1e-5, variants={"a": (1.04614e-04, "A"), "b": (1.046145e-04, "B")})
    assert c.cause == ""                                  # two causes as close: neither is named
    c = scalar("loss", "loss", rec, ours, 1e-5, variants={"a": (1.0e-04, "A")})
    assert c.cause == ""                                  # within tolerance, but not 100 × closer than ours


def test_a_fitted_gradient_scale_is_resolved_and_carried_in_the_json(tokenizer):
    from rookworld_debug.diagnosis.replay.records import DISAGREE, PhaseCheck
    trace = _recorder(tokenizer, gradient_accumulation_steps=2).build()
    k = 1 / 8
    c = PhaseCheck("gradient", "gradient", DISAGREE, 0.8, 1e-3, cause="gradient_scaled",
                   explanation=f"the recorded gradient is {k:.4g} × the loss's gradient",
                   fit={"kind": "scaled", "params": {"scale": k}, "residual": 1e-7, "sentence": ""})
    (got,) = resolve_checks(trace, [c])
    d = got.to_dict()["fit"]["resolved"][0]
    assert d["equals"] == "1 / 8" and d["parameter"] == "scale" and d["candidates_tried"] > 100
    assert "N rows" in d["meaning"] or "N rows" in " ".join(d["also"])


def test_a_kl_coefficient_off_by_a_token_share_is_resolved(tokenizer):
    """The KL term averaged over every completion position: its coefficient is β × in-loss tokens / N·T."""
    from rookworld_debug.diagnosis.replay.records import DISAGREE, PhaseCheck
    trace = _recorder(tokenizer, beta=0.04).build()
    q = _q(trace)
    fitted = 0.04 * q["tokens_in_loss"] / q["NT"]
    c = PhaseCheck("loss", "gradient", DISAGREE, 0.1, 1e-3, cause="loss_terms", explanation="other coefficients",
                   fit={"kind": "terms", "residual": 1e-6, "sentence": "",
                        "params": {"policy term": {"fitted": 1.0, "declared": 1.0},
                                   "KL term (per unit β)": {"fitted": fitted, "declared": 0.04}}})
    (got,) = resolve_checks(trace, [c])
    (d,) = got.fit["resolved"]
    assert d["parameter"].startswith("KL term") and d["equals"] == f"{int(q['tokens_in_loss'])} / {int(q['NT'])}"
    assert "the term is divided by N·T completion positions" in got.explanation


# ------------------------------------------------------------------------------------------- groupings named
def test_advantages_standardised_per_micro_batch_name_the_micro_batches(tokenizer):
    from rookworld_debug.diagnosis.replay.data_phases import advantages_check
    rec = _recorder(tokenizer, g=2, gradient_accumulation_steps=2)       # 4 groups of 2, 2 micro-batches of 4
    per_mb = torch.cat([(x - x.mean()) / (x.std() + 1e-4) for x in REWARDS.view(2, 4)])
    rec.advantages(per_mb)
    c = advantages_check(rec.build())
    assert c.status == "disagree" and c.cause == "advantage_grouping"
    assert "each micro-batch (2 of 4 rows)" in c.explanation, c.explanation


def test_advantages_over_the_whole_batch_name_the_batch(tokenizer):
    from rookworld_debug.diagnosis.replay.data_phases import advantages_check
    rec = _recorder(tokenizer)
    rec.advantages((REWARDS - REWARDS.mean()) / (REWARDS.std() + 1e-4))
    c = advantages_check(rec.build())
    assert c.cause == "advantage_grouping" and "the whole batch of N = 8 rows" in c.explanation


# ----------------------------------------------------------------------------- what the loop said, and did not
def test_the_keywords_the_loop_passed_are_kept_through_a_save(tokenizer, tmp_path):
    from rookworld_debug.grpo.step import StepTrace
    rec = _recorder(tokenizer, kl_estimator="k3", beta=0.1)
    assert rec.explicit == ("beta", "kl_estimator", "mask_truncated_completions", "num_generations")
    rec.save(tmp_path / "s")
    assert StepTrace.load(tmp_path / "s").recorded.explicit == rec.explicit


def test_a_passed_keyword_contradicted_is_an_error_a_default_a_warning():
    from rookworld_debug.diagnosis.replay.declaration import DeclarationFit
    from rookworld_debug.diagnosis.replay.findings import declaration_finding
    fit = DeclarationFit("kl_estimator", "k3", "k1", "loss", "loss", 0.3, 1e-5)
    said = declaration_finding(fit, ("kl_estimator", "beta"))
    assert said.severity == "error" and "passed kl_estimator='k3' to StepRecorder yourself" in said.cause
    unsaid = declaration_finding(fit, ("beta",))
    assert unsaid.severity == "warning" and "left kl_estimator at its default 'k3'" in unsaid.cause


def _two_pass(tokenizer, old_shift: float, **declared):
    rec = _recorder(tokenizer, num_iterations=2, **declared)
    lp = -torch.rand(8, T) * rec.pieces["rollout"]["completion_mask"]
    rec.logprobs(lp, old=lp + old_shift * rec.pieces["rollout"]["completion_mask"], training=False)
    return rec.build()


def test_an_undeclared_pass_is_read_from_the_records(tokenizer):
    from rookworld_debug.diagnosis.replay.declaration import with_inferred_pass
    from rookworld_debug.diagnosis.replay.findings import pass_finding
    trace, note = with_inferred_pass(_two_pass(tokenizer, 0.3))
    assert note.inferred == 1 and trace.recorded.iteration == 1 and "0.3" in note.why
    f = pass_finding(note)
    assert f.severity == "warning" and f.code == "declaration_incomplete"
    assert "iteration=" in f.fix.description and "rec.sampler" in f.fix.description
    # π_old equal to the loss forward's: the first pass, as the default says; nothing to note
    trace, note = with_inferred_pass(_two_pass(tokenizer, 0.0))
    assert note is None and trace.recorded.iteration == 0
    # a loop that passed iteration itself is taken at its word
    assert with_inferred_pass(_two_pass(tokenizer, 0.3, iteration=0))[1] is None


@pytest.mark.parametrize("declared", [dict(num_iterations=2), {}], ids=["mu_declared", "mu_left_at_default"])
def test_an_undeclared_later_pass_gets_no_error_from_the_sampler_checks(tokenizer, declared):
    """π_old ≠ the loss forward's (a later pass), the sampler's log-probs π_old's: no sampler mismatch, no error,
    whether the loop passed num_iterations=2 or left it at its default 1 (then the note names both keywords)."""
    from rookworld_debug.diagnosis.registry import diagnose_step
    rec = _recorder(tokenizer, **declared)
    m = rec.pieces["rollout"]["completion_mask"]
    lp = -torch.rand(8, T) * m
    rec.pieces["rollout"]["sampling_logps"] = (lp + 0.3 * m).float()
    rec.logprobs(lp, old=lp + 0.3 * m, training=False)
    found, rep = diagnose_step(rec.build())
    note = next(f for f in found if f.code == "declaration_incomplete")
    assert not [f for f in found if f.severity == "error"], [(f.code, f.cause[:200]) for f in found]
    assert ("left num_iterations at its default 1" in note.cause) == (not declared), note.cause
    # a loop that passed num_iterations=1 itself is taken at its word: π_old moved, so π_old is the finding
    rec = _recorder(tokenizer, num_iterations=1)
    rec.logprobs(lp, old=lp + 0.3 * m, training=False)
    assert "declaration_incomplete" not in [f.code for f in diagnose_step(rec.build())[0]]


# ------------------------------------------------------------------------------------- a loop's real fault
@pytest.mark.slow
def test_a_dapo_denominator_that_counts_truncated_rows_is_named_by_its_counts(tmp_path):
    """A hand-written loop (its own sampler, loss and optimizer) whose token-normalised loss divides by the tokens
    counted before the truncated rows were masked: the diagnosis names both counts (about 3 minutes)."""
    from rookworld_debug.diagnosis import diagnose_path
    from rookworld_debug.lab.handloop import LoopConfig, run
    run(LoopConfig(loss_type="dapo", mask_truncated=True, max_new_tokens=120, steps=1, num_prompts=3),
        out=str(tmp_path), fault="dapo_tokens_with_truncated")
    top = diagnose_path(tmp_path)[0]
    from rookworld_debug.grpo.step import StepTrace
    trace = StepTrace.load(tmp_path)
    m = trace.rollout.completion_mask
    with_trunc = m.clone()
    with_trunc[trace.rollout.is_truncated.bool()] = 1
    assert bool(trace.rollout.is_truncated.any()) and not bool(trace.rollout.is_truncated.all())
    assert top.severity == "error" and top.code == "gradient_scaled"
    assert f"= {int(m.sum())} / {int(with_trunc.sum())} = in-loss tokens" in top.cause, top.cause
    assert "the denominator counts the truncated rows' tokens" in top.cause


@pytest.mark.slow
def test_a_healthy_trl_run_with_two_steps_per_generation_replays_clean(tmp_path):
    """TRL splits one generation batch over two optimizer steps: the second trains the other rows from weights
    that moved, with π_old the generation's; both steps replay clean (about 4 minutes)."""
    pytest.importorskip("trl")
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.trl.example import run
    run(tmp_path, steps=3, capture=(2, 3), keep_weights=True, per_device_train_batch_size=4,
        steps_per_generation=2, max_completion_length=48)
    for step in ("step-000002", "step-000003"):
        rep = replay_path(tmp_path / step)
        assert rep.first_disagreement is None, (step, rep.first_disagreement)
        assert {p["phase"] for p in rep.phases() if p["status"] == "agree"} >= {"scoring", "gradient", "update"}


# ------------------------------------------------------------------------------------------------ wiring
@pytest.mark.parametrize("fault,said", [
    ("ratio_against_ref", "the policy ratio is taken against the reference's log-probs, not π_old's"),
    ("kl_against_old", "the KL term is taken against π_old's log-probs, not the reference's"),
    ("loss_uses_rewards", "the loss uses the rewards where the advantages belong")])
def test_a_loss_wired_to_the_wrong_input_names_the_input(tokenizer, fault, said):
    """The loss value of the hand-written loop's own loss function (lab.handloop.loss_of), with one input in
    another's place, against the replay's loss check: the substitution is named."""
    from rookworld_debug.diagnosis.replay.loss_phase import loss_check
    from rookworld_debug.lab.handloop import LoopConfig, loss_of
    torch.manual_seed(0)
    rec = _recorder(tokenizer, beta=0.04, num_iterations=2, iteration=1)
    m = rec.pieces["rollout"]["completion_mask"]
    lp = -torch.rand(8, T) * m
    old, ref = lp + 0.3 * torch.randn(8, T) * m, lp + 0.5 * torch.randn(8, T) * m
    adv = (REWARDS.view(B, G) - REWARDS.view(B, G).mean(1, keepdim=True)).reshape(-1) * 3
    rec.advantages(adv)
    rec.logprobs(lp, old=old, ref=ref, training=False)
    c = LoopConfig(loss_type="grpo", beta=0.04, micro_batches=1, num_generations=G)
    a = REWARDS if fault == "loss_uses_rewards" else adv
    rec.loss(float(loss_of(lp, old, ref, a, m, c, 8, m.sum(), fault)))
    check = loss_check(rec.build())
    assert check.status == "disagree" and check.cause == "loss_wiring", (check.cause, check.explanation)
    assert check.explanation.startswith(said)
    rec.loss(float(loss_of(lp, old, ref, adv, m, c, 8, m.sum())))       # the loop's loss as it should be
    assert loss_check(rec.build()).status == "agree"


# ----------------------------------------------------------------------------------------- the learning rate
def _scheduled(tokenizer, by_hand: float = 0.0):
    """A recorded step whose loop holds an AdamW with a linear decay stepped twice; `by_hand`: the rate then
    written into the optimizer's parameter group."""
    from rookworld_debug.record.recorder import _scheduler_state
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / 10)
    for _ in range(2):
        p.grad = torch.ones(3)
        opt.step()
        sched.step()
    if by_hand:
        opt.param_groups[0]["lr"] = by_hand
    rec = _recorder(tokenizer)
    rec.pieces["scheduler"] = _scheduler_state(sched, opt)
    return rec.build()


def test_a_rate_set_by_hand_over_the_scheduler_is_named(tokenizer):
    from rookworld_debug.diagnosis.replay.schedule import schedule_check
    assert schedule_check(_scheduled(tokenizer)).status == "agree"
    c = schedule_check(_scheduled(tokenizer, by_hand=1e-3))
    assert c.status == "disagree" and c.cause == "lr_not_from_scheduler"
    assert "lr 0.001 while its scheduler last set 0.0008" in c.explanation
    assert schedule_check(_recorder(tokenizer).build()) is None          # no scheduler recorded: nothing to hold


def test_a_scheduler_that_stops_stepping_is_named_across_steps(tokenizer):
    from rookworld_debug.diagnosis.replay.schedule import scheduler_carried
    k = _scheduled(tokenizer)                          # last_epoch 2 after 2 optimizer steps
    assert scheduler_carried(k, k, 1, 2).cause == "scheduler_not_stepped"
    assert scheduler_carried(k, k, 1, 5).status == "agree"        # a schedule stepped per epoch, not per step
    with pytest.raises(Exception) as err:
        from rookworld_debug.record.recorder import _scheduler_state
        _scheduler_state(object(), None)
    assert type(err.value).__name__ == "DataError" and "scheduler" in str(err.value)


def test_a_scheduler_whose_count_goes_back_or_runs_ahead_is_named(tokenizer):
    """Two records of one loop's scheduler: at k after 2 optimizer steps; at k+1 re-created (count 0) or stepped
    twice per optimizer step (count 4 after 1 more step)."""
    import dataclasses as dc
    from rookworld_debug.diagnosis.replay.schedule import scheduler_carried
    k = _scheduled(tokenizer)
    def at(epoch):
        s = {**k.recorded.scheduler, "last_epoch": float(epoch)}
        return dc.replace(k, recorded=dc.replace(k.recorded, scheduler=s))
    assert scheduler_carried(k, at(0), 1, 2).cause == "scheduler_reset"
    c = scheduler_carried(k, at(4), 1, 2, micro_batches=2)
    assert c.cause == "scheduler_stepped_extra" and "once per micro-batch (2 micro-batches)" in c.explanation
    assert scheduler_carried(k, at(3), 1, 2).status == "agree"


def test_a_scheduler_created_anew_between_the_steps_is_named_by_its_identity(tokenizer):
    """A LambdaLR re-created before each rollout records the same count at both steps, as a schedule stepped per
    epoch would: the recorder's instance number tells the two apart; a scheduler re-created with its state loaded
    (a resume) carries its count and passes."""
    import dataclasses as dc
    from rookworld_debug.diagnosis.replay.schedule import scheduler_carried
    from rookworld_debug.record.recorder import _scheduler_state
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=1e-3)

    def recorded(sched):
        rec = _recorder(tokenizer)
        rec.pieces["scheduler"] = _scheduler_state(sched, opt)
        return rec.build()
    first = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / 10)
    k = recorded(first)
    assert recorded(first).recorded.scheduler["instance"] == k.recorded.scheduler["instance"]
    p.grad = torch.ones(3)
    opt.step()
    first.step()
    anew = recorded(torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / 10))     # count 0 again
    c = scheduler_carried(k, anew, 1, 0)
    assert c.status == "disagree" and c.cause == "scheduler_reset", c
    assert "another object" in c.explanation and "last_epoch 0 → 0 over 1" in c.explanation
    assert scheduler_carried(k, recorded(first), 1, 0).status == "agree"          # the same scheduler, stepped
    resumed = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / 10)
    resumed.load_state_dict(first.state_dict())
    assert scheduler_carried(k, recorded(resumed), 1, 0).status == "agree"        # another object, count carried
    old = dc.replace(anew, recorded=dc.replace(anew.recorded, scheduler={
        key: v for key, v in anew.recorded.scheduler.items() if key != "instance"}))
    # a record without the number, after the run's first step: a schedule stepped per epoch and a skipped per-step
    # schedule leave the same counts, so a warning naming both, never an error
    c = scheduler_carried(k, old, 1, 0)
    assert c.status == "suspect" and c.cause == "scheduler_not_stepped" and "per epoch" in c.explanation


def test_a_memoised_forward_is_recomputed_when_its_weights_or_rollout_change():
    """The replay's variant forwards are computed once per model, rollout and variant: a weight changed in place
    (its version counter moved), another rollout object or another variant is recomputed, never served stale."""
    from rookworld_debug.diagnosis.replay.model_phases import _memoised
    calls = []

    class Rows:                      # a rollout stand-in: only its identity matters to the memo
        pass

    @_memoised
    def forward(model, r, scale=1.0):
        calls.append(scale)
        return model.weight.detach().sum() * scale

    m, r = torch.nn.Linear(2, 2), Rows()
    first = forward(m, r)
    assert forward(m, r) is first and len(calls) == 1
    with torch.no_grad():
        m.weight.add_(1.0)
    assert float(forward(m, r)) == pytest.approx(float(first) + 4.0) and len(calls) == 2
    forward(m, r, scale=2.0)
    forward(m, Rows())
    assert len(calls) == 4


def test_a_term_of_the_opposite_sign_and_its_own_size_is_not_resolved_as_a_scale(tokenizer):
    """A policy term fitted at −1 × its declared coefficient is a sign flip: its size 1 is no ratio of the step's
    counts, even where two counts are equal (no truncated rows: in-loss tokens = tokens with the truncated rows)."""
    from rookworld_debug.diagnosis.replay.records import DISAGREE, PhaseCheck
    from rookworld_debug.diagnosis.replay.resolve import _candidates
    trace = _recorder(tokenizer, truncated=()).build()
    q = _q(trace)
    assert q["tokens_in_loss"] == q["tokens_with_truncated"]
    assert all(abs(v - 1) > 1e-9 for _, v, _, _, how, _ in _candidates(step_quantities(trace)) if how == "ratio")
    fit = {"kind": "terms", "residual": 1e-7, "params": {"policy term": {"fitted": -1.0, "declared": 1.0},
                                                          "KL term (per unit β)": {"fitted": 0.5, "declared": 1.0}}}
    check = PhaseCheck("loss", "gradient: the loss's gradient", DISAGREE, 1.0, 1e-6, cause="loss_advantage_sign",
                       explanation="the policy term enters with the opposite sign", fit=fit)
    out = resolve_checks(trace, [check])[0]
    assert [r["parameter"] for r in out.fit["resolved"]] == ["KL term (per unit β): fitted ÷ declared"]
    assert "policy term" not in out.explanation.split(". ", 1)[1]
