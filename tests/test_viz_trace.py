"""Every view over a REAL StepTrace (tiny model, one step), live and after save/load: the adapters' field
names must match the records the phases actually produce. Slow-ish (one tiny step), so marked slow."""
from __future__ import annotations

import warnings

import plotly.graph_objects as go
import pytest

pytest.importorskip("torch")
step = pytest.importorskip("rookworld_debug.grpo.step")

from rookworld_debug import viz  # noqa: E402
from tinymodels import use_spare_cores

METRICS = ["logp", "ref_logp", "ratio", "kl", "full_kl", "entropy", "pg", "loss", "delta_logp", "adv_x_logp"]


@pytest.fixture(scope="module")
def traces(fixtures_dir, tmp_path_factory):
    from rookworld_debug.config import StepConfig

    use_spare_cores()
    cfg = StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"), batch_size=2,
                               num_generations=2, max_new_tokens=24, eval_max_new_tokens=16, heldout_n=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the random-init tiny model warns that completions are noise
        live = step.run_step(cfg)
    path = live.save(tmp_path_factory.mktemp("trace"))
    return {"live": live, "loaded": step.StepTrace.load(path)}


def render_all(trace) -> list:
    out = [viz.banner_from_trace(trace), viz.invariants_table_from_trace(trace), viz.provenance_table_from_trace(trace),
           viz.advantage_table_from_trace(trace), viz.reward_components_table_from_trace(trace),
           viz.before_after_table_from_trace(trace), viz.board_from_trace(trace, 0),
           viz.completion_metrics_from_trace(trace, 0)]
    out += [viz.token_strips_from_trace(trace, m) for m in METRICS]
    out += [viz.reward_breakdown_from_trace(trace), viz.loss_waterfall_from_trace(trace),
            viz.token_heatmap_from_trace(trace, "kl"), viz.token_heatmap_from_trace(trace, "ratio"),
            viz.per_sequence_kl_from_trace(trace), viz.grad_norms_from_trace(trace),
            viz.before_after_figure_from_trace(trace), viz.delta_logp_scatter_from_trace(trace)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("which", ["live", "loaded"])
def test_every_view_renders_from_a_real_trace(traces, which):
    trace = traces[which]
    views = render_all(trace)
    for v in views:
        if isinstance(v, go.Figure):
            assert v.layout.title.text
        elif hasattr(v, "to_html"):
            assert "<table" in v.to_html()
        else:
            assert v._repr_html_()
    n_tokens = int(trace.rollout.completion_mask.sum())     # strips show every completion token incl. EOS
    strip = viz.token_strips_from_trace(trace, "logp")
    assert strip.n_tokens >= n_tokens
    assert strip.n_rows == len(trace.rollout.completions)


@pytest.mark.slow
def test_loaded_trace_renders_the_same_strips(traces):
    for m in ("logp", "kl", "ratio"):
        assert viz.token_strips_from_trace(traces["live"], m).html == viz.token_strips_from_trace(traces["loaded"], m).html
