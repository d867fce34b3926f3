"""The parts added to the signal-or-noise diagnostics: the sampler–trainer gap (hand-computed ESS and
weights, NaN/empty flags), the entropy-mechanism covariance and clip events (on the real loss), the G′ subsampling
rules, and the bf16 sampler making a real gap on the CPU."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.signal.entropy_mechanism import clip_events, entropy_mechanism, token_covariance, with_measured
from rookworld_debug.grpo.signal.group_size import check_sizes, default_sizes, subsample_rows
from rookworld_debug.grpo.objective.loss import compute_loss
from rookworld_debug.grpo.objective.params import LossBatch, Objective
from rookworld_debug.grpo.signal.sampler_gap import TRL_IS_CAP, ess, sampler_trainer_gap
from tinymodels import use_spare_cores


def test_gap_weights_and_ess_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.1, 0.0, 0.0]])
    delta = torch.tensor([[0.0, -1.5, 0.2, 9.0], [0.1, 0.0, 0.0, 0.0]])      # Δ = sampler − trainer
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    g = sampler_trainer_gap(trainer + delta, trainer, mask, cap=2.0)
    d = np.array([0.0, -1.5, 0.2, 0.1, 0.0])                                 # masked, row-major
    w = np.minimum(np.exp(-d), 2.0)                                          # e^{1.5} = 4.48 → capped at 2
    assert g.n_tokens == 5 and g.n_seqs == 2 and g.delta.tolist() == pytest.approx(d.tolist())
    assert g.ess_token == pytest.approx(w.sum() ** 2 / (w ** 2).sum())
    assert g.ess_token_frac == pytest.approx(g.ess_token / 5)
    ws = np.minimum(np.exp(-np.array([-1.3, 0.1])), 2.0)                      # sequence sums of Δ
    assert g.ess_seq == pytest.approx(ws.sum() ** 2 / (ws ** 2).sum())
    assert g.frac_capped == pytest.approx(1 / 5) and g.is_max == 2.0 and g.max_abs == pytest.approx(1.5)
    assert dict(g.quantiles)[0.5] == pytest.approx(0.0) and g.metrics["sampling/sampling_logp_difference/max"] == 1.5
    assert g.cap == 2.0 and TRL_IS_CAP == 3.0                                 # TRL 1.16 vllm_importance_sampling_clip_max


def test_gap_bad_inputs_are_flagged_or_named():
    t = torch.zeros(2, 3)
    empty = sampler_trainer_gap(t, t, torch.zeros(2, 3))
    assert empty.n_tokens == 0 and math.isnan(empty.ess_token) and "no masked tokens" in empty.flags[0]
    s = t.clone()
    s[0, 1] = math.nan
    g = sampler_trainer_gap(s, t, torch.ones(2, 3))
    assert g.nan_tokens == 1 and g.max_abs == 0.0 and g.ess_token_frac == 1.0 and "TRL's rule" in g.flags[0]
    with pytest.raises(ConfigError, match="cap"):
        sampler_trainer_gap(t, t, torch.ones(2, 3), cap=0)
    with pytest.raises(ConfigError, match="shapes"):
        sampler_trainer_gap(t, torch.zeros(2, 4), torch.ones(2, 3))
    assert math.isnan(ess(torch.zeros(3))) and ess(torch.ones(7)) == pytest.approx(7.0)


def test_token_covariance_and_the_measured_change():
    lp = torch.tensor([[-0.1, -2.0, 0.0], [-1.0, -0.5, -3.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    x = np.array([-0.1, -2.0, -1.0, -0.5, -3.0])
    a = np.array([1.0, 1.0, -1.0, -1.0, -1.0])
    want = float(((x - x.mean()) * (a - a.mean())).mean())                   # population covariance over tokens
    assert token_covariance(lp, adv, mask) == pytest.approx(want)
    ent = torch.tensor([[0.5, 0.2, 0.0], [1.0, 0.1, 0.3]])
    em = entropy_mechanism(lp, ent, adv, mask, lr=0.1)
    assert em.predicted_delta_entropy == pytest.approx(-0.1 * want) and em.entropy_before == pytest.approx(2.1 / 5)
    after = ent + 0.2 * mask                                                 # +0.2 nats on every masked token
    done = with_measured(em, mask, after, None)
    assert done.measured_delta_entropy == pytest.approx(0.2) and math.isnan(done.measured_first_step)
    assert done.implied_eta == pytest.approx(-0.2 / want)
    assert done.sign_agrees is ((-0.1 * want > 0) == (0.2 > 0))
    nothing = entropy_mechanism(lp, ent, adv, torch.zeros(2, 3), lr=0.1)
    assert math.isnan(nothing.cov) and nothing.flags


def test_clip_events_split_by_bound_and_sign_of_the_advantage():
    # 4 rows × 3 tokens; ratios r = exp(ℓ − ℓ_old): 0.5 (below 1 − 0.2), 1.0, 2.0 (above 1 + 0.2)
    old = torch.zeros(4, 3)
    logps = torch.log(torch.tensor([0.5, 1.0, 2.0])).expand(4, 3).clone()
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0])
    mask = torch.ones(4, 3)
    mask[3, 2] = 0                                                           # one high, A < 0 token masked out
    lo = compute_loss(logps, old, None, adv, mask, Objective(beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                                                            loss_type="dapo", max_completion_length=3))
    ev = clip_events(lo, 1)
    assert (ev.clip_low_neg, ev.clip_high_pos, ev.low_pos, ev.high_neg, ev.n_tokens) == (2, 2, 2, 1, 11)
    assert ev.share_clip_low_neg == pytest.approx(2 / 11) and ev.pass_index == 1
    assert ev.clip_low_neg == int(lo.is_clipped_low.sum()) and ev.clip_high_pos == int(lo.is_clipped_high.sum())


def test_group_size_rules():
    assert default_sizes(4) == (2, 3) and default_sizes(16) == (2, 8, 15) and default_sizes(16, 4) == (2, 6, 11, 15)
    assert default_sizes(2) == ()
    with pytest.raises(ConfigError, match="G′"):
        check_sizes([2, 4], 4)                                               # G′ = G is the step itself
    with pytest.raises(ConfigError, match="G′"):
        check_sizes([1], 4)
    gen = torch.Generator().manual_seed(0)
    rows = subsample_rows(3, 5, 2, gen)
    assert rows.shape == (6,)
    for b in range(3):                                                       # G′ distinct rows of group b, in order
        part = rows[2 * b:2 * b + 2].tolist()
        assert all(5 * b <= r < 5 * b + 5 for r in part) and part == sorted(set(part))
    again = subsample_rows(3, 5, 2, torch.Generator().manual_seed(0))
    assert torch.equal(rows, again)


@pytest.mark.slow          # bf16 matmuls on a CPU without bf16 units: ~20 s idle, 80 s on a loaded machine
def test_bf16_sampler_makes_a_real_gap_on_the_cpu(fixtures_dir):
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.signal.noise import GradForward
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import sample_and_score

    use_spare_cores()
    cfg = StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"), batch_size=2,
                               num_generations=2, max_new_tokens=10, heldout_n=0, p_temperature=2.0, beta=0.0)
    s = setup(cfg)
    gaps = {}
    for mode in (None, "bf16"):
        c = cfg.replace(sampling_autocast=mode)
        rollout = sample_and_score(s, c)[0]
        fw = GradForward(s.policy, rollout, c)
        gaps[mode] = sampler_trainer_gap(rollout.sampling_per_token_logps, fw.logps.detach(), fw.mask)
        assert ("sampling_autocast='bf16'" in rollout.warnings[-1]) is (mode == "bf16")
    assert gaps[None].max_abs <= 1e-6                    # fp32 sampler = fp32 trainer (KV cache vs full forward)
    assert gaps["bf16"].max_abs > 1e-5 > gaps[None].max_abs and gaps["bf16"].ess_token_frac < 1.0
    with pytest.raises(ConfigError, match="sampling_autocast"):
        sample_and_score(s, cfg.replace(sampling_autocast="fp8"))


def test_group_size_sweep_matches_a_fresh_forward_on_the_kept_rows(tiny_byte_model_dir, fixtures_dir):
    """Oracle: a G′ draw's gradient through the shared forward = a fresh forward + backward on only the kept rows
    (advantages recomputed on their rewards); zero-std and NaN rewards come back flagged, not as numbers."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.families import advantages_from_config
    from rookworld_debug.grpo.signal.noise import GradForward, per_group_grads
    from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy
    from rookworld_debug.grpo.signal.group_size import _cos, group_size_sweep
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import sample_and_score

    cfg = StepConfig().replace(model=str(tiny_byte_model_dir), reward_mode="dataset", heldout_n=0, batch_size=2,
                               dataset=str(fixtures_dir / "rook_p_lines.txt"), num_generations=4, max_new_tokens=8,
                               eval_max_new_tokens=8)
    s = setup(cfg)
    rollout, _r, adv, _l = sample_and_score(s, cfg)
    rewards = torch.tensor([0.0, 1.0, 3.0, 2.0, 1.0, 0.0, 0.5, 2.0], dtype=torch.float64)   # spread in both groups
    adv = advantages_from_config(rewards, cfg)
    fw = GradForward(s.policy, rollout, cfg)
    full = per_group_grads(s.policy, rollout, adv, cfg, forward=fw).sum(0)                 # (P,)
    sw = group_size_sweep(fw, rewards, cfg, full, sizes=[2], draws=1, seed=5)
    rows = subsample_rows(2, 4, 2, torch.Generator().manual_seed(5))                        # the sweep's first draw
    sub_cfg = cfg.replace(num_generations=2)
    a = advantages_from_config(rewards[rows], sub_cfg).advantages
    lp, _ = per_token_logps_and_entropy(s.policy, rollout.prompt_ids[rows], rollout.prompt_mask[rows],
                                        rollout.completion_ids[rows], rollout.completion_mask[rows],
                                        rollout.temperatures[rows], with_grad=True)
    rec = compute_loss(lp, None, rollout.ref_per_token_logps[rows], a.to(lp.dtype), rollout.completion_mask[rows],
                       Objective.from_config(cfg),
                       LossBatch(num_items_in_batch=float(rollout.completion_mask[rows].sum()), num_generations=2))
    fresh = torch.cat([g.reshape(-1) for g in torch.autograd.grad(rec.loss, fw.params)])
    want_cos, want_ratio = _cos(fresh, full)
    assert float(sw.cosines[0, 0]) == pytest.approx(want_cos, abs=1e-5)
    assert float(sw.norm_ratio[0, 0]) == pytest.approx(want_ratio, rel=1e-4)
    assert sw.flags == () and sw.zero_signal_draws == (0,) and float(sw.cosines[0, 0]) < 1 - 1e-6
    flat = group_size_sweep(fw, torch.ones(8, dtype=torch.float64), cfg, full, sizes=[2], draws=1)
    assert flat.zero_signal_draws == (1,) and "zero-std" in flat.flags[0]
    bad = rewards.clone()
    bad[1] = math.nan
    nan_sw = group_size_sweep(fw, bad, cfg, full, sizes=[3], draws=1, seed=1)       # seed 1 keeps the NaN row 1
    kept_nan = bool(torch.isnan(bad[subsample_rows(2, 4, 3, torch.Generator().manual_seed(1))]).any())
    assert kept_nan and any("NaN" in f for f in nan_sw.flags) and bool(torch.isfinite(nan_sw.cosines).all())
    with pytest.raises(ConfigError, match="G′"):
        group_size_sweep(fw, rewards, cfg, full, sizes=[4])
