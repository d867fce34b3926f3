"""The tune panel on a DRIFTED step: a real step with μ = 2 inner passes; the panel's β and ε knobs
recompute the record of an off-policy pass (r ≠ 1), so both change the loss record — no forward pass."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("ipywidgets")

B, G = 2, 4


@pytest.fixture(scope="module")
def drifted(tmp_path_factory):
    from rookworld_debug import StepConfig, run_step
    from rookworld_debug.grpo.multistep.start import setup
    from tinymodels import save_tiny_gpt2
    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny_panel"))
    cfg = StepConfig(model=str(folder), task="P", batch_size=B, num_generations=G, max_new_tokens=16,
                     eval_max_new_tokens=8, heldout_n=0, reward_mode="dataset", lr=3e-3, beta=0.1, seed=3,
                     num_iterations=2, epsilon_low=0.05, epsilon_high=0.05)
    s = setup(cfg)
    return run_step(cfg, session=s, inject={b * G: s.batch.completions[b] for b in range(B)})


def _attr(p, name: str) -> float:
    return float(re.search(rf'data-{name}="([^"]+)"', p.w_summary.value).group(1))


def test_beta_and_eps_change_the_record_of_a_drifted_pass(drifted):
    from rookworld_debug.grpo.phases.iterations import loss_for_iteration
    from rookworld_debug.widgets import tune_panel_from_trace
    p = tune_panel_from_trace(drifted)
    assert p.iteration == 1 and "pass 2 of μ = 2" in dict((v, k) for k, v in p.w_iter.options)[1]
    rec0 = p.loss
    assert rec0.kl > 0 and _attr(p, "clip-region") > 0              # π ≠ π_ref and clipping binds at pass 2
    assert float(rec0.loss) == pytest.approx(float(drifted.iterations[1].loss.loss), abs=1e-7)

    p.w_beta.value = 0.2                                            # β: the KL term scales
    assert float(p.loss.kl_loss) == pytest.approx(2 * float(rec0.kl_loss), rel=1e-6)
    assert _attr(p, "loss") != pytest.approx(float(rec0.loss)) and _attr(p, "beta") == 0.2

    p.w_eps_low.value, p.w_eps_high.value = 0.3, 0.3                # ε: fewer clipped tokens, another PG term
    assert _attr(p, "clip-region") < rec0.metrics["clip_ratio/region_mean"]
    assert _attr(p, "pg") != pytest.approx(float(rec0.pg_loss), abs=1e-12)
    direct = loss_for_iteration(drifted.rollout, p.state.advantages, p.config, drifted.iterations[1])
    assert float(direct.loss) == pytest.approx(float(p.loss.loss), abs=1e-9)
    assert p.last_loss_for_s < 0.5

    p.w_iter.value = -1                                             # the sampling-time record: r ≡ 1
    assert p.loss.metrics["clip_ratio/region_mean"] == 0.0
    pg = float(p.loss.pg_loss)
    p.w_eps_low.value = 0.1
    assert float(p.loss.pg_loss) == pg                              # ε does nothing on-policy (TRL too)
    assert [h["iteration"] for h in p.history][-3:] == [1, -1, -1]
