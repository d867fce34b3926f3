"""The mechanism fits that name a cause from the step's own numbers, each against the mechanism it names: clipping
inside the micro-batch loop (torch's own clip_grad_norm_ is the oracle), greedy decoding (the chance that sampling
repeats a completion), rewards cached by prompt or returned in another order."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 100.0])
def test_clipped_in_loop_weights_are_what_torch_leaves(max_norm):
    from rookworld_debug.diagnosis.replay.terms import clipped_in_loop
    g = torch.Generator().manual_seed(0)
    p = [torch.nn.Parameter(torch.zeros(5, 3)), torch.nn.Parameter(torch.zeros(7))]
    names = ["a", "b"]
    grads = [{"a": torch.randn(5, 3, generator=g), "b": torch.randn(7, generator=g)} for _ in range(3)]
    for q in p:
        q.grad = None
    for mb in grads:                      # the loop's bug: clip after each micro-batch's backward
        for q, n in zip(p, names):
            q.grad = mb[n].clone() if q.grad is None else q.grad + mb[n]
        torch.nn.utils.clip_grad_norm_(p, max_norm)
    w = clipped_in_loop(grads, names, max_norm)
    for q, n in zip(p, names):
        want = sum(wi * mb[n].double() for wi, mb in zip(w, grads))
        assert torch.allclose(q.grad.double(), want, rtol=1e-5, atol=1e-9)
    assert (max_norm >= 100.0) == all(x == 1.0 for x in w)      # a bound no sum reaches leaves 1 each


def _rollout(logp: float, b=2, g=4, t=10, top_p=None):
    from rookworld_debug.config import StepConfig
    lp = torch.full((b * g, t), logp)
    return SimpleNamespace(config=StepConfig(p_top_p=top_p or 1.0),
                           rollout=SimpleNamespace(sampling_per_token_logps=lp, per_token_logps=lp, tasks=("P",) * b * g,
                                                   completion_mask=torch.ones(b * g, t, dtype=torch.long)))


def test_identical_groups_too_unlikely_to_be_sampled_are_named_greedy():
    from rookworld_debug.diagnosis.checks_signal import GREEDY_CHANCE, _greedy
    ev = _greedy(_rollout(-0.5), [0, 1], 4)            # each completion p = e^-5; repeated 3× in 2 groups: e^-30
    assert ev is not None
    chance = {e.name: e.value for e in ev}["log10_chance_if_sampled"]
    assert chance == pytest.approx(-30 / math.log(10)) and chance < math.log10(GREEDY_CHANCE)
    # a policy this sure of its completions repeats them when it samples: no claim
    assert _greedy(_rollout(-0.01), [0, 1], 4) is None
    assert _greedy(_rollout(-0.5), [], 4) is None
    # top-p sampling makes a token the filter leaves alone certain: the tempered probabilities bound nothing
    assert _greedy(_rollout(-0.5, top_p=0.9), [0, 1], 4) is None


def test_reward_variants_name_a_cache_by_prompt_and_a_reversed_order():
    from rookworld_debug.diagnosis.replay.data_phases import reward_variants
    ref = torch.tensor([0.1, 0.5, -1.0, 0.3, 0.9, 0.2, 0.0, -0.4], dtype=torch.float64)
    v = reward_variants(ref, 4)
    assert torch.equal(v["reward_rows_misaligned/reversed"][0], ref.flip(0))
    cached = v["reward_cached/first"][0].view(2, 4)
    assert torch.equal(cached, ref.view(2, 4)[:, :1].expand(2, 4))
    assert "cached by prompt" in v["reward_cached/first"][1]


def test_one_reward_broadcast_to_the_batch_is_a_reward_that_ignores_the_completion():
    from rookworld_debug.diagnosis.replay.compare import compare
    from rookworld_debug.diagnosis.replay.data_phases import reward_variants
    ref = torch.tensor([0.1, 0.5, -1.0, 0.3, 0.9, 0.2, 0.0, -0.4], dtype=torch.float64)
    for j, which in ((0, "first"), (7, "last")):         # the function returned one number: assignment broadcasts it
        check = compare("rewards", "rewards", ref[j].expand(8).clone(), ref, 1e-6, variants=reward_variants(ref, 4))
        assert check.cause == "reward_ignores_completion" and f"{which} row" in check.explanation
    # one group of G rows cached by prompt is not a whole batch broadcast: the cache names it
    cached = ref.view(2, 4)[:, :1].expand(2, 4).reshape(-1)
    assert compare("rewards", "rewards", cached, ref, 1e-6, variants=reward_variants(ref, 4)).cause == "reward_cached"


def test_a_capture_whose_trainer_kept_no_log_probs_for_untrained_rows_is_built_with_them_missing():
    from rookworld_debug.trl.build import _in_generation_order
    mbs = [{"rows": torch.tensor([0, 1]), "per_token_logps": torch.full((2, 3), -0.5)}]
    out = _in_generation_order(mbs, 4, "per_token_logps")          # rows 2, 3: another step's, none kept
    assert torch.equal(out[:2], torch.full((2, 3), -0.5)) and torch.equal(out[2:], torch.zeros(2, 3))
    fill = torch.full((4, 3), -2.0)
    assert torch.equal(_in_generation_order(mbs, 4, "per_token_logps", fill)[2:], fill[2:])
    with pytest.raises(RuntimeError, match="rows seen"):          # a row trained twice is not one step
        _in_generation_order(mbs * 2, 4, "per_token_logps")


def test_the_fix_card_shows_the_verdict_and_its_numbers_escaped():
    from rookworld_debug.diagnosis.replay.corrected import CorrectedStep, ParameterChange, RowChange
    from rookworld_debug.viz import fix_card
    c = CorrectedStep("loss", "loss_kl_sign: <script>alert(1)</script>", loss=(0.5, 0.25), grad_norm=(2.0, 1.0),
                      grad_norm_clipped=(1.0, 1.0), max_grad_norm=1.0, grad_cos=0.5, update_norm=(1e-3, 5e-4),
                      update_cos=0.5, parameters=(ParameterChange("h.0.<b>", 1e-4, 2e-4, 1e-4),),
                      rows=(RowChange(0, 1.0, (0.5, 0.5), 1.0, (0.2, -0.3)), RowChange(1, 0.0, (-0.5, -0.5), -1.0,
                                                                                       (-0.1, -0.2))))
    html = fix_card(c)._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "h.0.&lt;b&gt;" in html
    assert "turns this step&#x27;s update by 60°" in html and "shrinks it 2×" in html
    assert html.count("<tr>") == 1 + 4 + 1 + 1 + 1 + 1       # headers and rows: numbers, parameters, one flipped row
    none = fix_card(CorrectedStep("", "", note="the replay found no disagreement"))._repr_html_()
    assert "rw-fix-none" in none and "no disagreement" in none


def test_a_log_prob_bound_grows_with_the_log_prob():
    from rookworld_debug.diagnosis.replay.compare import LOGP_REL, LOGP_TOL, compare
    ref = torch.tensor([[-0.3, -14.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    tol, rel = LOGP_TOL["float32"], LOGP_REL["float32"]
    far = ref + torch.tensor([[0.0, 1.2e-4, 0.0]], dtype=torch.float64)      # fp32 rounding of an unlikely token
    assert compare("scoring", "q", far, ref, tol, mask=mask, rel=rel).status == "agree"
    near = ref + torch.tensor([[1.2e-4, 0.0, 0.0]], dtype=torch.float64)     # the same gap at a likely token
    c = compare("scoring", "q", near, ref, tol, mask=mask, rel=rel)
    assert c.status == "disagree" and "(0, 0)" in c.where
    assert compare("scoring", "q", far, ref, tol, mask=mask).status == "disagree"    # without rel: the fixed bound


def test_a_loops_own_reward_is_held_only_to_how_its_values_are_stored():
    from rookworld_debug.diagnosis.replay.fits import STORAGE_FITS, value_fits
    ref = torch.tensor([0.1234567, 0.51, -1.0371, 0.3333333, 0.9, 0.2, 0.0, -0.4], dtype=torch.float64)
    only = value_fits(4, STORAGE_FITS)
    got = only(ref.to(torch.bfloat16).double(), ref, None, 1e-5)
    assert got is not None and got.kind == "rounded" and got.params["dtype"] == "bfloat16"
    assert only(ref.trunc(), ref, None, 1e-5).kind == "truncated_to_integer"
    # another formula of the same rows (a scale) is the loop's own business: only the full fits name it
    assert only(1.01 * ref, ref, None, 1e-5) is None and value_fits(4)(1.01 * ref, ref, None, 1e-5).kind == "scaled"


def test_a_mask_whose_start_is_off_by_one_names_the_first_token_left_out():
    from rookworld_debug.diagnosis.replay.data_phases import _mask_check
    ids = torch.tensor([[5, 6, 0, 9], [7, 0, 9, 9], [8, 8, 8, 8]])          # EOS = 0; row 2 never ends
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    off = right.clone()
    off[:, 0] = 0
    c = _mask_check(ids, off, 0)
    assert c.status == "disagree" and c.cause == "first_token_not_in_mask" and "first 1 completion token " \
        in c.explanation
    assert _mask_check(ids, right, 0).status == "agree"
    one_row = right.clone()
    one_row[1, 0] = 0                               # one row's first token: not the mask's start for every row
    assert _mask_check(ids, one_row, 0).cause != "first_token_not_in_mask"


def test_a_tied_weight_trained_as_two_parameters_is_named():
    from rookworld_debug.diagnosis.replay.update import untied_check
    w = torch.randn(6, 4)
    state = SimpleNamespace(model_config={"model_type": "gpt2", "tie_word_embeddings": True},
                            trainable=["transformer.wte.weight", "lm_head.weight", "transformer.ln_f.weight"],
                            before={"transformer.wte.weight": w, "lm_head.weight": w + 1e-3},
                            gradient={"transformer.wte.weight": torch.ones(6, 4), "lm_head.weight": torch.ones(6, 4)})
    c = untied_check(state)
    assert c.status == "disagree" and c.cause == "tied_weights_untied" and "already differ" in c.explanation
    # one parameter (the tie kept: named_parameters lists it once), or a config that unties them: nothing to say
    assert untied_check(SimpleNamespace(**{**vars(state), "trainable": ["transformer.wte.weight"]})) is None
    assert untied_check(SimpleNamespace(**{**vars(state), "model_config": {"tie_word_embeddings": False}})) is None


@pytest.mark.slow
def test_a_scorer_that_reads_each_completion_cut_short_is_named_with_the_cut():
    from rookworld_debug.diagnosis.replay import replay_trace
    from rookworld_debug.lab import faults as F, faults_heldout as H
    fault = {f.name: f for f in H.SEVENTH_STEP_FAULTS}["reward_input_truncated"]
    trace = F.run_one(fault.base, rewards=fault.rewards, seed=0)          # the loop's own scorer, 48 characters
    c = next(c for c in replay_trace(trace).checks if c.phase == "rewards")
    assert c.status == "disagree" and c.cause == "reward_input_truncated" and "first 48 characters" in c.explanation
    healthy = next(c for c in replay_trace(F.run_one(fault.base, seed=0)).checks if c.phase == "rewards")
    assert healthy.status == "agree"
