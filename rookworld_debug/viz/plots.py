"""plotly figures for one GRPO step: reward breakdown, loss waterfall, KL/ratio per token and per
sequence, grad norms per layer × loss term, before/after rewards, Δlogp vs advantage.

All functions return a static `go.Figure` (never FigureWidget: it breaks across ipywidgets 8 /
plotly 6, and widgets re-draw figures into an Output instead). Every title carries the metric's
definition as a subtitle and every axis its unit. Values are taken from the records; the only
arithmetic here is display transforms (log of a ratio for colour, a Pearson r when the record has none).

Call `setup_notebook_rendering()` once per notebook so exported HTML embeds plotly.js (offline).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from ._style import FONT_SANS, fmt, fmt_signed, plotly_diverging, plotly_sequential, to_numpy
from .tokens import METRICS, Metric

__all__ = ["setup_notebook_rendering", "reward_breakdown_figure", "loss_waterfall", "token_heatmap",
           "per_sequence_bar", "grad_norm_figure", "before_after_figure", "delta_logp_scatter",
           "steps_figure", "TERM_COLORS"]

# Okabe–Ito: distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000"]
TERM_COLORS = {"pg": "#0072B2", "kl": "#D55E00", "entropy": "#009E73", "total": "#555555"}
TERM_NAMES = {"pg": "PG", "kl": "KL (β·KL)", "entropy": "entropy", "total": "total"}


def setup_notebook_rendering(renderer: str = "plotly_mimetype+notebook") -> None:
    """Pin plotly's renderer so figures also live in exported HTML, offline.

    The default mimetype-only renderer leaves exported HTML blank (plotly/plotly.py#4953);
    "+notebook" adds an HTML output that embeds plotly.js once per notebook (no CDN).
    """
    pio.renderers.default = renderer   # returns None so a notebook cell shows no stray Out[]


def _wrap(text: str, width: int = 130) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width=width, break_long_words=False) or [""]


def _title(title: str, definition: str = "") -> tuple[dict, int]:
    """Bold title + the definition as a wrapped subtitle; returns (title dict, number of lines)."""
    lines = _wrap(definition) if definition else []
    text = f"<b>{title}</b>" + "".join(f"<br><sup>{ln}</sup>" for ln in lines)
    return {"text": text, "x": 0.0, "xanchor": "left", "font": {"size": 15}}, 1 + len(lines)


def _layout(fig: go.Figure, title: str, definition: str = "", *, height: int = 380, **kw: Any) -> go.Figure:
    title_dict, n_lines = _title(title, definition)
    top = 50 + 16 * n_lines
    fig.update_layout(template="plotly_white", title=title_dict, height=height + top - 90,
                      font={"family": FONT_SANS, "size": 12}, margin={"l": 70, "r": 30, "t": top, "b": 60},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
                      **kw)
    return fig


def _arr(x: Any, name: str, n: int | None = None) -> np.ndarray:
    a = to_numpy(x, dtype=float)
    if n is not None and a.ravel().shape[0] != n:
        raise ValueError(f"{name} has {a.ravel().shape[0]} entries, expected {n}")
    return a


def _row_labels(n: int, num_generations: int | None, labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != n:
            raise ValueError(f"labels has {len(labels)} entries, expected {n}")
        return [str(x) for x in labels]
    if num_generations:
        return [f"p{i // num_generations}·g{i % num_generations}" for i in range(n)]
    return [f"#{i}" for i in range(n)]


def _group_shading(fig: go.Figure, n: int, num_generations: int | None) -> None:
    """Alternate light bands per prompt group so G rows read as one block."""
    if not num_generations or num_generations >= n:
        return
    for b in range(0, n // num_generations, 2):
        fig.add_vrect(x0=b * num_generations - 0.5, x1=(b + 1) * num_generations - 0.5,
                      fillcolor="#000000", opacity=0.04, line_width=0, layer="below")


# ----------------------------------------------------------------------------------------- rewards
def reward_breakdown_figure(contributions: Mapping[str, Any], totals: Any, *, labels: Sequence[str] | None = None,
                            num_generations: int | None = None, definition: str | None = None,
                            batch_label: str = "rollout batch of this step") -> go.Figure:
    """Stacked bar per completion: each reward component's contribution, with the recorded total as a
    diamond. contributions: {component: (N,)} (e.g. w_k·c_k from RewardBreakdown); negatives stack
    below zero. If the diamond is off the stack top, the reward function did more than sum (clamp,
    shaping) — visible, not hidden."""
    tot = _arr(totals, "totals").ravel()
    n = tot.shape[0]
    x = _row_labels(n, num_generations, labels)
    fig = go.Figure()
    for k, (name, vals) in enumerate(contributions.items()):
        v = _arr(vals, f"contributions[{name!r}]", n).ravel()
        fig.add_bar(x=x, y=v, name=str(name), marker_color=OKABE_ITO[k % len(OKABE_ITO)],
                    hovertemplate=f"{name}: %{{y:.4g}}<extra>%{{x}}</extra>")
    fig.add_scatter(x=x, y=tot, mode="markers", name="total reward", marker={"symbol": "diamond", "size": 11,
                    "color": "#000000", "line": {"color": "#ffffff", "width": 1}},
                    hovertemplate="total: %{y:.6g}<extra>%{x}</extra>")
    _group_shading(fig, n, num_generations)
    definition = definition or ("bars: per-component contribution as recorded (w_k·c_k); ◆ total = "
                                f"RewardBreakdown.total; {batch_label}")
    _layout(fig, "Reward breakdown per completion", definition, barmode="relative",
            xaxis_title="completion (prompt p, generation g)", yaxis_title="reward contribution")
    fig.add_hline(y=0, line_color="#999", line_width=1)
    return fig


# ----------------------------------------------------------------------------------------- loss
def loss_waterfall(pg_loss: float, kl_loss: float, entropy_loss: float, total: float, *, kl_share: float | None,
                   normalizer: str = "", kl_share_definition: str = "kl_share as recorded by LossBreakdown",
                   beta: float | None = None, batch_label: str = "rollout batch of this step",
                   headline: str | None = None) -> go.Figure:
    """Waterfall PG → +β·KL → +entropy term → total (the recorded total, drawn as an absolute bar).

    If the recorded total differs from the sum of the three bars, the title says so (a decomposition
    bug must be visible). `headline` (e.g. `metrics.term_balance(...).headline`) replaces the KL-share
    title: on-policy the loss-value share is not meaningful. Tiny totals are drawn in a power-of-ten
    unit (no SI "p"/"n" ticks), with headroom so bar labels never reach the title."""
    pg, kl, ent, tot = (float(to_numpy(v).reshape(())) for v in (pg_loss, kl_loss, entropy_loss, total))
    beta_txt = f"β={fmt(beta)}·" if beta is not None else "β·"
    names = ["PG term", f"{beta_txt}KL term", "entropy term (−c·H)", "total loss"]
    fig = go.Figure(go.Waterfall(
        x=names, y=[pg, kl, ent, tot], measure=["relative", "relative", "relative", "absolute"],
        text=[fmt_signed(pg), fmt_signed(kl), fmt_signed(ent), fmt(tot)], textposition="outside",
        increasing={"marker": {"color": TERM_COLORS["kl"]}}, decreasing={"marker": {"color": TERM_COLORS["pg"]}},
        totals={"marker": {"color": TERM_COLORS["total"]}}, connector={"line": {"color": "#999", "width": 1}},
        hovertemplate="%{x}: %{y:.6g}<extra></extra>"))
    scale_exp = _unit_exponent(pg, kl, ent, tot)
    if scale_exp:
        k = 10.0 ** -scale_exp
        fig.data[0].y = [pg * k, kl * k, ent * k, tot * k]
    cum = np.cumsum([pg, kl, ent]) * 10.0 ** -scale_exp
    lo, hi = min(0.0, float(cum.min()), tot * 10.0 ** -scale_exp), max(0.0, float(cum.max()), tot * 10.0 ** -scale_exp)
    pad = 0.3 * (hi - lo) or 1.0
    fig.update_yaxes(range=[lo - (pad if lo < 0 else 0.05 * pad), hi + pad], exponentformat="power",
                     tickformat=".3~g")
    if headline:
        title = "Loss decomposition (value)"
    else:
        share = "n/a" if kl_share is None or not math.isfinite(kl_share) else f"{100 * kl_share:.1f}%"
        title = f"Loss decomposition — KL value share {share}"
    gap = tot - (pg + kl + ent)
    if math.isfinite(gap) and abs(gap) > 1e-6 * max(1.0, abs(tot)):
        title += f" — ⚠ recorded total ≠ sum of terms (gap {fmt_signed(gap)})"
    definition = (f"{headline + ' ' if headline else ''}{kl_share_definition}; aggregation: "
                  f"{normalizer or 'as recorded'}; blue = lowers the loss, orange = raises it; {batch_label}")
    unit = f" (×1e{scale_exp})" if scale_exp else ""
    _layout(fig, title, definition, yaxis_title=f"loss contribution{unit}", showlegend=False)
    fig.add_hline(y=0, line_color="#999", line_width=1)
    return fig


def _unit_exponent(*values: float) -> int:
    """Power of ten (a multiple of 3) to divide tiny/huge values by for display; 0 when not needed."""
    m = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    if m == 0 or 1e-3 <= m < 1e5:
        return 0
    return int(3 * math.floor(math.log10(m) / 3))


def _metric(metric: str | Metric) -> Metric:
    return metric if isinstance(metric, Metric) else METRICS.get(metric) or Metric(str(metric), str(metric),
                                                                                 str(metric), "signed")


def token_heatmap(values: Any, mask: Any = None, *, metric: str | Metric = "kl", tokens: Sequence[Sequence[str]] | None = None,
                  row_labels: Sequence[str] | None = None, num_generations: int | None = None,
                  zmax: float | None = None, batch_label: str = "rollout batch of this step") -> go.Figure:
    """N×T heatmap of a per-token metric; masked positions are blank (NaN), not zero.

    metric "ratio" is drawn as log r (diverging, 0 = ratio 1); signed metrics diverge around 0;
    KL/entropy/logp are sequential. Hover shows the token and the exact (untransformed) value."""
    m = _metric(metric)
    v = _arr(values, "values")
    if v.ndim != 2:
        raise ValueError(f"values must be (N, T), got shape {v.shape}")
    n, t = v.shape
    keep = np.ones_like(v, dtype=bool) if mask is None else to_numpy(mask, dtype=bool)
    if keep.shape != v.shape:
        raise ValueError(f"mask shape {keep.shape} != values shape {v.shape}")
    z = np.where(keep, v, np.nan)
    color_title = m.name
    if m.scale == "ratio":
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(z > 0, np.log(z), np.nan)
        color_title = "log ratio"
    finite = z[np.isfinite(z)]
    text = None
    if tokens is not None:
        from .tokens import token_text     # the one token renderer (by bytes), as in the strips
        text = [[token_text(tokens[i][j]).label if j < len(tokens[i]) else ""
                 for j in range(t)] for i in range(n)]
    kw: dict[str, Any] = {}
    if m.scale in ("signed", "ratio"):
        half = zmax if zmax is not None else (float(np.max(np.abs(finite))) if finite.size else 1.0)
        half = half or 1.0
        kw = {"colorscale": plotly_diverging(), "zmid": 0.0, "zmin": -half, "zmax": half}
    else:
        # Both ends explicit: plotly's autoscale of an all-zero KL map puts 0 mid-scale (purple),
        # but the neutral end must stay white whatever the data.
        reverse = m.neutral == "high"
        from .tokens import make_scale      # the strips' range (anchor, clamps, robust percentiles)
        sc = make_scale(m, finite, None, None if reverse else zmax)
        lo, hi = sc.lo, sc.hi
        if reverse:
            lo = lo if lo < hi else hi - 1.0
        else:
            hi = hi if hi > lo else lo + 1.0
        kw = {"colorscale": plotly_sequential(reverse=reverse), "zmin": lo, "zmax": hi}
    fig = go.Figure(go.Heatmap(
        z=z, customdata=np.where(keep, v, np.nan), text=text,
        x=list(range(t)), y=_row_labels(n, num_generations, row_labels), xgap=1, ygap=1,
        colorbar={"title": {"text": color_title}},
        hovertemplate=("%{y} t=%{x}" + (" %{text}" if text is not None else "") +
                       f"<br>{m.name} = %{{customdata:.6g}}<extra></extra>"), **kw))
    fig.update_yaxes(autorange="reversed")
    _layout(fig, f"{m.name} per token", f"{m.definition} Blank = masked (not in loss). {batch_label}",
            height=max(300, 90 + 22 * n), xaxis_title="completion token position t", yaxis_title="completion")
    return fig


def per_sequence_bar(values: Any, *, metric: str, definition: str, labels: Sequence[str] | None = None,
                     num_generations: int | None = None, unit: str = "",
                     batch_label: str = "rollout batch of this step") -> go.Figure:
    """One bar per completion (e.g. LossBreakdown.per_seq_kl), coloured by prompt group."""
    v = _arr(values, "values").ravel()
    n = v.shape[0]
    x = _row_labels(n, num_generations, labels)
    colors = [OKABE_ITO[(i // num_generations) % len(OKABE_ITO)] if num_generations else OKABE_ITO[0]
              for i in range(n)]
    fig = go.Figure(go.Bar(x=x, y=v, marker_color=colors, hovertemplate=f"{metric} = %{{y:.6g}}<extra>%{{x}}</extra>"))
    _group_shading(fig, n, num_generations)
    _layout(fig, f"{metric} per sequence", f"{definition}; {batch_label}", showlegend=False,
            xaxis_title="completion (colour = prompt group)", yaxis_title=f"{metric}{' [' + unit + ']' if unit else ''}")
    fig.add_hline(y=0, line_color="#999", line_width=1)
    return fig


# ----------------------------------------------------------------------------------------- update
def grad_norm_figure(per_layer: Mapping[str, Mapping[str, float]], *, terms: Sequence[str] = ("pg", "kl", "entropy"),
                     global_pre: float | None = None, global_post: float | None = None,
                     max_grad_norm: float | None = None, log_y: bool = False,
                     batch_label: str = "rollout batch of this step") -> go.Figure:
    """Grouped bars: per layer, the L2 norm of each loss term's gradient (UpdateResult.per_layer:
    {layer: {"pg": n, "kl": n, "entropy": n, "total": n}}). Terms absent from every layer are skipped."""
    layers = list(per_layer)
    fig = go.Figure()
    for term in terms:
        ys = [per_layer[layer].get(term) for layer in layers]
        if all(y is None for y in ys):
            continue
        fig.add_bar(x=layers, y=[math.nan if y is None else float(y) for y in ys], name=TERM_NAMES.get(term, term),
                    marker_color=TERM_COLORS.get(term, "#777"),
                    hovertemplate=f"{TERM_NAMES.get(term, term)}: %{{y:.4g}}<extra>%{{x}}</extra>")
    if any("total" in per_layer[layer] for layer in layers) and "total" not in terms:
        fig.add_scatter(x=layers, y=[per_layer[layer].get("total", math.nan) for layer in layers], mode="markers",
                        name="total", marker={"symbol": "line-ew-open", "size": 18, "color": "#000",
                                              "line": {"width": 2}},
                        hovertemplate="total: %{y:.4g}<extra>%{x}</extra>")
    bits = []
    if global_pre is not None:
        bits.append(f"global ‖g‖ before clip = {fmt(global_pre)}")
    if global_post is not None:
        bits.append(f"after clip = {fmt(global_post)}")
    if max_grad_norm is not None:
        bits.append(f"max_grad_norm = {fmt(max_grad_norm)}")
    title = "Gradient norm per layer, split by loss term" + (" — " + ", ".join(bits) if bits else "")
    definition = ("L2 norm of ∂(term)/∂θ over the layer's parameters, each term from its own backward, "
                  f"before clipping; terms add as vectors, not norms; {batch_label}")
    _layout(fig, title, definition, barmode="group", xaxis_title="layer", yaxis_title="‖∇θ term‖₂ (pre-clip)",
            yaxis_type="log" if log_y else "linear")
    return fig


# ----------------------------------------------------------------------------------------- evaluation
def before_after_figure(prompt_labels: Sequence[str], before: Any, after: Any, *, metric: str = "reward",
                        label: str = "greedy decode of the same B prompts, before vs after the update") -> go.Figure:
    """Grouped bars per prompt: metric before vs after the update, same batch."""
    n = len(prompt_labels)
    b, a = _arr(before, "before", n).ravel(), _arr(after, "after", n).ravel()
    x = [str(p) for p in prompt_labels]
    fig = go.Figure()
    fig.add_bar(x=x, y=b, name="before", marker_color="#999999", hovertemplate="before: %{y:.6g}<extra>%{x}</extra>")
    fig.add_bar(x=x, y=a, name="after", marker_color="#0072B2", hovertemplate="after: %{y:.6g}<extra>%{x}</extra>")
    _layout(fig, f"{metric} per prompt, before vs after the update", f"{label}; same batch, same scoring",
            barmode="group", xaxis_title="prompt", yaxis_title=metric)
    fig.add_hline(y=0, line_color="#999", line_width=1)
    return fig


def delta_logp_scatter(advantages: Any, delta_logp: Any, mask: Any = None, *, correlation: float | None = None,
                       correlation_label: str | None = None, labels: Sequence[str] | None = None,
                       num_generations: int | None = None,
                       batch_label: str = "same sampled completions, after one update") -> go.Figure:
    """Δlogp (after − before) of each sampled token vs its completion's advantage.

    delta_logp: (N, T) per token (with mask) or (N,) per sequence. A working update pushes points into
    the (+, +) and (−, −) quadrants. `correlation` from the Evaluation record is shown as is; without
    one, a Pearson r over the plotted points is computed for display and labelled so."""
    adv = _arr(advantages, "advantages").ravel()
    d = _arr(delta_logp, "delta_logp")
    n = adv.shape[0]
    row_names = _row_labels(n, num_generations, labels)
    if d.ndim == 2:
        if d.shape[0] != n:
            raise ValueError(f"delta_logp has {d.shape[0]} rows, advantages {n}")
        keep = np.ones_like(d, dtype=bool) if mask is None else to_numpy(mask, dtype=bool)
        rows, cols = np.nonzero(keep & np.isfinite(d))
        x, y = adv[rows], d[rows, cols]
        hover = [f"{row_names[i]} t={j}" for i, j in zip(rows, cols)]
        unit = "per token"
    else:
        d = d.ravel()
        if d.shape[0] != n:
            raise ValueError(f"delta_logp has {d.shape[0]} entries, advantages {n}")
        ok = np.isfinite(d)
        x, y, hover = adv[ok], d[ok], [r for r, k in zip(row_names, ok) if k]
        unit = "per sequence"
    rng = np.random.default_rng(0)   # fixed jitter: tokens of one completion share x, spread them a little
    span = float(np.ptp(adv)) if adv.size else 0.0
    jitter = rng.uniform(-1, 1, size=x.shape) * 0.01 * (span or 1.0) if d.ndim == 2 else np.zeros_like(x)
    if correlation is None and x.size >= 2 and np.std(x) > 0 and np.std(y) > 0:
        correlation = float(np.corrcoef(x, y)[0, 1])
        correlation_label = correlation_label or f"Pearson r over the {x.size} plotted points (computed for display)"
    corr_txt = "n/a (constant or < 2 points)" if correlation is None else f"{correlation:+.3f}"
    fig = go.Figure(go.Scatter(x=x + jitter, y=y, mode="markers", text=hover,
                               customdata=x, marker={"size": 6, "opacity": 0.6, "color": "#0072B2"},
                               hovertemplate="%{text}<br>A = %{customdata:.4g}<br>Δlogp = %{y:.6g}<extra></extra>"))
    fig.add_hline(y=0, line_color="#999", line_width=1)
    fig.add_vline(x=0, line_color="#999", line_width=1)
    definition = (f"Δlogp = logp_after − logp_before of the sampled token ({unit}), logits / T; "
                  f"A = advantage of its completion; r: {correlation_label or 'as recorded by the evaluation'}; "
                  f"{batch_label}")
    _layout(fig, f"Δlogp vs advantage — r = {corr_txt}", definition, showlegend=False,
            xaxis_title="advantage A (small horizontal jitter)", yaxis_title="Δlogp [nats]")
    return fig


def steps_figure(steps: Sequence[int], series: Mapping[str, Sequence[float]], *, title: str, definition: str,
                 yaxis_title: str = "") -> go.Figure:
    """Line per metric across optimizer steps (e.g. kl, kl_share, clip_ratio) for multi-step runs."""
    fig = go.Figure()
    for k, (name, ys) in enumerate(series.items()):
        fig.add_scatter(x=list(steps), y=_arr(ys, name, len(steps)).ravel(), mode="lines+markers", name=name,
                        line={"color": OKABE_ITO[k % len(OKABE_ITO)]})
    return _layout(fig, title, definition, xaxis_title="optimizer step", yaxis_title=yaxis_title)
