"""The replay's gradients by linearity: Jᵀu taken from earlier backwards wherever u is a combination of their u's
(to float noise, without cancellation) equals the backward it replaces; the loss's terms are fitted on the declared
ones first and on all of them only where those leave a residual."""
from __future__ import annotations

import math

import pytest
import torch


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """(trace, weights) of the hand-written loop's second step (1 prompt of G = 4, β = 0.04)."""
    from rookworld_debug.diagnosis.replay.weights import weights_for
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.lab.handloop import LoopConfig, run
    folder = tmp_path_factory.mktemp("jac") / "step-2"
    run(LoopConfig(num_prompts=1, max_new_tokens=64, steps=2), out=str(folder))
    trace = StepTrace.load(folder)
    return trace, weights_for(trace, folder)


def _jac(step):
    from rookworld_debug.diagnosis.replay.terms import TokenJacobian
    trace, w = step
    return TokenJacobian(trace, w.policy, w.trainable)


def _u(step, jac, **change):
    """(u_ℓ, u_H) of the declared objective with `change` applied (advantages=... replaces the recorded ones)."""
    from rookworld_debug.diagnosis.replay.terms import token_weights
    from rookworld_debug.grpo.objective.params import Objective
    trace, _ = step
    adv = change.pop("advantages", None)
    return token_weights(trace, Objective.from_config(trace.config).replace(**change), jac, advantages=adv)


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in a)
    den = sum(float(b[n].double().pow(2).sum()) for n in b)
    return math.sqrt(num / den)


def test_a_combination_of_earlier_directions_is_their_gradients_combination(step):
    jac, fresh = _jac(step), _jac(step)
    zero = torch.zeros_like(step[0].advantages.advantages)
    declared = _u(step, jac)
    kl = _u(step, jac, beta=1.0, entropy_coef=0.0, advantages=zero)
    jac.gradient(*declared)
    jac.gradient(*kl)
    assert jac.backwards == 2
    beta = float(step[0].config.beta)
    policy = tuple(d - beta * k for d, k in zip(declared, kl))           # the policy term: no cancellation
    got = jac.gradient(*policy)
    assert jac.backwards == 2                                           # served by linearity
    assert _rel(got, fresh.gradient(*policy)) < 1e-5                   # = the backward it replaces


def test_the_same_direction_gives_the_same_tensors_and_zero_gives_zeros(step):
    jac = _jac(step)
    u = _u(step, jac)
    first, again = jac.gradient(*u), jac.gradient(*u)
    assert jac.backwards == 1 and all(torch.equal(first[n], again[n]) for n in first)
    z = jac.gradient(torch.zeros_like(u[0]), torch.zeros_like(u[1]))
    assert jac.backwards == 1 and all(float(v.abs().sum()) == 0.0 for v in z.values())


def test_a_cancelling_combination_or_a_new_direction_runs_its_backward(step):
    jac, fresh = _jac(step), _jac(step)
    zero = torch.zeros_like(step[0].advantages.advantages)
    declared = _u(step, jac)
    kl = _u(step, jac, beta=1.0, entropy_coef=0.0, advantages=zero)
    near = tuple(d + 1e-3 * k for d, k in zip(declared, kl))
    jac.gradient(*declared)
    jac.gradient(*near)
    got = jac.gradient(*kl)                                  # = (near − declared) × 1000: a 2000-fold cancellation
    assert jac.backwards == 3
    assert _rel(got, fresh.gradient(*kl)) < 1e-6
    entropy = _u(step, jac, beta=0.0, entropy_coef=1.0, advantages=zero)
    jac.gradient(*entropy)
    assert jac.backwards == 4


def test_the_terms_fit_names_a_reversed_policy_term_from_the_declared_terms_alone(step):
    from rookworld_debug.diagnosis.replay.terms import GradientFit
    trace, _ = step
    jac = _jac(step)
    fit = GradientFit(trace, jac)
    declared = fit.terms(declared_only=True)
    assert set(declared) >= {"policy term", "KL term (per unit β)"}
    assert "mean log-likelihood term" not in declared
    names = list(declared["policy term"][0])
    beta = float(trace.config.beta)
    recorded = {n: -declared["policy term"][0][n] + beta * declared["KL term (per unit β)"][0][n] for n in names}
    coefs, resid = fit.fit(recorded, names, 1e-6)
    assert set(coefs) == set(declared)
    assert abs(coefs["policy term"][0] + 1.0) < 1e-4 and abs(coefs["KL term (per unit β)"][0] - beta) < 1e-4 * 25


def test_a_term_the_declaration_leaves_out_is_fitted_with_all_terms(step):
    from rookworld_debug.diagnosis.replay.terms import GradientFit
    trace, _ = step
    fit = GradientFit(trace, _jac(step))
    every = fit.terms()
    names = list(every["policy term"][0])
    beta = float(trace.config.beta)
    recorded = {n: every["policy term"][0][n] + beta * every["KL term (per unit β)"][0][n]
                + 0.3 * every["mean log-likelihood term"][0][n] for n in names}
    coefs, resid = fit.fit(recorded, names, 1e-6)
    assert "mean log-likelihood term" in coefs and abs(coefs["mean log-likelihood term"][0] - 0.3) < 1e-3


def _screened_part(g: dict, names) -> torch.Tensor:
    return torch.cat([g[n].reshape(-1).double() for n in names])


def test_the_head_screen_is_the_final_layer_norms_gradient(step):
    """The closed form (head_screen.py) against autograd, on both channels, at the step's temperature."""
    jac = _jac(step)
    assert jac.screen is not None and all("ln_f" in n for n in jac.screen.names)
    gen = torch.Generator().manual_seed(0)
    mask = step[0].rollout.completion_mask.double()
    noise = (torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask).float()
    for u in (_u(step, jac), _u(step, jac, entropy_coef=0.5), (noise, noise.flip(0))):
        got, want = jac.screen.gradient(*u), _screened_part(jac.gradient(*u), jac.screen.names)
        assert float((got - want).norm()) <= 1e-5 * float(want.norm())


def test_the_screen_rules_out_only_gradients_that_cannot_agree(step):
    """A neighbouring declaration's gradient is skipped only where the gradient check could not agree with it: the
    screen's gap is a lower bound of the whole distance, a clipped copy is never ruled out, a reversed one is."""
    from rookworld_debug.diagnosis.replay.gradient_phase import gradient_check, unreachable
    from rookworld_debug.diagnosis.replay.terms import distance
    jac = _jac(step)
    names = [n for n, _ in jac.params]
    u = _u(step, jac)
    g = jac.gradient(*u)
    assert unreachable(g, jac, u, "float32") is None
    assert unreachable({n: 0.5 * v for n, v in g.items()}, jac, u, "float32") is None         # a clip's scale
    assert unreachable({n: -v for n, v in g.items()}, jac, u, "float32") is not None
    adv = step[0].advantages.advantages
    screened = {}
    for key, change in (("no KL", {"beta": 0.0}), ("reversed", {"advantages": -adv}),
                        ("no bias correction", {"use_bias_correction_kl": False}), ("entropy", {"entropy_coef": 0.1}),
                        ("dr_grpo", {"loss_type": "dr_grpo"}), ("doubled", {"advantages": 2 * adv})):
        other = _u(step, jac, **change)
        full = jac.gradient(*other)
        assert jac.screen.gap(g, names, *other) <= distance(g, full, names)
        screened[key] = unreachable(g, jac, other, "float32") is not None
        assert not (screened[key] and gradient_check(g, full, "float32", 1).status == "agree")
    # a reversed policy term and an entropy bonus move the layer norm's part by far more than the bound; a doubled
    # gradient may be a clip's (s in [0, 1]): never ruled out
    assert screened["reversed"] and screened["entropy"] and not screened["doubled"]


def test_the_sampled_tokens_statistics_from_the_gradients_forward(step):
    """The sampler check's statistics from the loss forward's head inputs equal those of its own forward, also where
    that forward skipped the columns no row reaches (its width stops at the last masked token)."""
    import dataclasses
    from rookworld_debug.diagnosis.replay.sampled_tokens import judge, token_statistics
    from rookworld_debug.diagnosis.replay.terms import TokenJacobian
    trace, w = step
    r = trace.rollout
    ids, mask = r.completion_ids.clone(), r.completion_mask.clone()
    ids[0, 10], mask[0, 11:] = w.eos, 0                          # row 0 ends at its 11th token, the others run on
    wide = dataclasses.replace(r, completion_ids=torch.nn.functional.pad(ids, (0, 7), value=w.eos),
                               completion_mask=torch.nn.functional.pad(mask, (0, 7)))
    for rollout in (r, wide):
        jac = TokenJacobian(dataclasses.replace(trace, rollout=rollout), w.policy, w.trainable)
        own, shared = token_statistics(w.policy, rollout, eos=w.eos), \
            token_statistics(w.policy, rollout, eos=w.eos, hidden=jac.hidden)
        assert jac.hidden.shape[1] == r.completion_ids.shape[1]       # the padding columns never ran
        assert own.keys() == shared.keys()
        for k in own:
            a, b = own[k], shared[k]
            if k == "first":                    # a row without an end: the width of the columns read
                assert int(a.min()) == int(b.min())
            elif k == "p_eos":                  # P(EOS) is read before the earliest end only
                a, b = a[:, :int(own["first"].min())], b[:, :int(own["first"].min())]
            if torch.is_tensor(a) and k != "first":
                assert torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5), k
            elif k != "first":
                assert a == b
        assert (judge(own).status, judge(own).cause) == (judge(shared).status, judge(shared).cause)
