"""Inner PPO iterations: μ passes over one rollout with old log-probs frozen at sampling,
steps_per_generation optimizer steps per pass, per-iteration records; a real (tiny) transformers model."""
import math

import pytest
import torch

from rookworld_debug import StepTrace, run_step
from rookworld_debug.grpo.multistep.start import setup
from tinymodels import save_tiny_gpt2, tiny_step_config

B, G = 2, 4


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny_iter"))
    return tiny_step_config(folder, batch_size=B, num_generations=G, max_new_tokens=16, lr=3e-3, beta=0.1, seed=3)


def _run(config, inject_dataset=True):
    s = setup(config)
    # row 0 of each group = the dataset completion (reward 1 in dataset mode): non-zero advantages
    inject = {b * G: s.batch.completions[b] for b in range(B)} if inject_dataset else None
    return run_step(config, session=s, inject=inject)


@pytest.fixture(scope="module")
def mu3(base):
    return _run(base.replace(num_iterations=3, epsilon_low=0.05, epsilon_high=0.05))


def test_mu3_ratio_moves_and_clip_binds_after_the_first_pass(mu3):
    assert len(mu3.iterations) == 3
    assert all(it.loss.loss_type == "dapo" for it in mu3.iterations)
    m = mu3.rollout.completion_mask.bool()
    first = mu3.iterations[0].loss
    # pass 1 runs at the sampling θ: ratio = 1 up to the recompute noise of two forwards
    assert (first.per_token_ratio[m] - 1).abs().max() < 1e-4
    for it in mu3.iterations[1:]:
        r = it.loss.per_token_ratio[m]
        assert (r - 1).abs().max() > 1e-3, it.index                 # the policy moved between passes
        assert it.loss.metrics["clip_ratio/region_mean"] > 0, it.index
        assert (it.loss.is_clipped_low | it.loss.is_clipped_high).any()
    # per-iteration grad norms and loss terms are recorded, and summary() reports the LAST pass (TRL)
    assert all(math.isfinite(it.grad_norm_pre_clip) for it in mu3.iterations)
    s = mu3.summary()
    assert s["clip_ratio/region_mean"] == mu3.iterations[-1].loss.metrics["clip_ratio/region_mean"]
    assert s["loss"] == float(mu3.iterations[-1].loss.loss)
    assert mu3.counts["update/optimizer_steps"] == 3


def test_mu1_is_todays_step(base):
    """μ = 1: one optimizer step, ratio exactly 1, the iteration record equals the displayed loss record."""
    tr = _run(base)
    assert len(tr.iterations) == 1 and len(tr.iterations[0].updates) == 1
    assert tr.update is tr.iterations[0].updates[0]
    m = tr.rollout.completion_mask.bool()
    assert torch.equal(tr.iterations[0].loss.per_token_ratio[m], torch.ones(int(m.sum())))
    assert torch.equal(tr.loss.per_token_ratio[m], torch.ones(int(m.sum())))
    assert abs(float(tr.iterations[0].loss.loss) - float(tr.loss.loss)) < 1e-5
    assert tr.update.loss_record_diff < 1e-5
    assert tr.summary()["loss"] == float(tr.loss.loss)


def test_steps_per_generation_splits_the_rollout(base):
    """steps_per_generation = 2 with μ = 1: two optimizer steps on half the rows each; the second is
    off-policy (old log-probs frozen at sampling), as in TRL."""
    tr = _run(base.replace(steps_per_generation=2, epsilon_low=0.05, epsilon_high=0.05))
    (it,) = tr.iterations
    assert [u.rows for u in it.updates] == [(0, 4), (4, 8)]
    m = tr.rollout.completion_mask.bool()
    r = it.loss.per_token_ratio
    assert (r[:4][m[:4]] - 1).abs().max() < 1e-4                    # trained at the sampling θ
    assert (r[4:][m[4:]] - 1).abs().max() > 1e-3                    # trained after the first step


def test_iterations_round_trip(mu3, tmp_path):
    back = StepTrace.load(mu3.save(tmp_path / "t"))
    assert len(back.iterations) == 3
    torch.testing.assert_close(back.iterations[2].loss.per_token_ratio, mu3.iterations[2].loss.per_token_ratio)
    assert back.iterations[2].loss.metrics == mu3.iterations[2].loss.metrics


def test_loss_for_iteration_recomputes_the_pass_and_eps_acts(mu3):
    from rookworld_debug.grpo.phases.iterations import loss_for_iteration
    it = mu3.iterations[-1]
    same = loss_for_iteration(mu3.rollout, mu3.advantages, mu3.config, it)
    assert float(same.loss) == pytest.approx(float(it.loss.loss), abs=1e-7)
    wide = loss_for_iteration(mu3.rollout, mu3.advantages, mu3.config.replace(epsilon_low=0.5, epsilon_high=0.5), it)
    assert wide.metrics["clip_ratio/region_mean"] < it.loss.metrics["clip_ratio/region_mean"]
    assert float(wide.pg_loss) != float(it.loss.pg_loss)            # ε moves the PG term of an off-policy pass
    assert float(loss_for_iteration(mu3.rollout, mu3.advantages, mu3.config.replace(beta=0.5), it).kl_loss) \
        != float(it.loss.kl_loss)


def test_compare_loss_types_is_a_pure_recompute(mu3):
    from rookworld_debug.grpo.phases.iterations import compare_loss_types
    from rookworld_debug.grpo.objective.loss import LOSS_TYPES
    rows = compare_loss_types(mu3.rollout, mu3.advantages, mu3.config, iteration=mu3.iterations[-1])
    assert [r.loss_type for r in rows] == list(LOSS_TYPES)
    m = mu3.rollout.completion_mask.bool()
    by = {r.loss_type: r for r in rows}
    assert float(by["dapo"].loss.loss) == pytest.approx(float(mu3.iterations[-1].loss.loss), abs=1e-7)
    for r in rows:
        assert r.token_weight.shape == m.shape and torch.all(r.token_weight[~m] == 0), r.loss_type
        assert math.isfinite(r.grad_norm_logps) and r.grad_norm_logps > 0, r.loss_type
        assert not r.loss.loss.requires_grad
    # the aggregations really differ: per-token weights of grpo vs dapo are not proportional everywhere
    assert not torch.allclose(by["grpo"].token_weight / by["grpo"].grad_norm_logps,
                              by["dapo"].token_weight / by["dapo"].grad_norm_logps)
    on = compare_loss_types(mu3.rollout, mu3.advantages, mu3.config, loss_types=("dapo", "cispo"))
    assert float(on[0].loss.loss) == pytest.approx(float(mu3.loss.loss), abs=1e-7)   # sampling-time record


def test_iteration_views_render(mu3):
    from rookworld_debug import viz
    tab = viz.iteration_table_from_trace(mu3).html
    assert tab.count("<tr>") == 1 + 3 and "clip region" in tab and "sampled rollout" in tab
    fig = viz.iteration_ratio_histogram_from_trace(mu3)
    assert [t.name for t in fig.data] == ["pass 1", "pass 2", "pass 3"]
    strip = viz.iteration_token_strips_from_trace(mu3, -1, "ratio", rows=list(range(8)))
    assert "rw-out" in strip.html                                   # clipped tokens outlined
    table, fig2 = viz.loss_type_comparison_from_trace(mu3)
    for lt in ("dapo", "grpo", "cispo", "sapo", "luspo", "vespo", "manual"):
        assert f"<b>{lt}</b>" in table.html
    assert "pass 3 of μ = 3" in table.html and len(fig2.data) == 4


def test_step_log_lists_the_passes(mu3):
    from rookworld_debug.steplog import format_step_log
    log = format_step_log(mu3)
    assert "3 inner passes over the rollout" in log
    assert log.count("    pass ") == 3 and "clip_ratio/region_mean" in log
