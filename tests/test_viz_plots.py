"""plotly figures: static go.Figure, definitions in titles/axes, masked → blank, offline renderer."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from rookworld_debug.viz import plots


def title_text(fig: go.Figure) -> str:
    return fig.layout.title.text


def test_setup_notebook_rendering_embeds_plotlyjs():
    old = pio.renderers.default
    try:
        assert plots.setup_notebook_rendering() is None
        assert pio.renderers.default == "plotly_mimetype+notebook"
    finally:
        pio.renderers.default = old


def test_reward_breakdown_stacks_components_and_marks_total():
    fig = plots.reward_breakdown_figure({"best_move": [0.5, 0.0, 0.2, 0.1], "format": [0.1, -0.3, 0.1, 0.1]},
                                        [0.6, -0.3, 0.3, 0.2], num_generations=2)
    assert type(fig) is go.Figure
    assert fig.layout.barmode == "relative"
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == ["best_move", "format"]
    total = [t for t in fig.data if t.type == "scatter"][0]
    assert list(total.y) == [0.6, -0.3, 0.3, 0.2] and list(total.x) == ["p0·g0", "p0·g1", "p1·g0", "p1·g1"]
    assert "RewardBreakdown.total" in title_text(fig)


def test_loss_waterfall_uses_recorded_total_and_shows_kl_share():
    fig = plots.loss_waterfall(-0.02, 0.004, -0.001, -0.017, kl_share=0.16, normalizer="grpo: per-seq mean", beta=0.1)
    wf = fig.data[0]
    assert wf.type == "waterfall" and list(wf.measure) == ["relative", "relative", "relative", "absolute"]
    assert list(wf.y) == [-0.02, 0.004, -0.001, -0.017]
    assert "KL value share 16.0%" in title_text(fig) and "grpo: per-seq mean" in title_text(fig)
    assert "β=0.1·KL term" in list(wf.x)
    assert "≠" not in title_text(fig)


def test_loss_waterfall_flags_inconsistent_total():
    fig = plots.loss_waterfall(-0.02, 0.004, 0.0, 0.5, kl_share=float("nan"))
    assert "recorded total ≠ sum of terms" in title_text(fig) and "KL value share n/a" in title_text(fig)


def test_token_heatmap_masked_is_blank_and_signed_centres():
    v = np.array([[0.0, 0.5, 9.0], [0.2, 0.0, 0.0]])
    m = np.array([[1, 1, 0], [1, 1, 1]])
    fig = plots.token_heatmap(v, m, metric="kl", tokens=[[" a", "b", "c"], ["d", "e", "f"]])
    z = np.array(fig.data[0].z, dtype=float)
    assert math.isnan(z[0, 2]) and z[0, 1] == 0.5
    assert fig.data[0].zmin == 0.0                       # KL anchored at 0 = white
    assert "exp(ref − logp)" in title_text(fig) and "Blank = masked" in title_text(fig)
    assert fig.data[0].text[0][0] == "␣a"

    ratio = plots.token_heatmap(np.array([[1.0, 2.0], [0.5, 1.0]]), None, metric="ratio")
    z = np.array(ratio.data[0].z, dtype=float)
    assert z[0, 0] == 0.0 and math.isclose(z[0, 1], math.log(2)) and ratio.data[0].zmid == 0.0
    assert ratio.data[0].colorbar.title.text == "log ratio"
    assert list(ratio.data[0].customdata[0]) == [1.0, 2.0]   # hover shows the ratio itself


def test_token_heatmap_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        plots.token_heatmap(np.zeros(3))
    with pytest.raises(ValueError, match="mask shape"):
        plots.token_heatmap(np.zeros((2, 3)), np.ones((2, 2)))


def test_per_sequence_bar_colours_groups():
    fig = plots.per_sequence_bar([0.1, 0.2, 0.3, 0.4], metric="per-seq KL", definition="masked mean k3",
                                 num_generations=2, unit="nats/token")
    colors = list(fig.data[0].marker.color)
    assert colors[0] == colors[1] != colors[2] == colors[3]
    assert "masked mean k3" in title_text(fig) and "nats/token" in fig.layout.yaxis.title.text


def test_grad_norm_grouped_bars_by_term():
    per_layer = {"wte": {"pg": 1.0, "kl": 0.1, "entropy": 0.0, "total": 1.05},
                 "h.0": {"pg": 0.5, "kl": 0.2, "entropy": 0.0, "total": 0.6}}
    fig = plots.grad_norm_figure(per_layer, global_pre=2.0, global_post=1.0, max_grad_norm=1.0)
    assert fig.layout.barmode == "group"
    assert [t.name for t in fig.data if t.type == "bar"] == ["PG", "KL (β·KL)", "entropy"]
    assert list(fig.data[0].x) == ["wte", "h.0"]
    assert "before clip = 2" in title_text(fig) and "after clip = 1" in title_text(fig)
    assert any(t.name == "total" for t in fig.data)


def test_before_after_figure_same_batch_label():
    fig = plots.before_after_figure(["p0", "p1"], [0.1, 0.2], [0.3, 0.1])
    assert [t.name for t in fig.data] == ["before", "after"] and "same batch" in title_text(fig)


def test_delta_logp_scatter_per_token_with_recorded_or_display_correlation():
    adv = np.array([1.0, -1.0, 0.5, -0.5])
    d = np.array([[0.1, 0.2, 0.0], [-0.1, -0.2, 0.0], [0.05, 0.0, 0.0], [-0.05, 9.0, 0.0]])
    m = np.array([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0]])
    fig = plots.delta_logp_scatter(adv, d, m, correlation=0.9, correlation_label="Evaluation.corr")
    assert len(fig.data[0].y) == 6 and 9.0 not in list(fig.data[0].y)   # masked tokens dropped
    assert "r = +0.900" in title_text(fig) and "Evaluation.corr" in title_text(fig)
    fig2 = plots.delta_logp_scatter(adv, d, m)
    assert "computed for display" in title_text(fig2)
    fig3 = plots.delta_logp_scatter(adv, [0.1, -0.1, 0.0, 0.0])
    assert len(fig3.data[0].y) == 4
    fig4 = plots.delta_logp_scatter([0.0, 0.0], [0.1, 0.2])
    assert "n/a" in title_text(fig4)


def test_figures_export_offline_html():
    fig = plots.loss_waterfall(-0.02, 0.004, -0.001, -0.017, kl_share=0.16)
    html = fig.to_html(include_plotlyjs=True, full_html=True)
    assert "cdn.plot.ly" not in html.split("<body>")[1][:2000] and "Plotly.newPlot" in html


def test_steps_figure():
    fig = plots.steps_figure([0, 1, 2], {"kl": [0.0, 0.01, 0.02]}, title="KL over steps", definition="mean k3")
    assert list(fig.data[0].y) == [0.0, 0.01, 0.02] and "mean k3" in title_text(fig)


def test_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    fig = plots.token_heatmap(torch.zeros(2, 3, dtype=torch.bfloat16), torch.ones(2, 3, dtype=torch.long), metric="kl")
    assert np.array(fig.data[0].z).shape == (2, 3)
    fig = plots.loss_waterfall(torch.tensor(-0.02, requires_grad=True), torch.tensor(0.0), torch.tensor(0.0),
                               torch.tensor(-0.02), kl_share=0.0)
    assert fig.data[0].y[0] == pytest.approx(-0.02)


def test_all_zero_kl_heatmap_stays_white():
    # step 0: KL is exactly 0 everywhere; 0 must map to the white end, not to mid-scale
    fig = plots.token_heatmap(np.zeros((2, 3)), np.ones((2, 3)), metric="kl")
    assert fig.data[0].zmin == 0.0 and fig.data[0].zmax > 0.0
    assert fig.data[0].colorscale[0][1] == "#ffffff"
    lp = plots.token_heatmap(np.array([[-30.0, -1.0]]), None, metric="logp")
    assert lp.data[0].zmax == 0.0 and lp.data[0].colorscale[-1][1] == "#ffffff"
    assert lp.data[0].zmin == pytest.approx(np.percentile([-30.0, -1.0], 1))     # same range as the strips
