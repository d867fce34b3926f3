"""The group gradients sum to the step's gradient; noise_scale recovers a known Σ's figures on
synthetic Gaussian gradients; the paired bootstrap equals a reference loop."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rookworld_debug.grpo.signal.noise import gram64, noise_scale, paired_bootstrap_ci, per_group_grads
from rookworld_debug.grpo.phases.generation import LOGP_DIFF_TOLERANCE
from tinymodels import use_spare_cores


def test_noise_scale_recovers_a_known_sigma():
    gen = torch.Generator().manual_seed(0)
    p, b, sigma = 64, 2000, 0.5
    g_true = torch.randn(p, generator=gen, dtype=torch.float64)
    grads = g_true + sigma * torch.randn(b, p, generator=gen, dtype=torch.float64)       # Σ = σ² I
    ns = noise_scale(grads, n_boot=200)
    tr = p * sigma ** 2
    assert ns.trace_sigma == pytest.approx(tr, rel=0.03)
    assert ns.grad_sq == pytest.approx(float(g_true @ g_true), rel=0.03)
    assert ns.b_simple == pytest.approx(tr / float(g_true @ g_true), rel=0.06)
    assert ns.snr == pytest.approx(b / ns.b_simple, rel=1e-9) and not ns.pure_noise and ns.trustworthy
    assert ns.snr_ci[0] <= ns.snr <= ns.snr_ci[1]


def test_grad_sq_is_unbiased_at_four_groups_and_pure_noise_is_flagged():
    gen = torch.Generator().manual_seed(1)
    p, b, sigma = 16, 4, 1.0
    g_true = 0.3 * torch.ones(p, dtype=torch.float64)
    est = [noise_scale(g_true + sigma * torch.randn(b, p, generator=gen, dtype=torch.float64), n_boot=0).grad_sq
           for _ in range(2000)]
    assert float(np.mean(est)) == pytest.approx(float(g_true @ g_true), abs=0.1)    # |G|² = 1.44 (se ≈ 0.03)
    noise = noise_scale(torch.randn(b, p, generator=gen, dtype=torch.float64) * 0 + torch.eye(b, p, dtype=torch.float64))
    assert noise.pure_noise and noise.snr == 0 and math.isinf(noise.b_simple) and "pure noise" in noise.note
    assert not noise.trustworthy


def test_paired_bootstrap_matches_a_reference_loop():
    rng = np.random.default_rng(3)
    before = rng.normal(0.2, 0.3, 37)
    after = before + rng.normal(0.05, 0.1, 37)
    got = paired_bootstrap_ci(before, after, n_boot=500, seed=11, level=0.9)
    ref_rng = np.random.default_rng(11)
    d = after - before
    means = []
    draws = ref_rng.integers(0, d.size, size=(500, d.size))
    for row in draws:                                   # one resample of the pairs at a time
        means.append(sum(d[i] for i in row) / d.size)
    want = tuple(np.quantile(means, [0.05, 0.95]))
    assert got == pytest.approx(want, abs=1e-12)
    # NaN pairs are dropped, not propagated
    b2, a2 = np.append(before, np.nan), np.append(after, 1.0)
    assert paired_bootstrap_ci(b2, a2, n_boot=500, seed=11, level=0.9) == pytest.approx(got, abs=1e-12)


def test_group_gradients_sum_to_the_step_gradient(fixtures_dir):
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy
    from rookworld_debug.grpo.objective.loss import compute_loss
    from rookworld_debug.grpo.objective.params import LossBatch, Objective
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import sample_and_score

    use_spare_cores()
    cfg = StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"), batch_size=3,
                               num_generations=4, max_new_tokens=24, eval_max_new_tokens=8, heldout_n=0, beta=0.05,
                               entropy_coef=0.01)
    s = setup(cfg)
    rollout, _rewards, adv, _loss = sample_and_score(s, cfg)
    rows = per_group_grads(s.policy, rollout, adv, cfg)                                   # (B, P)
    params = [p for _, p in s.policy.named_parameters() if p.requires_grad]
    assert rows.shape == (3, sum(p.numel() for p in params))
    lp, ent = per_token_logps_and_entropy(s.policy, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                          rollout.completion_mask, rollout.temperatures, with_grad=True,
                                          entropy_grad=True)
    rec = compute_loss(lp, None, rollout.ref_per_token_logps, adv.advantages.to(lp.dtype), rollout.completion_mask,
                       Objective.from_config(cfg), LossBatch(entropy=ent, num_items_in_batch=float(rollout.completion_mask.sum()),
                                                             num_generations=4))
    grads = torch.autograd.grad(rec.loss, params)
    full = torch.cat([g.reshape(-1) for g in grads])
    # How close the two can be: both add the same per-token terms of the loss into each weight's gradient, n of them
    # (N = B·G rows × T = prompt + completion positions, plus the B group rows), in different orders (one batched
    # backward here; one backward per row, summed per group, then over the groups). A float32 sum of n terms in
    # another order differs by at most about n·u of the terms' size (u = 2⁻²⁴ the unit roundoff; Higham's γ_n), so
    # the bound is n·u: (12·90 + 3)·2⁻²⁴ ≈ 6.5e-5 here. Measured 7.6e-6 (1.1e-5 once): above the typical √n·u ≈ 2e-6,
    # the backward chaining six layers of such sums. A wrong sum is far outside: below, a group left out, and one
    # parameter tensor's gradient off by 0.1 % (≈ 3e-4).
    u = 2.0 ** -24
    n_rows, n_pos = rollout.completion_ids.shape[0], rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
    tol = (n_rows * n_pos + rows.shape[0]) * u

    def rel(approx: torch.Tensor) -> float:
        return float((approx.double() - full.double()).norm() / full.double().norm())

    err = rel(rows.sum(0))
    assert err <= tol, (err, tol)
    assert float(full.norm()) > 0
    largest = int(rows.double().norm(dim=1).argmax())
    assert rel(rows.sum(0) - rows[largest]) > tol
    off = rows.sum(0).clone()
    off[:params[0].numel()] *= 1.001
    assert rel(off) > tol
    # the 6.5e-4 "mystery": the update's grad_norm_pre_clip is a norm of per-parameter norms, while the
    # diagnostics took ONE float32 reduction over all P ≈ 4.9·10⁶ entries, which is off by ~1e-3 here. The
    # gradients themselves agree (above); the diagnostics now take every norm and cosine in float64 (gram64).
    exact = float(full.double().norm())
    per_param = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    # a float32 norm of m entries sums m positive squares (no cancellation): rounding errors of random sign grow as
    # √m·u, m = the largest parameter tensor's size (256·1024 here: 3.1e-5; measured 6e-6)
    tol_norm = math.sqrt(max(p.numel() for p in params)) * u
    assert abs(per_param / exact - 1) < tol_norm
    # the diagnostics' forward runs row by row: it rounds differently from this batched one, within the bound
    # the gradients agree to above (| ‖a‖ − ‖b‖ | ≤ ‖a − b‖)
    assert math.sqrt(float(gram64(rows).sum())) == pytest.approx(exact, rel=tol)
    assert abs(float(full.norm()) / exact - 1) > tol_norm, "float32 flat norm became exact: update the comment above"


def test_run_step_with_diagnostics_records_and_renders_them(fixtures_dir, tmp_path):
    from rookworld_debug import StepTrace, viz
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.step import run_step

    use_spare_cores()
    cfg = StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"), batch_size=2,
                               num_generations=4, max_new_tokens=16, eval_max_new_tokens=8, heldout_n=1,
                               diagnostics=True, num_iterations=2, warmup_steps=0, entropy_coef=0.01, lr=3e-4,
                               p_temperature=1.5)

    def by_row(prompts, completions, **kw):          # reward spread inside every group (the tiny model is peaked)
        return [float(i % 3) for i in range(len(completions))]
    tr = run_step(cfg, reward_funcs={"by_row": by_row})
    d = tr.diagnostics
    # Σ_b g_b is the gradient the first optimizer step clipped. Two causes of disagreement (the "6.5e-4" gap):
    # (1) a float32 flat norm over all P (fixed: float64, see test_group_gradients_sum_to_the_step_gradient);
    # (2) here the tiny model samples the SAME completion G times, so the PG gradient Σ_i A_i ∇ℓ_i is a cancellation
    # (Σ A_i = 0) of per-token terms far larger than the net gradient (‖∇PG‖ ≈ 4e-8 against 8e-5 of entropy bonus):
    # fp32 rounding of those terms (~1e-7 of their size) differs between one backward of the total (diagnostics) and
    # one backward per term (update) and reaches ~1e-3 of the small net gradient. The default step (distinct
    # completions) agrees to 5e-6.
    up = tr.iterations[0].updates[0]
    assert tr.rollout.unique_per_group.max() == 1 and up.per_term_global["pg"] < 1e-3 * up.grad_norm_pre_clip
    assert d.step_grad_norm == pytest.approx(up.grad_norm_pre_clip, rel=3e-3)
    assert d.group_cos.shape == (2, 2) and torch.allclose(torch.diagonal(d.group_cos), torch.ones(2), atol=1e-4)
    assert float(d.group_weights.sum()) == pytest.approx(1.0)
    lo, hi = d.delta_reward_ci
    assert lo <= tr.evaluation.delta_reward_batch <= hi
    # G′ sweep: G′ = 2, 3 of G = 4, two draws each, cosines in [−1, 1] and the advantages recomputed (PG signal)
    sw = d.group_size
    assert sw.sizes == (2, 3) and sw.cosines.shape == (2, 2) and sw.zero_signal_draws == (0, 0)
    assert bool(((sw.cosines.abs() <= 1 + 1e-9) & torch.isfinite(sw.cosines)).all())
    assert sw.cos_mean[1] < 1 - 1e-6                 # a subset is not the full batch
    # entropy mechanism: the covariance of the sampled tokens, measured after one step and after the whole update
    e = d.entropy
    assert math.isfinite(e.cov) and e.predicted_delta_entropy == pytest.approx(-3e-4 * e.cov)
    assert math.isfinite(e.measured_first_step) and math.isfinite(e.measured_delta_entropy)
    assert len(e.clip) == 2 and e.clip[0].clip_low_neg == e.clip[0].clip_high_pos == 0    # pass 1: ratio 1
    assert e.clip[1].clip_high_pos == int(tr.iterations[1].loss.is_clipped_high.sum())
    # fp32 sampler and fp32 trainer on the CPU: KV-cache vs full-forward rounding only (the recompute tolerance)
    assert d.gap.max_abs <= LOGP_DIFF_TOLERANCE and d.gap.ess_token_frac == pytest.approx(1.0, abs=1e-6)
    back = StepTrace.load(tr.save(tmp_path / "t"))
    assert back.diagnostics.noise.snr == d.noise.snr and back.diagnostics.group_size.sizes == (2, 3)
    html = viz.signal_noise_from_trace(back)._repr_html_()
    for label in ("SNR across groups", "B_simple", "paired bootstrap", "what if G were smaller",
                  "predicted entropy change −η·Cov", "measured entropy change", "sampler–trainer gap",
                  "truncated IS weights ESS", "clip-low, A&lt;0"):
        assert label in html, label
    assert viz.group_cosine_figure_from_trace(back) is not None
    assert len(viz.group_size_figure_from_trace(back).data) == 2 and viz.sampler_gap_figure_from_trace(back) is not None
    assert float(d.group_grad_norms.max()) > 1e-5
    off = dataclasses.replace(back, diagnostics=None)            # a step run without StepConfig.diagnostics
    assert "not computed" in viz.signal_noise_from_trace(off)._repr_html_()
    assert viz.group_size_figure_from_trace(off) is None
