"""TunePanel outside a kernel: the controls call the same pure functions (loss_for, advantages_from_config,
sample_and_score) and the views follow; a loss-knob recompute takes well under a second."""
from __future__ import annotations

import math
import re
import warnings

import pytest
import torch

pytest.importorskip("ipywidgets")


@pytest.fixture(scope="module")
def panel():
    from rookworld_debug import StepConfig
    from rookworld_debug.grpo.setup import setup
    from rookworld_debug.notebook import drift_policy
    from rookworld_debug.widgets import TunePanel
    torch.set_num_threads(1)
    cfg = StepConfig(max_new_tokens=56, heldout_n=0, engine_depth=6, batch_size=2, num_generations=4, beta=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = setup(cfg)
    drift = drift_policy(s, cfg, steps=0, noise=0.05, seed=1)      # π ≠ π_ref so that β matters
    assert drift["max_abs_param_change"] > 0
    p = TunePanel(s, cfg)
    yield p
    if s.engine is not None:
        s.engine.close()


def _summary_number(p, attr: str) -> float:
    return float(re.search(rf'data-{attr}="([^"]+)"', p.w_summary.value).group(1))


def test_beta_knob_is_loss_for_on_the_same_rollout(panel):
    from rookworld_debug.grpo.step import loss_for
    panel.w_beta.value = 0.1
    l1 = float(panel.loss.loss)
    panel.w_beta.value = 0.2
    l2 = float(panel.loss.loss)
    direct = loss_for(panel.state.rollout, panel.state.advantages, panel.config)
    assert panel.config.beta == 0.2 and float(direct.loss) == pytest.approx(l2, abs=1e-9)
    assert panel.loss.kl > 0 and l2 != l1
    assert _summary_number(panel, "loss") == pytest.approx(l2) and _summary_number(panel, "beta") == 0.2
    assert _summary_number(panel, "kl-share") == pytest.approx(panel.loss.kl_share)
    panel.w_beta.value = 0.0
    assert float(panel.loss.kl_loss) == 0.0 and panel.loss.kl_share == 0.0


def test_recompute_is_well_under_a_second(panel):
    panel.w_eps_high.value = 0.28
    assert panel.config.epsilon_high == pytest.approx(0.28)
    assert panel.last_loss_for_s < 0.1
    assert panel.last_recompute_s < 1.0
    assert "recomputed in" in panel.w_summary.value


def test_loss_type_and_estimator_knobs(panel):
    from rookworld_debug.grpo.advantages import advantages_from_config
    panel.w_loss_type.value = "manual"
    ref = advantages_from_config(panel.state.rewards.rewards, panel.config)
    assert panel.loss.loss_type == "manual"
    assert torch.equal(panel.state.advantages.advantages, ref.advantages)
    panel.w_kl.value = "k1"
    assert panel.loss.kl_estimator == "k1" and 'data-kl-estimator="k1"' in panel.w_summary.value
    panel.w_loss_type.value, panel.w_kl.value = "dapo", "k3"


def test_views_follow_metric_and_row(panel):
    panel.w_metric.value = "ratio"
    assert 'data-metric="ratio"' in panel.w_strip.value and "rw-strips" in panel.w_strip.value
    before = panel.w_strip.value
    panel.w_row.value = 3
    assert panel.w_strip.value != before and panel.w_strip.value.count('class="rw-row"') == 1
    fig = panel.w_fig                                   # a FigureWidget, updated in place
    assert fig.data[0].type == "waterfall" and "KL share" in fig.layout.title.text
    assert fig.data[0].y[-1] == pytest.approx(float(panel.loss.loss))


def test_bad_knobs_are_named_errors(panel):
    from rookworld_debug.errors import ConfigError
    with pytest.raises(ConfigError):
        panel.set_loss_params(temperature=0.5)
    with pytest.raises(ConfigError):
        panel.regenerate(beta=0.5)


def test_sampling_knobs_mark_stale_then_regenerate(panel):
    panel.w_temp.value = 0.7
    assert "press Regenerate" in panel.w_summary.value
    old = panel.state.rollout
    panel.regenerate(num_generations=2)
    assert panel.state.rollout is not old and len(panel.state.rollout.completions) == 4    # B=2 × G=2
    assert panel.config.num_generations == 2 and panel.config.p_temperature == 0.7
    assert panel.w_progress.value == panel.w_progress.max == 4
    assert set(panel.last_timings) == {"generation", "rewards", "advantages", "loss"}
    assert "press Regenerate" not in panel.w_summary.value and "regenerated" in panel.w_status.value
    assert panel.w_row.max == 3 and math.isfinite(float(panel.loss.loss))
