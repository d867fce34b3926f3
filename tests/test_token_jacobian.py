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
