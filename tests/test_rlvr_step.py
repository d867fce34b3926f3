"""rookworld-rlvr "mini" inside a real step on the embedded tiny model: the objective end to end, each pitfall
switch's effect in the step's own numbers, and the diagnosis checks that name them."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.diagnosis import rlvr_mini as D
from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.phases.iterations import compare_loss_types
from rookworld_debug.grpo.families.rlvr_mini.pitfalls import trained_prompt_tokens
from rookworld_debug.grpo.step import run_step
from rookworld_debug.grpo.multistep.start import setup

# a short P: prompt beside a long A: prompt: the P: rows get more left pads than prompt tokens
BASE = dict(loss_type="rlvr_mini", reward_mode="rlvr", task="mixed", batch_size=2, num_generations=2,
            prompt_indices=(527, 1621), max_new_tokens=160, heldout_n=0, eval_max_new_tokens=8, device="cpu",
            lr=0.0, entropy_coef=0.01, seed=3)          # lr 0: the shared session's policy never moves


@pytest.fixture(scope="module")
def session():
    torch.set_num_threads(1)
    return setup(StepConfig(**BASE))


@pytest.fixture(scope="module")
def plain(session):
    return run_step(StepConfig(**BASE), session=session)


def _step(session, **kw):
    return run_step(StepConfig(**{**BASE, **kw}), session=session)


def _codes(trace):
    return {f.code for check in D.STEP_CHECKS for f in check(trace)}


def test_mini_step_end_to_end(plain):
    lo = plain.loss
    assert lo.loss_type == "rlvr_mini" and lo.kl_estimator == "rlvr_forward"
    # step 1: policy == reference → k1 observation 0 < 0.5·target → the controller's first update is ×0.8
    assert lo.metrics["rlvr/k1_observation"] == 0.0 and lo.beta == pytest.approx(0.1 * 0.8)
    assert lo.metrics["rlvr/ratio_mean"] == 1.0 and lo.metrics["rlvr/clipped_frac"] == 0.0
    assert float(lo.loss) == pytest.approx(float(lo.pg_loss + lo.kl_loss + lo.entropy_term), abs=1e-7)
    assert float(lo.per_seq_loss.sum()) == pytest.approx(float(lo.loss), abs=1e-6)
    assert plain.update is not None and plain.update.loss_record_diff <= 1e-5
    assert plain.advantages.method == "rlvr_mini"
    assert all(b.kind in ("rlvr_p", "rlvr_a") for b in plain.rewards.breakdowns)


def test_prompt_mask_left_pad_trains_prompt_tokens(session, plain):
    t = _step(session, rlvr_pitfalls=("prompt_mask_left_pad",))
    pm = plain.rollout.prompt_mask
    k = trained_prompt_tokens(pm, pad_first_token=False)
    L, d = pm.sum(1), pm.shape[1] - pm.sum(1)
    assert k.tolist() == [int(l) - 1 if dd >= l else int(min(dd, l)) for l, dd in zip(L, d)]
    assert bool((d[:2] >= L[:2]).all()) and k[:2].tolist() == (L[:2] - 1).tolist()   # P: rows: pads ≥ prompt
    assert k[2:].tolist() == [0, 0]                                                  # the unpadded A: rows
    # the same sampled completions, now with k_i more trained tokens each
    assert t.rollout.completions == plain.rollout.completions
    assert (t.loss.seq_len - plain.loss.seq_len).tolist() == k.tolist()
    assert float(t.loss.metrics["rlvr/entropy_loss"]) != float(plain.loss.metrics["rlvr/entropy_loss"])
    assert "rlvr_prompt_trained" in _codes(t) and "rlvr_prompt_trained" not in _codes(plain)
    assert "rlvr_pad_first_token" not in _codes(t)


def test_pad_first_token_adds_the_first_prompt_token(session):
    a = _step(session, rlvr_pitfalls=("prompt_mask_left_pad",))
    b = _step(session, rlvr_pitfalls=("prompt_mask_left_pad", "pad_first_token"))
    assert (b.loss.seq_len - a.loss.seq_len).tolist() == [1, 1, 0, 0]
    first = b.rollout.per_token_logps[:2, 0]          # log π(first prompt token | pads only)
    assert bool((first < 0).all())
    h_extra = float((-(first.exp() * first)).sum())   # its entropy-surrogate share, rows 0 and 1
    diff = float(b.loss.metrics["rlvr/entropy_loss"] - a.loss.metrics["rlvr/entropy_loss"])
    assert diff == pytest.approx(-0.01 * h_extra / 4, rel=1e-3, abs=1e-7)
    assert "rlvr_pad_first_token" in _codes(b) and "rlvr_pad_first_token" not in _codes(a)


def test_kv_cache_positions_shows_as_a_gap_on_padded_rows(session, plain):
    t = _step(session, rlvr_pitfalls=("kv_cache_positions",))
    r = t.rollout
    gap = ((r.sampling_per_token_logps - r.per_token_logps).abs() * r.completion_mask).amax(1)
    assert float(gap[:2].max()) > 0.1 and float(gap[2:].max()) < 1e-3      # padded P: rows vs the unpadded A:
    assert r.logp_diff_flagged and not plain.rollout.logp_diff_flagged
    assert "rlvr_kv_cache_positions" in _codes(t) and "rlvr_kv_cache_positions" not in _codes(plain)


def test_train_past_eos_trains_tokens_after_eos(session, plain):
    a = plain                                                    # 160 tokens: every row reaches its EOS
    t = _step(session, rlvr_pitfalls=("train_past_eos",))
    r = t.rollout
    assert bool((r.completion_mask.sum(1) == r.completion_ids.shape[1]).all())   # every generated token trained
    assert t.rollout.completions == a.rollout.completions                         # the texts (rewards) unchanged
    extra = (t.loss.seq_len - a.loss.seq_len)
    eos_rows = [i for i, toks in enumerate(r.completion_tokens) if "<|endoftext|>" in toks[:-1]]
    assert eos_rows and bool((extra[eos_rows] > 0).all())       # the short rows now train post-EOS tokens
    assert float(t.loss.metrics["rlvr/entropy_loss"]) != float(a.loss.metrics["rlvr/entropy_loss"])
    assert "rlvr_trained_past_eos" in _codes(t) and "rlvr_trained_past_eos" not in _codes(a)


def test_summed_logprobs_weight_rows_by_length(plain):
    """Per-row gradient weight Σ_t |∂L/∂ℓ_it|: ∝ |o_i|·|A_i| summed (the mini), ∝ |A_i| length-normalised."""
    cfg = plain.config
    a = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)                 # any non-zero advantages
    advantages = dataclasses.replace(plain.advantages, advantages=a)
    rows = {}
    for norm in (False, True):
        rec = compare_loss_types(plain.rollout, advantages, cfg.replace(beta=0.0, entropy_coef=0.0,
                                 rlvr_length_normalize=norm), loss_types=("rlvr_mini",))[0]
        rows[norm] = rec.token_weight.abs().sum(1)
    n = plain.loss.seq_len
    assert torch.allclose(rows[False], (n * a.abs() / 4).float(), rtol=1e-5)     # ∝ length
    assert torch.allclose(rows[True], (a.abs() / 4).float(), rtol=1e-5)
    if float(n.max() / n.min()) >= 2:
        assert "rlvr_summed_logprobs" in _codes(plain)


def test_zero_std_groups_pushed_by_the_global_normalisation():
    from rookworld_debug.grpo.families.rlvr_mini.advantages import rlvr_advantages
    rewards = [-0.3, -0.3, 1.0, 0.2]                                           # group 0 constant
    flat = rlvr_advantages(rewards, 2, baseline_type="group_mean")
    ema = rlvr_advantages(rewards, 2, baseline_type="ema")
    assert flat.advantages[:2].abs().max() < 1e-12
    assert float(ema.advantages[0]) == float(ema.advantages[1]) and abs(float(ema.advantages[0])) > 0.1
    assert any("NON-zero advantage" in f for f in ema.flags)


def test_zero_std_push_in_a_step(session):
    t = _step(session, rlvr_baseline="ema")
    adv = t.advantages
    if not adv.zero_std_groups:
        pytest.skip("no zero-std group in this rollout")
    g = adv.num_generations
    pushed = [b for b in adv.zero_std_groups if float(adv.advantages[b * g:(b + 1) * g].abs().max()) > 1e-6]
    assert pushed and "rlvr_zero_std_push" in _codes(t)


def test_config_rules():
    with pytest.raises(ConfigError, match="rlvr_pitfalls"):
        StepConfig(rlvr_pitfalls=("no_such_fault",))
    with pytest.raises(ConfigError, match="pad_first_token"):
        StepConfig(rlvr_pitfalls=("pad_first_token",))
    assert StepConfig(rlvr_pitfalls="prompt_mask_left_pad,pad_first_token").rlvr_pitfalls == \
        ("prompt_mask_left_pad", "pad_first_token")
    with pytest.raises(ConfigError, match="rlvr_baseline"):
        StepConfig(rlvr_baseline="median")


def test_faults_table_is_well_formed():
    codes = {"rlvr_prompt_trained", "rlvr_pad_first_token", "rlvr_kv_cache_positions", "rlvr_trained_past_eos",
             "rlvr_summed_logprobs", "rlvr_zero_std_push", "rlvr_ratio_against_reference"}
    for code, overrides, accept in D.FAULTS:
        StepConfig(**overrides)                                   # each injects a valid config
        assert set(accept) <= codes, code


@pytest.mark.slow                       # the step command as a subprocess, about 20 s
def test_cli_step_rlvr_mini(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "rookworld_debug.cli", "step", "--set", "loss_type=rlvr_mini", "--set",
           "reward_mode=rlvr", "--set", "batch_size=2", "--set", "num_generations=2", "--set", "max_new_tokens=32",
           "--set", "heldout_n=0", "--set", "eval_max_new_tokens=8", "--set", "rlvr_baseline=ema", "--set",
           "device=cpu", "--out", str(tmp_path / "s")]
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "s" / "trace.json").exists()
    from rookworld_debug.grpo.step import StepTrace
    t = StepTrace.load(tmp_path / "s")
    assert t.loss.loss_type == "rlvr_mini" and "rlvr/clipped_frac" in t.loss.metrics


@pytest.mark.slow            # two set-ups and a bf16-autocast CPU forward: ~2 min on a loaded 2-core machine
def test_reports_check_step_one_arms():
    """What the mini's reports measure at step 1: fp32 policy = reference → clipped_frac 0, kl 0; a bf16 policy
    beside an fp32 reference (the mini's set-up) → the sequence log-ratios are already non-zero."""
    from rookworld_debug.lab.rlvr_reports import run
    kw = dict(steps=1, batch_size=2, num_generations=2, max_new_tokens=48, lr=0.0)
    fp32, bf16 = run(**kw)[0], run(policy_bf16=True, **kw)[0]
    assert fp32["clipped_frac"] == 0.0 and fp32["kl_div"] == 0.0 and fp32["mean_abs_token_logratio"] == 0.0
    assert bf16["mean_abs_token_logratio"] > 1e-4 and bf16["max_abs_seq_logratio"] > 1e-3
    assert bf16["max_abs_seq_logratio"] >= bf16["mean_abs_token_logratio"]       # sums over ≥ 1 token


@pytest.mark.slow            # six steps with 160 new tokens
@pytest.mark.parametrize("code,overrides,accept", D.FAULTS, ids=[f[0] for f in D.FAULTS])
def test_each_fault_is_caught(code, overrides, accept):
    cfg = StepConfig(**{**dict(batch_size=2, num_generations=4, max_new_tokens=160, heldout_n=0,
                               eval_max_new_tokens=8, device="cpu"), **overrides})
    assert set(accept) & _codes(run_step(cfg)), code
