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
    from rookworld_debug.grpo.multistep.start import setup
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
    panel.w_beta.value = 0.0
    assert float(panel.loss.kl_loss) == 0.0 and panel.loss.kl_share == 0.0


def test_recompute_is_well_under_a_second(panel):
    panel.w_eps_high.value = 0.28
    assert panel.config.epsilon_high == pytest.approx(0.28)
    assert panel.last_loss_for_s < 0.1
    assert panel.last_recompute_s < 1.0
    assert "recomputed in" in panel.w_summary.value


def test_loss_type_and_estimator_knobs(panel):
    from rookworld_debug.grpo.families import advantages_from_config
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
    assert fig.data[0].type == "waterfall"
    unit = re.search(r"×1e(-?\d+)", fig.layout.yaxis.title.text or "")     # tiny totals: a power-of-ten unit
    scale = 10.0 ** int(unit.group(1)) if unit else 1.0
    assert fig.data[0].y[-1] * scale == pytest.approx(float(panel.loss.loss), rel=1e-9, abs=1e-15)


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


def test_kl_share_never_100_percent_on_policy(panel):
    """The panel's rollout is sampled from the current policy (ratio ≡ 1): the PG loss VALUE is −agg(A),
    structurally ~0, so |β·KL|/(|PG|+|β·KL|) would read ~100%. The panel must say n/a instead, for any loss type."""
    panel.w_beta.value = 0.1
    for lt in ("grpo", "dapo", "dr_grpo"):
        panel.w_loss_type.value = lt
        assert panel.loss.kl > 0 and float(panel.loss.loss) != 0.0             # β·KL does enter the loss
        assert math.isnan(_summary_number(panel, "kl-share")) and 'data-on-policy="1"' in panel.w_summary.value
        assert "KL value share n/a (on-policy)" in panel.w_summary.value
        assert "batch: the sampled rollout of this batch" in panel.w_summary.value     # every number's batch
        cell = re.search(r"KL value share</th><td[^>]*>([^<]*)</td>", panel.w_summary.value).group(1)
        assert cell == "n/a (on-policy)" and "100" not in cell
        assert math.isnan(panel.history[-1]["kl_value_share"])
    panel.w_loss_type.value = "dapo"


def test_panel_shows_g_rows_after_regenerate(panel):
    """After Regenerate the completions table shows the WHOLE new rollout: G rows per group, named p<b>·g<j>,
    with reward, advantage and the zero-σ groups named in the batch label."""
    panel.regenerate(num_generations=3, temperature=0.7)   # its own settings, whatever ran before
    n = len(panel.state.rollout.completions)
    assert n == 2 * 3
    table = panel.w_table.value
    body = table.split("<tbody>")[1]
    assert body.count("<tr>") == n
    names = re.findall(r'<td data-v="\d+">(p\d·g\d)</td>', body)
    assert names == [f"p{b}·g{j}" for b in range(2) for j in range(3)]
    shown_adv = [float(x) for x in re.findall(r'<td data-v="([-+0-9.e]+)"[^>]*>[+-]\d\.\d{3}</td>', body)]
    assert shown_adv == pytest.approx(panel.state.advantages.advantages.tolist(), abs=1e-6)
    zero = ", ".join(f"p{b}" for b in panel.state.advantages.zero_std_groups) or "none"
    assert f"zero-σ groups (advantage 0, no PG signal): {zero}" in table and "T=0.7" in table
    assert "reward" in table.split("<tbody>")[0]
    html_before = panel.w_table.value
    panel.w_beta.value = 0.05 if panel.config.beta != 0.05 else 0.1         # a loss knob: same rollout, same rows
    assert panel.w_table.value.split("<tbody>")[1].count("<tr>") == n
    assert panel.w_table.value == html_before or "p1·g2" in panel.w_table.value
