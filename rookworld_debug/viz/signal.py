"""Signal or noise (issue 28): the view of `StepTrace.diagnostics` (grpo.diagnostics.SignalNoise).

Every number says its estimator and its batch (definitions: `metrics.GLOSSARY` snr, b_simple, delta_reward_ci,
group_cos_step). Nothing is recomputed here.
"""
from __future__ import annotations

import html
import math
from typing import Any

from ._style import fmt
from .htmlview import HTMLView

__all__ = ["signal_noise_from_trace", "group_cosine_figure_from_trace"]


def _interval(ci) -> str:
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "n/a"
    verdict = "within noise (covers 0)" if lo <= 0 <= hi else ("a real gain" if lo > 0 else "a real loss")
    return f"[{fmt(lo)}, {fmt(hi)}]: {verdict}"


def signal_noise_from_trace(trace: Any) -> HTMLView:
    """The signal-or-noise table, or a note saying how to turn it on."""
    from rookworld_debug.metrics import definition
    d = getattr(trace, "diagnostics", None)
    if d is None:
        return HTMLView("<p><i>Signal or noise: not computed for this step (StepConfig(diagnostics=True) turns it "
                        "on; a TRL capture has no live model to take per-group gradients).</i></p>")
    n = d.noise
    lo, hi = n.snr_ci
    rows = [
        ("SNR across groups", fmt(n.snr), f"{int(round(100 * n.ci_level))} % bootstrap over groups: "
         f"[{fmt(lo)}, {fmt(hi)}]", "snr"),
        ("B_simple (groups for SNR = 1)", fmt(n.b_simple), f"this step has B = {n.num_groups}; at B = "
         f"{fmt(n.groups_for_snr_1)} groups the signal would equal the noise", "b_simple"),
        ("|G|²_est (true-gradient power)", fmt(n.grad_sq), f"|ḡ|² = {fmt(n.mean_grad_sq)}, tr Σ̂ = {fmt(n.trace_sigma)}",
         "snr"),
        ("greedy Δreward, this batch", _interval(d.delta_reward_ci), f"paired bootstrap, {d.n_boot} resamples",
         "delta_reward_ci"),
        ("greedy Δreward, held-out", _interval(d.delta_reward_heldout_ci), f"paired bootstrap, {d.n_boot} resamples",
         "delta_reward_ci"),
    ]
    body = "".join(f'<tr title="{html.escape(definition(k), quote=True)}"><th style="text-align:left">{html.escape(a)}'
                   f"</th><td><b>{html.escape(b)}</b></td><td>{html.escape(c)}</td></tr>" for a, b, c, k in rows)
    groups = "".join(f"<tr><td>{i}</td><td>{fmt(float(nm))}</td><td>{fmt(float(cs))}</td><td>{fmt(float(w))}</td></tr>"
                     for i, (nm, cs, w) in enumerate(zip(d.group_grad_norms, d.group_cos_step, d.group_weights)))
    trust = "" if n.trustworthy else (f'<p style="color:#9a6700"><b>Cannot be trusted as a point value:</b> '
                                      f"{html.escape(n.note)}.</p>")
    return HTMLView(
        '<div class="rw-signal"><table class="rw-table"><caption style="text-align:left">Batch: the sampled rollout '
        "at the step's start (the first optimizer step's gradient), split by group; Δreward: greedy, same prompts, "
        f"after − before</caption>{body}</table>{trust}"
        '<table class="rw-table"><caption style="text-align:left">Per group b: ‖g_b‖ (its gradient), cos(g_b, step '
        "gradient), and its share of Σ|row loss terms| (the loss type's std/length normalization included)"
        "</caption><tr><th>group</th><th>‖g_b‖</th><th>cos with step</th><th>weight</th></tr>"
        f"{groups}</table><p style='font-size:.85em'>computed in {fmt(d.seconds)} s (one backward per group)</p></div>")


def group_cosine_figure_from_trace(trace: Any):
    """B×B heatmap of cos(g_a, g_b), or None without diagnostics."""
    d = getattr(trace, "diagnostics", None)
    if d is None:
        return None
    import plotly.graph_objects as go
    c = d.group_cos.tolist()
    fig = go.Figure(go.Heatmap(z=c, zmin=-1, zmax=1, colorscale="RdBu", text=[[fmt(x) for x in r] for r in c],
                               texttemplate="%{text}", hovertemplate="cos(g_%{y}, g_%{x}) = %{z:.3f}<extra></extra>"))
    fig.update_layout(height=300, width=360, margin=dict(l=40, r=10, t=50, b=40),
                      title="cos(g_a, g_b) between group gradients<br><sub>sampled rollout, step start</sub>",
                      xaxis=dict(title="group b", dtick=1), yaxis=dict(title="group a", dtick=1, autorange="reversed"))
    return fig
