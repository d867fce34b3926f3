"""One full GRPO step: real tiny transformers model, real Stockfish, bundled data."""
import math

import pytest
import torch

from rookworld_debug import StepConfig, StepTrace, run_step
from rookworld_debug.grpo.multistep.start import setup
from rookworld_debug.steplog import format_step_log
from tinymodels import save_tiny_gpt2

B, G = 4, 4


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny_step"))
    # lr chosen by the test: large enough that one step visibly moves a 2-layer model
    return StepConfig(model=str(folder), task="P", batch_size=B, num_generations=G, max_new_tokens=24,
                      eval_max_new_tokens=24, heldout_n=2, engine_depth=6, lr=3e-3, beta=0.1, seed=3)


@pytest.fixture(scope="module")
def session(config):
    s = setup(config)
    yield s
    if s.engine is not None:
        s.engine.close()


@pytest.fixture(scope="module")
def trace(config, session):
    # Row 0 of every group gets the dataset's own (well-formed, legal) completion: Stockfish scores
    # it far above the random model's garbage, so it carries a positive advantage.
    inject = {b * G: session.batch.completions[b] for b in range(B)}
    before = {n: p.detach().clone() for n, p in session.policy.named_parameters()}
    tr = run_step(config, session=session, inject=inject)
    object.__setattr__(tr, "params_before", before)  # test-only attachment to the frozen record
    return tr


@pytest.fixture(scope="module")
def params_before(trace):
    return trace.params_before


def test_step0_invariants_hold(trace):
    inv = trace.setup.invariants
    assert inv.ok, inv.failures
    assert inv.max_abs_logp_diff == 0.0 and inv.max_k3_kl == 0.0 and inv.max_ratio_dev == 0.0
    assert inv.dropout_active == () and not inv.policy_training_mode
    # on-policy: the loss record's ratio is exactly 1 and no token is clipped
    m = trace.rollout.completion_mask.bool()
    assert torch.equal(trace.loss.per_token_ratio[m], torch.ones(int(m.sum())))
    assert trace.loss.metrics["clip_ratio/region_mean"] == 0.0


def test_numbers_are_finite(trace):
    s = trace.summary()
    must_be_finite = ["reward_before", "reward_after", "rollout_reward", "loss", "pg_loss", "kl_loss", "kl",
                      "kl_grad_share", "grad_norm_pre_clip", "grad_norm_post_clip", "frac_reward_zero_std",
                      "advantage_min", "advantage_max", "completions/mean_length"]
    for k in must_be_finite:
        assert math.isfinite(s[k]), (k, s[k])
    # on-policy (step 0, ratio ≡ 1) the loss-VALUE share is not meaningful (metrics.term_balance): NaN, not 100%
    assert math.isnan(s["kl_share"]) and 0.0 <= s["kl_grad_share"] <= 1.0
    for name in ("per_token_logps", "ref_per_token_logps", "per_token_entropy", "per_token_full_kl"):
        assert torch.isfinite(getattr(trace.rollout, name)).all(), name


def test_real_stockfish_scored_the_batch(trace):
    assert trace.counts["engine/calls"] > 0
    injected = trace.rewards.rewards[::G]
    others = trace.rewards.rewards.view(B, G)[:, 1:]
    assert (injected[:, None] > others).all(), "the dataset completion must outscore random garbage"
    assert trace.advantages.zero_std_groups == ()
    assert (trace.advantages.advantages[::G] > 0).all()


def test_parameters_changed(trace, session, params_before):
    assert trace.update is not None and trace.update.param_delta_norm > 0
    changed = [n for n, p in session.policy.named_parameters() if not torch.equal(p, params_before[n])]
    assert len(changed) > 0
    # the update's grad path reproduces the displayed loss record
    assert trace.update.loss_record_diff < 1e-5
    assert trace.update.grad_norm_post_clip <= session.config.max_grad_norm + 1e-4


def test_injected_positive_advantage_completion_gains_logprob(trace):
    e = trace.evaluation
    injected_rows = list(range(0, B * G, G))
    gained = e.per_seq_delta_logp[injected_rows]
    assert (gained > 0).all(), gained
    assert any("INJECTED" in f for f in trace.flags)


def test_per_term_grad_norms_cover_layers(trace):
    u = trace.update
    assert set(u.per_term_global) == {"pg", "kl", "entropy"}
    assert u.per_term_global["pg"] > 0
    assert any(k.startswith("h.") for k in u.per_layer)


def test_trace_round_trips_without_a_model(trace, tmp_path):
    trace.save(tmp_path)
    back = StepTrace.load(tmp_path)
    assert back.setup.policy is None and back.setup.engine is None
    for name in ("completion_ids", "per_token_logps", "ref_per_token_logps", "completion_mask"):
        assert torch.equal(getattr(back.rollout, name), getattr(trace.rollout, name))
    assert torch.equal(back.advantages.advantages, trace.advantages.advantages)
    assert back.summary() == pytest.approx(trace.summary(), nan_ok=True)
    assert back.config == trace.config


def test_step_log_has_every_phase(trace):
    log = format_step_log(trace)
    for section in ("SETUP", "INITIAL PERFORMANCE", "GENERATIONS", "REWARDS", "ADVANTAGES", "LOSS", "UPDATE",
                    "POST-UPDATE PERFORMANCE", "ANALYSIS", "TIMING"):
        assert section in log
    assert "Train_LP=" in log and "Ref_LP=" in log


def test_merged_greedy_rows_give_the_separate_loops_numbers(config):
    """run_step decodes the before-update greedy rows inside the sampling loop. On a fresh session the
    old order (a greedy loop of its own, then the sampling loop) gives the same before-update records, the same
    rollout and the same rewards."""
    from rookworld_debug.grpo.phases.evaluation import greedy_evals
    from rookworld_debug.grpo.phases.shared import sample_and_score
    cfg = config.replace(max_new_tokens=16, eval_max_new_tokens=20, seed=11)
    merged = run_step(cfg)
    s = setup(cfg)
    try:
        heldout = ([x.prompt for x in s.heldout], [x.task for x in s.heldout], [x.completion for x in s.heldout])
        before, before_heldout = greedy_evals(s.policy, s.tokenizer, (s.batch.prompts, s.batch.tasks,
                                                                      s.batch.completions), heldout,
                                              max_new_tokens=cfg.eval_max_new_tokens, reward_mode=cfg.reward_mode,
                                              engine=s.engine)
        rollout, rewards, advantages, _ = sample_and_score(s, cfg)
    finally:
        if s.engine is not None:
            s.engine.close()
    assert merged.before.completions == before.completions and merged.before_heldout.completions == \
        before_heldout.completions
    assert torch.allclose(merged.before.rewards, before.rewards, equal_nan=True)
    assert torch.equal(merged.rollout.completion_ids, rollout.completion_ids)
    assert merged.rollout.completions == rollout.completions
    assert torch.allclose(merged.rewards.rewards, rewards.rewards, equal_nan=True)
    assert torch.allclose(merged.advantages.advantages, advantages.advantages, equal_nan=True)


def test_sampling_is_correction_reaches_the_update(config):
    """TRL's sampling IS correction in a real step: with bf16 sampling (a real sampler-trainer gap on
    the CPU) the record and the update both weight PG by ρ from the rollout's sampling-time log-probs, and agree."""
    cfg = config.replace(sampling_autocast="bf16", vllm_importance_sampling_correction=True,
                         vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0,
                         max_new_tokens=12, eval_max_new_tokens=8, heldout_n=0)
    tr = run_step(cfg)
    assert not any("no sampling" in f for f in tr.flags), tr.flags
    m = tr.rollout.completion_mask.bool()
    gap = (tr.rollout.sampling_per_token_logps - tr.rollout.per_token_logps)[m]  # bf16 sampler vs fp32 trainer
    assert float(gap.abs().max()) > 1e-4
    assert torch.allclose(tr.rollout.per_token_logps[m], tr.update.per_token_logps[m], atol=1e-5)  # both fp32
    lo, hi = (tr.loss.metrics[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "max"))
    assert (lo, hi) != (1.0, 1.0) and hi <= 2.0 + 1e-6          # ρ moves off 1, truncated at the clip
    assert tr.update is not None and tr.update.loss_record_diff <= 1e-5
