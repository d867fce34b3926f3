"""grpo.phases.update: micro-batch accumulation is exact, per-term grads sum to the total, NaN refuses."""
import copy

import pytest
import torch

from rookworld_debug import StepConfig
from rookworld_debug.errors import NumericalError
from rookworld_debug.grpo.phases.advantages import compute_advantages
from rookworld_debug.grpo.phases.generation import generate
from rookworld_debug.grpo.step import loss_for
from rookworld_debug.grpo.phases.update import make_optimizer, update
from rookworld_debug.models import load_policy_and_reference
from tinymodels import save_tiny_gpt2

PROMPTS = ["P: 8/8/8/8/8/8/8/K6k w - - 0 1", "P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return load_policy_and_reference(save_tiny_gpt2(tmp_path_factory.mktemp("tiny_upd")))


@pytest.fixture(scope="module")
def rollout(models):
    pol, ref, tok, _ = models
    return generate(pol, ref, tok, PROMPTS, ["P", "P"], num_generations=4, max_new_tokens=16,
                    sampling={"P": (0.7, 1.0, None)}, seed=1)


def _grads_after(models, rollout, config, **kw):
    pol = copy.deepcopy(models.policy)
    adv = compute_advantages(torch.arange(8.0) % 3, 4)
    opt = make_optimizer(pol, config.replace(lr=0.0))        # lr 0: keep weights, inspect the gradient
    captured = {}
    orig = opt.step

    def step_and_capture(*a, **k):
        captured.update({n: p.grad.clone() for n, p in pol.named_parameters()})
        return orig(*a, **k)
    opt.step = step_and_capture
    res = update(pol, opt, rollout, adv, loss_for(rollout, adv, config), config, reference=models.reference, **kw)
    return res, captured


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo", "manual"])
def test_micro_batches_reproduce_the_full_batch_gradient(models, rollout, loss_type):
    cfg = StepConfig(model="x", batch_size=2, num_generations=4, loss_type=loss_type, beta=0.1, entropy_coef=0.01,
                     max_new_tokens=16, max_grad_norm=None)
    full, g_full = _grads_after(models, rollout, cfg)
    micro, g_micro = _grads_after(models, rollout, cfg.replace(micro_batch_size=2))
    assert micro.micro_batches == 4 and full.micro_batches == 1
    assert micro.loss == pytest.approx(full.loss, abs=1e-6)
    for n in g_full:
        torch.testing.assert_close(g_micro[n], g_full[n], atol=1e-6, rtol=1e-4)


def test_per_term_norms_and_single_bucket_agree(models, rollout):
    cfg = StepConfig(model="x", batch_size=2, num_generations=4, beta=0.1, entropy_coef=0.01, max_new_tokens=16,
                     max_grad_norm=None)
    split, g_split = _grads_after(models, rollout, cfg)
    one, g_one = _grads_after(models, rollout, cfg, per_term_grads=False)
    assert split.grad_norm_pre_clip == pytest.approx(one.grad_norm_pre_clip, rel=1e-5)
    for n in g_one:
        torch.testing.assert_close(g_split[n], g_one[n], atol=1e-6, rtol=1e-4)


def test_full_kl_estimator_has_a_gradient(models, rollout):
    pol = copy.deepcopy(models.policy)
    with torch.no_grad():                      # move the policy away from the reference: KL grad ≠ 0
        for p in pol.parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = StepConfig(model="x", batch_size=2, num_generations=4, beta=1.0, kl_estimator="full", max_new_tokens=16,
                     max_grad_norm=None, lr=0.0)
    adv = compute_advantages(torch.zeros(8), 4)                   # PG term 0: only KL drives the gradient
    res = update(pol, make_optimizer(pol, cfg), rollout, adv, loss_for(rollout, adv, cfg), cfg,
                 reference=models.reference)
    assert res.per_term_global["kl"] > 0 and res.per_term_global["pg"] == 0


def test_nan_loss_refuses_and_leaves_weights(models, rollout):
    pol = copy.deepcopy(models.policy)
    before = {n: p.clone() for n, p in pol.named_parameters()}
    cfg = StepConfig(model="x", batch_size=2, num_generations=4, max_new_tokens=16)
    adv = compute_advantages(torch.arange(8.0), 4)
    bad = type(adv)(**{**adv.__dict__, "advantages": adv.advantages.clone().index_fill_(0, torch.tensor([0]), float("nan"))})
    with pytest.raises(NumericalError, match="refused"):
        update(pol, make_optimizer(pol, cfg), rollout, bad, loss_for(rollout, adv, cfg), cfg)
    assert all(torch.equal(p, before[n]) for n, p in pol.named_parameters())
