"""compute_loss vs TRL as the oracle.

Oracle: TRL's REAL `GRPOTrainer._compute_loss` runs on a model-free trainer (`object.__new__(GRPOTrainer)`
+ attribute stubs, TRL's own unit-test pattern). Its only model call, `_get_per_token_logps_and_entropies`,
is replaced by a stub returning OUR per-token log-prob and entropy leaves, so TRL's importance weights,
clipping, δ, sequence-level IS, k3 KL (with TRL's default bias correction), loss-type aggregation, entropy
bonus and metric logging all run on the same tensors. Losses, gradients and logged metrics are compared.
Estimators TRL does not have (k1, k2, full) and the seeds' manual variant are checked against TRL's β=0
loss plus the documented KL term, and against a per-sample loop of the seeds' formula.
"""
import dataclasses
import inspect
import statistics
import textwrap
import time
import types
import zlib
from collections import defaultdict

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOTrainer  # noqa: E402
from trl.trainer import grpo_trainer as trl_grpo_module  # noqa: E402

from rookworld_debug.config import StepConfig  # noqa: E402
from rookworld_debug.errors import ConfigError  # noqa: E402
from rookworld_debug.grpo.objective.loss import LossBreakdown, compute_loss  # noqa: E402
from rookworld_debug.grpo.objective.params import LossBatch, Objective  # noqa: E402

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]
L_MAX = 16
_OBJECTIVE_FIELDS = {f.name for f in dataclasses.fields(Objective)}


def _compute(logps, old, ref, adv, mask, **kw):
    """compute_loss with its knobs as keywords: the Objective's fields, the rest the LossBatch's."""
    objective = Objective(**{k: kw.pop(k) for k in list(kw) if k in _OBJECTIVE_FIELDS})
    return compute_loss(logps, old, ref, adv, mask, objective, LossBatch(**kw))


class _Accelerator:
    device = torch.device("cpu")
    num_processes = 1
    process_index = 0
    sync_gradients = True

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def trl_loss(logps, old, ref, adv, mask, entropy, *, beta, loss_type, epsilon_low=0.2, epsilon_high=0.28,
             delta=None, level="token", entropy_coef=0.0, bias=True, g=1, num_items=None, spg=None, opsm=None,
             rho=1.0, sampling=None, loss_params=None, is_opts=None):
    """TRL's real _compute_loss on our tensors. Returns (loss, metrics dict of the last logged values).
    is_opts (mode, clip_min, clip_max): TRL's vLLM importance-sampling correction, its ratio and sampling/*
    metrics computed by TRL's own _generate_and_score_completions code (see trl_sampling_correction)."""
    t = object.__new__(GRPOTrainer)
    t.args = types.SimpleNamespace(delta=delta, use_bias_correction_kl=bias, steps_per_generation=spg or g,
                                   entropy_target=0.2, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                                   vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
    for k, v in (loss_params or {}).items():
        setattr(t.args, k, v)
    t.beta = beta
    t.loss_type = loss_type
    t.epsilon_low = epsilon_low
    t.epsilon_high = epsilon_high
    t.importance_sampling_level = level
    t.top_entropy_quantile = rho
    t.off_policy_mask_threshold = opsm
    t.use_vllm = False
    t.vllm_importance_sampling_correction = False
    t.aux_loss_enabled = False
    t.model = types.SimpleNamespace(training=True)
    t.current_gradient_accumulation_steps = g
    t.max_completion_length = L_MAX
    t.accelerator = _Accelerator()
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t._entropy_bonus_enabled = entropy_coef != 0
    t.use_adaptive_entropy = False
    t.entropy_coef = entropy_coef
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropy, None)
    N, T = logps.shape
    inputs = {"prompt_ids": torch.zeros(N, 3, dtype=torch.long), "prompt_mask": torch.ones(N, 3, dtype=torch.long),
              "completion_ids": torch.zeros(N, T, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum() if num_items is None else torch.tensor(num_items)}
    if old is not None:
        inputs["old_per_token_logps"] = old
    if sampling is not None:
        inputs["sampling_per_token_logps"] = sampling
    if is_opts is not None:
        inputs["importance_sampling_ratio"] = trl_sampling_correction(t, old, sampling, mask, **is_opts)
    loss = t._compute_loss(None, inputs)
    return loss, {k: v[-1] for k, v in t._metrics["train"].items()}


def _trl_block(first_line: str, end: str):
    """A block of TRL's OWN `_generate_and_score_completions` source (the lines from the `if` that precedes
    `first_line` up to `end`), dedented and compiled: the sampling correction is inline there."""
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    i = src.index(first_line)
    i = src.rindex("if self.use_vllm and self.vllm_importance_sampling_correction:", 0, i)
    i = src.rindex("\n", 0, i) + 1
    return compile(textwrap.dedent(src[i:src.index(end, i)]), "trl/grpo_trainer.py (block)", "exec")


TRL_IS_RATIO = _trl_block("per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                          "# Compute the per-token log probabilities for the reference model")
TRL_IS_METRICS = _trl_block("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {")


def trl_sampling_correction(t, old, sampling, mask, *, mode, clip_min, clip_max):
    """TRL's importance_sampling_ratio for our tensors, run by TRL's own code (and its sampling/* metrics
    logged into t._metrics), with use_vllm and the correction switched on the trainer."""
    t.use_vllm = t.vllm_importance_sampling_correction = True
    t.vllm_importance_sampling_mode = mode
    t.vllm_importance_sampling_clip_min, t.vllm_importance_sampling_clip_max = clip_min, clip_max
    ns = dict(vars(trl_grpo_module), self=t, completion_mask=mask, tool_mask=None, old_per_token_logps=old,
              sampling_per_token_logps=sampling, device=torch.device("cpu"), mode="train")
    exec(TRL_IS_RATIO, ns)
    exec(TRL_IS_METRICS, ns)
    return ns["vllm_importance_sampling_ratio"]


def _is_kwargs(is_opts):
    if is_opts is None:
        return {}
    return dict(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=is_opts["mode"],
                vllm_importance_sampling_clip_min=is_opts["clip_min"],
                vllm_importance_sampling_clip_max=is_opts["clip_max"])


def make_inputs(seed=0, N=8, T=12, dtype=torch.float64, off_policy=True):
    """Random (N, T) inputs: right-padded mask with varied lengths and one empty row, old logps far from the
    current ones (ratios e^±2 ≫ clip range), ref logps off by N(0, 0.5), a zero advantage."""
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(N, T, generator=g, dtype=dtype) * 4
    shift = torch.randn(N, 1, generator=g, dtype=dtype) * 1.0           # per-row drift: sequence ratios clip too
    old = logps + torch.randn(N, T, generator=g, dtype=dtype) * 0.9 + shift if off_policy else None
    ref = logps + torch.randn(N, T, generator=g, dtype=dtype) * 0.5
    entropy = torch.rand(N, T, generator=g, dtype=dtype) * 3
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[2] = 0                                                   # empty completion
    lengths[0] = T                                                   # full length (truncated)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()   # TRL's completion_mask is int64
    adv = torch.randn(N, generator=g, dtype=dtype)
    adv[5] = 0.0
    return logps, old, ref, adv, mask, entropy


def run_both(data, **kw):
    """(our LossBreakdown, our grads, TRL loss, TRL grads, TRL metrics) on identical leaves."""
    logps, old, ref, adv, mask, entropy = data
    g, num_items = kw.pop("g", 1), kw.pop("num_items", None)
    bias = kw.pop("bias", True)
    opts = {k: kw.pop(k) for k in ("spg", "opsm", "rho", "sampling", "loss_params", "is_opts") if k in kw}
    ours_lp, ours_h = logps.clone().requires_grad_(), entropy.clone().requires_grad_()
    trl_lp, trl_h = logps.clone().requires_grad_(), entropy.clone().requires_grad_()
    rec = _compute(ours_lp, old, ref, adv, mask, beta=kw["beta"], epsilon_low=kw.get("epsilon_low", 0.2),
                       epsilon_high=kw.get("epsilon_high", 0.28), loss_type=kw["loss_type"],
                       max_completion_length=L_MAX, importance_sampling_level=kw.get("level", "token"),
                       delta=kw.get("delta"), entropy=ours_h, entropy_coef=kw.get("entropy_coef", 0.0),
                       use_bias_correction_kl=bias, gradient_accumulation_steps=g, num_items_in_batch=num_items,
                       num_generations=4, steps_per_generation=opts.get("spg"),
                       off_policy_mask_threshold=opts.get("opsm"), top_entropy_quantile=opts.get("rho", 1.0),
                       sampling_per_token_logps=opts.get("sampling"), **(opts.get("loss_params") or {}),
                       **_is_kwargs(opts.get("is_opts")))
    loss_trl, metrics = trl_loss(trl_lp, old, ref, adv, mask, trl_h, bias=bias, g=g, num_items=num_items, **opts,
                                 **kw)
    ours_grads = torch.autograd.grad(rec.loss, [ours_lp, ours_h], allow_unused=True)
    trl_grads = torch.autograd.grad(loss_trl, [trl_lp, trl_h], allow_unused=True)
    return rec, ours_grads, loss_trl, trl_grads, metrics


def assert_matches(rec, ours_grads, loss_trl, trl_grads, metrics, tol=1e-6):
    assert float(rec.loss.detach()) == pytest.approx(float(loss_trl.detach()), abs=tol, rel=tol)
    for a, b in zip(ours_grads, trl_grads):
        if b is None:
            assert a is None or torch.count_nonzero(a) == 0
        else:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for key, value in metrics.items():
        if key == "entropy_coef":                                    # TRL bookkeeping, not a loss metric
            continue
        assert rec.metrics[key] == pytest.approx(value, abs=tol, rel=tol, nan_ok=True), key


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("delta", [None, 1.5])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.02])
def test_matches_trl(loss_type, level, delta, beta, entropy_coef):
    data = make_inputs(seed=zlib.crc32(repr((loss_type, level, delta, beta, entropy_coef)).encode()) % 1000)
    out = run_both(data, beta=beta, loss_type=loss_type, delta=delta, level=level, entropy_coef=entropy_coef)
    assert_matches(*out, tol=1e-9)
    rec, metrics = out[0], out[4]
    assert metrics["clip_ratio/region_mean"] > 0                     # the case really exercises clipping
    assert (rec.is_clipped_low | rec.is_clipped_high).any()


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_matches_trl_float32(loss_type, level):
    data = make_inputs(seed=7, N=16, T=20, dtype=torch.float32)
    assert_matches(*run_both(data, beta=0.1, loss_type=loss_type, level=level, delta=2.0, entropy_coef=0.01),
                   tol=1e-6)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_matches_trl_on_policy(loss_type, beta):
    """old_per_token_logps=None → TRL uses per_token_logps.detach(): ratio 1, clip metrics 0."""
    data = make_inputs(seed=3, off_policy=False)
    rec, *rest = run_both(data, beta=beta, loss_type=loss_type, entropy_coef=0.01)
    assert_matches(rec, *rest, tol=1e-9)
    assert torch.all(rec.per_token_ratio == 1)
    assert rec.metrics["clip_ratio/region_mean"] == 0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_matches_trl_without_bias_correction(loss_type, level):
    data = make_inputs(seed=4)
    assert_matches(*run_both(data, beta=0.2, loss_type=loss_type, level=level, bias=False), tol=1e-9)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_matches_trl_gradient_accumulation(loss_type):
    """One micro-batch of a g=2 window (steps_per_generation = g, TRL default): num_items_in_batch counts the
    whole generation batch, grpo/bnpo/dr_grpo and H̄ are ÷ g."""
    data = make_inputs(seed=9)
    total = int(data[4].sum()) + 37
    assert_matches(*run_both(data, beta=0.1, loss_type=loss_type, entropy_coef=0.03, g=2, num_items=total),
                   tol=1e-9)


@pytest.mark.parametrize("epsilon_low,epsilon_high", [(0.0, 0.0), (0.1, 0.5), (0.9, 3.0)])
def test_matches_trl_asymmetric_epsilons(epsilon_low, epsilon_high):
    data = make_inputs(seed=12)
    assert_matches(*run_both(data, beta=0.05, loss_type="dapo", epsilon_low=epsilon_low,
                             epsilon_high=epsilon_high), tol=1e-9)


# ------------------------------------------------------------------ decomposition
@pytest.mark.parametrize("loss_type", LOSS_TYPES + ["manual"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_terms_sum_to_loss(loss_type, level):
    logps, old, ref, adv, mask, entropy = make_inputs(seed=1)
    rec = _compute(logps, old, ref, adv, mask, beta=0.1, epsilon_low=0.2, epsilon_high=0.2,
                       loss_type=loss_type, max_completion_length=L_MAX, importance_sampling_level=level,
                       entropy=entropy, entropy_coef=0.05, num_generations=4)
    assert torch.equal(rec.loss, rec.pg_loss + rec.kl_loss + rec.entropy_term)
    assert torch.equal(rec.entropy_term, -0.05 * rec.entropy_loss)
    torch.testing.assert_close(rec.per_seq_pg.sum(), rec.pg_loss)
    torch.testing.assert_close(rec.per_seq_kl_loss.sum(), rec.kl_loss)
    torch.testing.assert_close(rec.per_seq_entropy_term.sum(), rec.entropy_term)
    torch.testing.assert_close(rec.per_seq_loss.sum(), rec.loss)
    torch.testing.assert_close(rec.per_group_pg, rec.per_seq_pg.view(-1, 4).sum(1))
    torch.testing.assert_close(rec.per_group_loss.sum(), rec.loss)
    torch.testing.assert_close(rec.per_token_loss, rec.per_token_pg + 0.1 * rec.per_token_kl)
    m = mask.bool()
    assert torch.all(rec.per_token_pg[~m] == 0) and torch.all(rec.per_token_kl[~m] == 0)
    assert not (rec.is_clipped_low[~m].any() or rec.is_clipped_high[~m].any())
    N, T = logps.shape
    for name in ("per_token_pg", "per_token_kl", "per_token_loss", "per_token_ratio", "per_token_entropy",
                 "is_clipped_low", "is_clipped_high"):
        assert getattr(rec, name).shape == (N, T), name
    for name in ("per_seq_pg", "per_seq_kl", "per_seq_kl_loss", "per_seq_entropy", "per_seq_loss", "seq_len"):
        assert getattr(rec, name).shape == (N,), name
    assert rec.per_group_pg.shape == (2,)
    # raw KL per sequence = masked mean of the per-token KL
    torch.testing.assert_close(rec.per_seq_kl, rec.per_token_kl.sum(-1) / mask.sum(-1).clamp(min=1))
    assert rec.kl == pytest.approx(float(rec.per_token_kl.sum() / mask.sum()))


def test_kl_share_definition_and_zero_guard():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    rec = _compute(logps, old, ref, adv, mask, beta=0.3, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo",
                       max_completion_length=L_MAX, entropy=entropy, entropy_coef=0.01)
    a, b, c = abs(float(rec.pg_loss)), abs(float(rec.kl_loss)), abs(float(rec.entropy_term))
    assert rec.kl_share == pytest.approx(b / (a + b + c)) and not rec.kl_share_undefined
    zero = _compute(logps, None, ref, torch.zeros_like(adv), mask, beta=0.0, epsilon_low=0.2,
                        epsilon_high=0.2, loss_type="dapo", max_completion_length=L_MAX)
    assert zero.kl_share == 0.0 and zero.kl_share_undefined
    assert any("kl_share undefined" in f for f in zero.flags)


def test_record_tensors_detached_except_totals():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    lp, h = logps.clone().requires_grad_(), entropy.clone().requires_grad_()
    rec = _compute(lp, old, ref, adv, mask, beta=0.1, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo",
                       max_completion_length=L_MAX, entropy=h, entropy_coef=0.01)
    assert isinstance(rec, LossBreakdown)
    for name in ("loss", "pg_loss", "kl_loss", "entropy_loss", "entropy_term"):
        assert getattr(rec, name).requires_grad and getattr(rec, name).dim() == 0, name
    for name in ("per_token_pg", "per_token_kl", "per_token_loss", "per_token_ratio", "per_seq_pg"):
        assert not getattr(rec, name).requires_grad, name
    assert rec.pg_term is rec.pg_loss and rec.kl_term is rec.kl_loss
    with pytest.raises(Exception):
        rec.loss = None                                              # frozen


def test_zero_beta_and_no_entropy_terms_carry_no_graph():
    """β = 0 and c_H = 0 give constant zero terms (the update phase skips their backward)."""
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    lp = logps.clone().requires_grad_()
    rec = _compute(lp, old, None, adv, mask, beta=0.0, epsilon_low=0.2, epsilon_high=0.2, loss_type="grpo",
                       max_completion_length=L_MAX)
    assert not rec.kl_loss.requires_grad and not rec.entropy_term.requires_grad and rec.loss.requires_grad
    assert rec.per_token_kl is None and rec.per_seq_kl is None and "kl" not in rec.metrics
    assert float(rec.kl_loss) == 0 and float(rec.entropy_term) == 0


def test_normalizer_descriptions():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    n_tok = int(mask.sum())
    kw = dict(beta=0.1, epsilon_low=0.2, epsilon_high=0.2, max_completion_length=L_MAX)
    assert str(_compute(logps, old, ref, adv, mask, loss_type="dapo", **kw).normalizer) == \
        f"dapo: Σ mask = {n_tok} tokens (this batch)"
    r = _compute(logps, old, ref, adv, mask, loss_type="dapo", num_items_in_batch=500, **kw)
    assert r.normalizer.value == 500 and "num_items_in_batch" in str(r.normalizer)
    assert str(_compute(logps, old, ref, adv, mask, loss_type="bnpo", **kw).normalizer).startswith(
        f"bnpo: Σ mask = {n_tok} tokens")
    dr = _compute(logps, old, ref, adv, mask, loss_type="dr_grpo", **kw).normalizer
    assert dr.value == 8 * L_MAX and str(dr) == f"dr_grpo: N·L_max = 8·{L_MAX} = {8 * L_MAX}"
    assert "mean over 8 sequences" in str(_compute(logps, old, ref, adv, mask, loss_type="grpo", **kw).normalizer)


# ------------------------------------------------------------------ other KL estimators (no TRL equivalent)
@pytest.mark.parametrize("estimator", ["k1", "k2"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_k1_k2_equal_trl_pg_plus_documented_kl(estimator, loss_type):
    """loss(k) = TRL loss at β=0 + β·agg(k·r); k1 = logp − ref, k2 = ½(logp − ref)²."""
    logps, old, ref, adv, mask, entropy = make_inputs(seed=21)
    beta = 0.3
    rec = _compute(logps, old, ref, adv, mask, beta=beta, epsilon_low=0.2, epsilon_high=0.28,
                       loss_type=loss_type, max_completion_length=L_MAX, kl_estimator=estimator)
    base, _ = trl_loss(logps, old, ref, adv, mask, entropy, beta=0.0, loss_type=loss_type)
    d = logps - ref
    k = d if estimator == "k1" else 0.5 * d ** 2
    k = k * torch.exp(logps - old)                                   # TRL-default bias correction
    m = mask.double()
    agg = {"grpo": lambda x: ((x * m).sum(-1) / m.sum(-1).clamp(min=1)).mean(),
           "bnpo": lambda x: (x * m).sum() / m.sum(), "dapo": lambda x: (x * m).sum() / m.sum(),
           "dr_grpo": lambda x: (x * m).sum() / (x.shape[0] * L_MAX)}[loss_type]
    assert float(rec.loss) == pytest.approx(float(base + beta * agg(k)), abs=1e-10)
    torch.testing.assert_close(rec.per_token_kl, k * m)


def test_full_vocab_kl():
    """kl_estimator='full' uses the exact Σ_v π(log π − log π_ref) given per token, gradient included."""
    g = torch.Generator().manual_seed(8)
    N, T, V = 8, 12, 11
    logits = torch.randn(N, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logits = torch.randn(N, T, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (N, T), generator=g)
    logp_all, logq_all = logits.log_softmax(-1), ref_logits.log_softmax(-1)
    full = (logp_all.exp() * (logp_all - logq_all)).sum(-1)                               # (N, T)
    kl_div = torch.nn.functional.kl_div(logq_all, logp_all, log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(full, kl_div)                                              # independent formula
    logps = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    _, _, _, adv, mask, entropy = make_inputs(seed=8)
    rec = _compute(logps, None, None, adv, mask, beta=0.2, epsilon_low=0.2, epsilon_high=0.2,
                       loss_type="dapo", max_completion_length=L_MAX, kl_estimator="full", per_token_full_kl=full)
    base, _ = trl_loss(logps, None, None, adv, mask, entropy, beta=0.0, loss_type="dapo")
    m = mask.double()
    assert float(rec.loss.detach()) == pytest.approx(float((base + 0.2 * (full * m).sum() / m.sum()).detach()), abs=1e-10)
    assert rec.kl == pytest.approx(float((full * m).sum().detach() / m.sum()))
    assert not rec.use_bias_correction_kl                            # never IS-weighted
    grad, = torch.autograd.grad(rec.kl_loss, logits)
    assert torch.count_nonzero(grad) > 0


# ------------------------------------------------------------------ the seeds' manual variant
def _seeds_loop(logps, ref, adv, mask, entropy, beta, c_h):
    """manual_grpo_debug.py §3.3 written per sample: loss_i = (−A·mean_t logπ + β·mean_t KL − c·mean_t H)/(B·G),
    here with k3 as the per-token KL (no ratio) and our sampled-id masks."""
    N = logps.shape[0]
    total = 0.0
    for i in range(N):
        m = mask[i].bool()
        if m.sum() == 0:
            continue                                                  # the seeds skip empty completions
        lp, rf, h = logps[i][m], ref[i][m], entropy[i][m]
        kl = torch.exp(rf - lp) - (rf - lp) - 1
        total = total + (-adv[i] * lp.mean() + beta * kl.mean() - c_h * h.mean()) / N
    return total


def test_manual_matches_seeds_formula_and_gradient():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=5)
    lp1, lp2 = logps.clone().requires_grad_(), logps.clone().requires_grad_()
    rec = _compute(lp1, old, ref, adv, mask, beta=0.1, epsilon_low=0.2, epsilon_high=0.2, loss_type="manual",
                       max_completion_length=L_MAX, entropy=entropy, entropy_coef=0.005)
    expected = _seeds_loop(lp2, ref, adv, mask, entropy, 0.1, 0.005)
    assert float(rec.loss.detach()) == pytest.approx(float(expected.detach()), abs=1e-10)
    g1, = torch.autograd.grad(rec.loss, lp1)
    g2, = torch.autograd.grad(expected, lp2)
    torch.testing.assert_close(g1, g2)
    assert "clip_ratio/low_mean" not in rec.metrics and not rec.is_clipped_high.any()
    assert "manual" in str(rec.normalizer)


def test_manual_and_grpo_have_the_same_on_policy_pg_gradient():
    """On-policy (r ≡ 1) TRL's grpo and the seeds' REINFORCE differ in value but not in PG gradient."""
    logps, _, ref, adv, mask, _ = make_inputs(seed=6)
    grads = []
    for lt in ("grpo", "manual"):
        lp = logps.clone().requires_grad_()
        rec = _compute(lp, None, ref, adv, mask, beta=0.0, epsilon_low=0.2, epsilon_high=0.2, loss_type=lt,
                           max_completion_length=L_MAX)
        grads.append(torch.autograd.grad(rec.loss, lp)[0])
    torch.testing.assert_close(grads[0], grads[1])


# ------------------------------------------------------------------ recompute speed, config, errors
def test_recompute_for_new_beta_eps_is_fast():
    """Widgets recompute the whole record for a new β/ε from stored tensors: N=64, T=128 well under 100 ms."""
    g = torch.Generator().manual_seed(0)
    N, T = 64, 128
    logps = -torch.rand(N, T, generator=g) * 4
    old = logps + torch.randn(N, T, generator=g) * 0.3
    ref = logps + torch.randn(N, T, generator=g) * 0.3
    ent = torch.rand(N, T, generator=g)
    mask = torch.ones(N, T)
    adv = torch.randn(N, generator=g)
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        rec = _compute(logps, old, ref, adv, mask, beta=0.01 * i, epsilon_low=0.1 + 0.02 * i, epsilon_high=0.3,
                           loss_type="dapo", max_completion_length=T, entropy=ent, entropy_coef=0.01,
                           num_generations=4)
        times.append(time.perf_counter() - t0)
        assert rec.beta == pytest.approx(0.01 * i)
    assert statistics.median(times) < 0.1, times


def test_objective_from_config():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    cfg = StepConfig(loss_type="bnpo", beta=0.05, delta=1.8, importance_sampling_level="sequence")
    rec = compute_loss(logps, old, ref, adv, mask, Objective.from_config(cfg), LossBatch(entropy=entropy))
    assert (rec.loss_type, rec.beta, rec.delta, rec.importance_sampling_level) == ("bnpo", 0.05, 1.8, "sequence")
    assert "−min(r'·A, clip(r, 0.8, 1.2)·A), r' = min(r, 1.8)" in rec.definition


def test_non_finite_inputs_are_flagged():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    logps = logps.clone()
    logps[0, 0] = float("nan")
    rec = _compute(logps, old, ref, adv, mask, beta=0.1, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo",
                       max_completion_length=L_MAX)
    assert any("non-finite loss" in f for f in rec.flags)
    assert any("per_token_logps" in f for f in rec.flags)
    assert any("fully masked" in f for f in rec.flags)                # row 2 is empty


@pytest.mark.parametrize("change,field", [
    (dict(loss_type="ppo"), "loss_type"),
    (dict(kl_estimator="k4"), "kl_estimator"),
    (dict(importance_sampling_level="group"), "importance_sampling_level"),
    (dict(beta=-0.1), "beta"),
    (dict(epsilon_low=-0.1), "epsilon_low"),
    (dict(delta=0.0), "delta"),
    (dict(loss_type="dr_grpo", max_completion_length=0), "max_completion_length"),
    (dict(entropy_coef=0.1), "entropy"),
    (dict(kl_estimator="full"), "per_token_full_kl"),
    (dict(ref=None), "ref_per_token_logps"),
    (dict(adv_shape=(8, 2)), "advantages"),
    (dict(mask_shape=(8, 5)), "completion_mask"),
    (dict(num_generations=3), "num_generations"),
])
def test_bad_arguments_name_the_field(change, field):
    logps, old, ref, adv, mask, _ = make_inputs(seed=2)
    kw = dict(beta=0.1, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo", max_completion_length=L_MAX)
    if "ref" in change:
        ref = change.pop("ref")
    if "adv_shape" in change:
        adv = torch.zeros(change.pop("adv_shape"))
    if "mask_shape" in change:
        mask = torch.ones(change.pop("mask_shape"))
    kw.update(change)
    with pytest.raises(ConfigError) as e:
        _compute(logps, old, ref, adv, mask, **kw)
    assert e.value.field == field


# ------------------------------------------------------------------ every TRL 1.16 loss type and option
ALL_TRL = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def _small_drift(data, scale=0.15):
    """Old log-probs a short PPO iteration away (|log r| ~ 0.15): VESPO's φ(Π_t r) is not flat 0."""
    logps, old, ref, adv, mask, entropy = data
    g = torch.Generator().manual_seed(99)
    return logps, logps + torch.randn(logps.shape, generator=g, dtype=logps.dtype) * scale, ref, adv, mask, entropy


def _eps(loss_type):
    return dict(epsilon_low=0.2, epsilon_high=5.0 if loss_type == "cispo" else 0.28)


@pytest.mark.parametrize("loss_type", ALL_TRL)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("delta", [None, 1.5])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("opsm", [None, 0.05])
@pytest.mark.parametrize("rho", [1.0, 0.4])
def test_every_trl_loss_type_fp32(loss_type, level, delta, beta, opsm, rho):
    """Loss, gradients (w.r.t. log-probs and entropy) and logged metrics equal TRL 1.16's `_compute_loss`
    to 1e-6 in float32, for every loss type × IS level × δ × β × OPSM × entropy mask (entropy bonus on)."""
    seed = zlib.crc32(repr((loss_type, level, delta, beta, opsm, rho)).encode()) % 1000
    data = _small_drift(make_inputs(seed=seed, N=16, T=20, dtype=torch.float32), 0.15 if level == "token" else 0.6)
    eps = _eps(loss_type)
    if loss_type == "cispo":
        eps["epsilon_high"] = 1.1                                    # the IS cap binds on some tokens
    rec, *rest = run_both(data, beta=beta, loss_type=loss_type, level=level, delta=delta, opsm=opsm, rho=rho,
                          entropy_coef=0.01, **eps)
    assert_matches(rec, *rest, tol=1e-6)
    if opsm is not None:
        assert rec.off_policy_mask is not None and rec.off_policy_mask.shape == (16,)
    if rho < 1:
        assert rec.entropy_mask.shape == (16, 20) and rec.entropy_mask.sum() < data[4].sum()
    torch.testing.assert_close(rec.per_seq_loss.sum(), rec.loss.detach())      # decomposition still sums
    assert loss_type in rec.definition or loss_type in str(rec.normalizer)


@pytest.mark.parametrize("loss_type", ALL_TRL)
def test_every_trl_loss_type_fp64_options_bind(loss_type):
    """fp64 at 1e-9, with OPSM and the entropy mask actually dropping rows/tokens and clips binding."""
    data = _small_drift(make_inputs(seed=31, N=16, T=20), 0.3)
    eps = _eps(loss_type)
    if loss_type == "cispo":
        eps["epsilon_high"] = 1.2
    rec, *rest = run_both(data, beta=0.05, loss_type=loss_type, opsm=0.01, rho=0.5, entropy_coef=0.02, **eps)
    assert_matches(rec, *rest, tol=1e-9)
    assert not bool(rec.off_policy_mask.all()), "OPSM drops no row: the case does not exercise it"
    assert bool(rec.entropy_mask.any()) and not bool(rec.entropy_mask[data[4].bool()].all())
    dropped = ~rec.off_policy_mask
    assert torch.all(rec.per_token_pg[dropped] == 0)
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        assert rec.metrics["clip_ratio/region_mean"] > 0
    if loss_type == "cispo":
        assert rec.metrics["cispo_clip_ratio"] > 0


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo", "grpo", "luspo"])
def test_steps_per_generation_normaliser(loss_type):
    """steps_per_generation ≠ g: TRL rescales num_items_in_batch by g/steps_per_generation (dapo family)."""
    data = _small_drift(make_inputs(seed=5, N=16, T=20), 0.2)
    total = int(data[4].sum()) * 4
    assert_matches(*run_both(data, beta=0.1, loss_type=loss_type, g=2, spg=4, num_items=total, entropy_coef=0.01,
                             **_eps(loss_type)), tol=1e-9)


@pytest.mark.parametrize("loss_type,params", [
    ("sapo", {"sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0}),
    ("vespo", {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.0, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.0}),
])
def test_loss_specific_parameters(loss_type, params):
    data = _small_drift(make_inputs(seed=8, N=16, T=20), 0.1)
    rec, *rest = run_both(data, beta=0.1, loss_type=loss_type, loss_params=params)
    assert_matches(rec, *rest, tol=1e-9)
    assert rec.loss_params == params


def test_opsm_uses_sampling_logps_when_given():
    """OPSM compares the SAMPLING log-probs when given (TRL: vLLM's), else the old ones."""
    logps, old, ref, adv, mask, entropy = _small_drift(make_inputs(seed=17, N=16, T=20), 0.05)
    sampling = old + 0.5                                             # far off-policy at sampling time
    rec, *rest = run_both((logps, old, ref, adv, mask, entropy), beta=0.0, loss_type="dapo", opsm=0.1,
                          sampling=sampling)
    assert_matches(rec, *rest, tol=1e-9)
    assert bool((~rec.off_policy_mask).any())


def test_adaptive_entropy_controller_matches_trl():
    """grpo.phases.iterations.AdaptiveEntropy (applied c_H, then the ± delta update) against TRL's own controller
    state across 4 optimizer steps (one micro-batch each), with the loss of every step compared too."""
    from rookworld_debug.grpo.phases.iterations import AdaptiveEntropy
    cfg = StepConfig(use_adaptive_entropy=True, entropy_coef=0.02, entropy_target=1.4, entropy_coef_delta=0.005,
                     entropy_coef_min=0.0, entropy_coef_max=0.03)
    t = object.__new__(GRPOTrainer)
    t.args = types.SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1,
                                   entropy_target=cfg.entropy_target, entropy_coef_delta=cfg.entropy_coef_delta,
                                   entropy_coef_min=cfg.entropy_coef_min, entropy_coef_max=cfg.entropy_coef_max)
    for k, v in dict(beta=0.0, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="token",
                     top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False,
                     vllm_importance_sampling_correction=False, aux_loss_enabled=False,
                     current_gradient_accumulation_steps=1, max_completion_length=L_MAX, entropy_coef=0.02,
                     _entropy_bonus_enabled=True, use_adaptive_entropy=True, _last_world_entropy=float("inf"),
                     _entropy_window_stats=None).items():
        setattr(t, k, v)
    t.model = types.SimpleNamespace(training=True)
    t.accelerator = _Accelerator()
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    ours = AdaptiveEntropy(cfg)
    applied = []
    for step, scale in enumerate([1.0, 0.6, 0.6, 1.2]):                 # mean entropy ≈ 1.5·scale
        logps, old, ref, adv, mask, entropy = make_inputs(seed=40 + step)
        entropy = entropy * scale
        t._get_per_token_logps_and_entropies = lambda *a, _l=logps, _h=entropy, **k: (_l, _h, None)
        N, T = logps.shape
        inputs = {"prompt_ids": torch.zeros(N, 3, dtype=torch.long), "prompt_mask": torch.ones(N, 3, dtype=torch.long),
                  "completion_ids": torch.zeros(N, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
                  "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
        loss_trl = t._compute_loss(None, inputs)
        rec = _compute(logps, old, None, adv, mask, beta=0.0, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo",
                           max_completion_length=L_MAX, entropy=entropy, entropy_coef=ours.applied())
        assert float(rec.loss) == pytest.approx(float(loss_trl), abs=1e-12), step
        applied.append(ours.applied())
        ours.observe(entropy, mask)
        assert ours.coef == pytest.approx(t.entropy_coef, abs=1e-15) and ours.last_entropy == pytest.approx(
            t._last_world_entropy, abs=1e-12), step
    assert applied[0] == 0.0 and any(a > 0 for a in applied)          # gated at first (TRL: +inf), then on


@pytest.mark.parametrize("loss_type", ALL_TRL)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_every_trl_loss_type_without_bias_correction(loss_type, level):
    data = _small_drift(make_inputs(seed=23, N=16, T=20, dtype=torch.float32), 0.2)
    assert_matches(*run_both(data, beta=0.2, loss_type=loss_type, level=level, bias=False, entropy_coef=0.01,
                             **_eps(loss_type)), tol=1e-6)


IS_MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def _sampling_gap(data, scale, seed=5):
    """Sampling-time log-probs = old ± N(0, scale), with one unscored (NaN) token at an unmasked position."""
    logps, old, ref, adv, mask, entropy = data
    g = torch.Generator().manual_seed(seed)
    sampling = old + torch.randn(old.shape, generator=g, dtype=old.dtype) * scale
    sampling[1, 0] = float("nan")                                   # vLLM could not score it: ρ = 1 there
    return sampling


@pytest.mark.parametrize("mode", IS_MODES)
@pytest.mark.parametrize("loss_type", ALL_TRL)
def test_sampling_correction_matches_trl(mode, loss_type):
    """TRL 1.16's vLLM importance-sampling correction: the ratio from TRL's own code in
    _generate_and_score_completions, applied by TRL's _compute_loss; loss, grads and metrics (incl.
    sampling/*) equal ours. vespo takes ρ inside φ and only token modes (TRL refuses sequence ones)."""
    if loss_type == "vespo" and mode.startswith("sequence"):
        from rookworld_debug.grpo.families import check_settings
        cfg = StepConfig(loss_type="vespo", vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode)
        with pytest.raises(ConfigError, match="vllm_importance_sampling_mode"):
            check_settings(cfg)                 # TRL's vespo row refuses it, before anything loads
        return
    data = _small_drift(make_inputs(seed=31, N=16, T=20), 0.15)
    seq = mode.startswith("sequence")
    sampling = _sampling_gap(data, 0.15 if seq else 0.4)
    is_opts = dict(mode=mode, clip_min=0.5 if mode.endswith("mask") else None, clip_max=1.3)
    rec, *rest = run_both(data, beta=0.1, loss_type=loss_type, sampling=sampling, is_opts=is_opts,
                          entropy_coef=0.01, **_eps(loss_type))
    assert_matches(rec, *rest, tol=1e-9)
    assert any(k.startswith("sampling/importance_sampling_ratio") for k in rest[-1])   # TRL logged them
    rho = rec.importance_sampling_ratio
    assert rho.shape == ((16, 1) if seq else (16, 20)) and rec.vllm_importance_sampling_mode == mode
    kept = rho[rec.completion_mask.bool()] if not seq else rho.flatten()
    if mode.endswith("mask"):
        assert bool((kept == 0).any()) and bool((kept > 0).any())      # the bounds really bite
    else:
        assert float(kept.max()) == pytest.approx(1.3) and float(kept.min()) < 1.0


def test_sampling_correction_ratio_equals_trl_and_changes_the_loss():
    """Our ρ tensor equals TRL's to 1e-6 (float32), and the correction really changes the loss."""
    logps, old, ref, adv, mask, entropy = data = _small_drift(make_inputs(seed=8, N=8, T=12, dtype=torch.float32))
    sampling = _sampling_gap(data, 0.3)
    t = object.__new__(GRPOTrainer)
    t._metrics = {"train": defaultdict(list)}
    t.accelerator = _Accelerator()
    for mode in IS_MODES:
        bounds = dict(clip_min=0.8, clip_max=1.25)
        theirs = trl_sampling_correction(t, old, sampling, mask, mode=mode, **bounds)
        kw = dict(beta=0.0, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo", max_completion_length=L_MAX,
                  sampling_per_token_logps=sampling)
        on = _compute(logps, old, None, adv, mask, **kw, **_is_kwargs(dict(mode=mode, **bounds)))
        off = _compute(logps, old, None, adv, mask, **kw)
        torch.testing.assert_close(on.importance_sampling_ratio, theirs, rtol=1e-6, atol=1e-6)
        assert abs(float(on.loss) - float(off.loss)) > 1e-4, mode
        assert off.importance_sampling_ratio is None and "sampling-time IS" in on.definition


def test_sampling_correction_without_sampling_logps_is_flagged_and_a_no_op():
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    kw = dict(beta=0.0, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo", max_completion_length=L_MAX)
    on = _compute(logps, old, None, adv, mask, **kw, vllm_importance_sampling_correction=True)
    off = _compute(logps, old, None, adv, mask, **kw)
    assert float(on.loss) == float(off.loss) and on.importance_sampling_ratio is None
    assert any("no sampling log-probs" in f for f in on.flags) and not off.flags[-1:] == on.flags[-1:]


def test_sampling_correction_options_are_validated():
    with pytest.raises(ConfigError, match="vllm_importance_sampling_mode"):
        StepConfig(vllm_importance_sampling_mode="token")
    with pytest.raises(ConfigError, match="vllm_importance_sampling_clip_max"):
        StepConfig(vllm_importance_sampling_clip_min=2.0, vllm_importance_sampling_clip_max=1.0)
    with pytest.raises(ConfigError, match="vllm_importance_sampling_mode"):
        StepConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate",
                   vllm_importance_sampling_clip_max=None)
    cfg = StepConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask",
                     vllm_importance_sampling_clip_min=0.5)
    kw = Objective.from_config(cfg)
    assert kw.vllm_importance_sampling_mode == "token_mask" and kw.vllm_importance_sampling_clip_min == 0.5
    assert kw.vllm_importance_sampling_correction is True and kw.vllm_importance_sampling_clip_max == 3.0
    logps, old, ref, adv, mask, entropy = make_inputs(seed=2)
    with pytest.raises(ConfigError, match="vllm_importance_sampling_mode"):
        _compute(logps, old, None, adv, mask, beta=0.0, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo",
                     max_completion_length=L_MAX, vllm_importance_sampling_correction=True,
                     vllm_importance_sampling_mode="sequence")


def test_objective_is_the_config_s_loss_knobs():
    """Every Objective field is a StepConfig setting (max_completion_length: max_new_tokens; settings: the loss
    type's family's section; family: the family answering the loss type) with the same default, so
    Objective.from_config never leaves a knob at a default the user cannot set."""
    cfg = StepConfig()
    names = set(StepConfig.field_names())
    for f in dataclasses.fields(Objective):
        if f.name in ("max_completion_length", "settings", "family"):
            continue
        assert f.name in names, f.name
        if f.default is not dataclasses.MISSING:
            assert getattr(cfg, f.name) == f.default, f.name
    o = Objective.from_config(cfg.replace(beta=0.3, rlvr_kl_type="reverse", max_new_tokens=40, loss_type="rlvr_mini"))
    assert (o.beta, o.settings.rlvr_kl_type, o.max_completion_length) == (0.3, "reverse", 40)
    assert Objective.from_config(cfg).settings is None          # TRL's family has no section of its own
    assert o.family.name == "rookworld-rlvr mini" and Objective.from_config(cfg).family.name == "TRL GRPOTrainer"
