"""Views of the inner PPO iterations (trace.iterations) and of the loss-type comparison.

Every number is read from the records (IterationRecord, LossBreakdown, LossTypeRow); each table says
its batch: the SAMPLED rollout of this step, pass i = the i-th optimizer pass over it (μ = num_iterations),
with the ratio r = π_θ/π_old against the log-probs frozen at sampling.
"""
from __future__ import annotations

import html
import math
from dataclasses import replace
from typing import Any, Optional, Sequence

from .htmlview import HTMLView

_CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def _fmt(x: Any) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return html.escape(str(x))
    if math.isnan(x):
        return "—"
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.3e}"


def _table(title: str, header: Sequence[str], rows: list, note: str, css: str) -> HTMLView:
    th = "".join(f'<th style="padding:2px 8px;text-align:right;border-bottom:1px solid #999">{html.escape(h)}</th>'
                 for h in header)
    body = "".join("<tr>" + "".join(f'<td style="padding:2px 8px;text-align:right;font-family:monospace">{c}</td>'
                                    for c in r) + "</tr>" for r in rows)
    return HTMLView(f'<div class="{css}"><div style="font-weight:600">{html.escape(title)}</div>'
                    f'<table style="border-collapse:collapse;font-size:12px"><tr>{th}</tr>{body}</table>'
                    f'<div style="color:#555;font-size:11px;max-width:1100px">{note}</div></div>')


def iteration_table_from_trace(trace: Any) -> HTMLView:
    """One row per inner pass: loss terms, KL, ratio spread, clip fractions, grad norms, c_H."""
    its = tuple(getattr(trace, "iterations", ()) or ())
    if not its:
        return HTMLView('<div class="rwd-iterations">no inner iterations recorded (the update was refused or '
                        'this trace predates them)</div>')
    header = ["pass", "optimizer steps", "loss", "PG term", "β·KL term", "entropy term", "kl", "ratio min",
              "ratio max", "clip low", "clip high", "clip region", "grad norm (pre-clip)", "c_H applied"]
    rows = []
    for it in its:
        lo = it.loss
        m = lo.completion_mask > 0
        r = lo.per_token_ratio[m]
        clip = [lo.metrics.get(k, math.nan) for k in _CLIP_KEYS]
        rows.append([str(it.index + 1), str(len(it.updates)), _fmt(lo.loss), _fmt(lo.pg_loss), _fmt(lo.kl_loss),
                     _fmt(lo.entropy_term), _fmt(lo.kl), _fmt(r.min() if r.numel() else math.nan),
                     _fmt(r.max() if r.numel() else math.nan), *map(_fmt, clip),
                     " / ".join(_fmt(u.grad_norm_pre_clip) for u in it.updates), _fmt(it.entropy_coef)])
    cfg = trace.config
    note = (f"Batch: this step's sampled rollout (N = {trace.rollout.completion_ids.shape[0]} rows), μ = "
            f"{cfg.num_iterations} passes × {cfg.steps_per_generation or 1} optimizer step(s). Each pass's loss "
            "is recomputed on all N rows from the log-probs of its grad forwards; r = exp(logπ_θ − logπ_old) with "
            "π_old frozen at sampling " + ("(μ > 1 or several steps per generation)" if cfg.freezes_old_logps else
                                           "— here μ = 1, so π_old = π_θ.detach() and r ≡ 1 (TRL)") +
            f". clip low/high/region = TRL's clip_ratio/*_mean (fraction of tokens, ε_low = {cfg.epsilon_low:g}, "
            f"ε_high = {cfg.epsilon_high:g}); kl = token-mean KL to the reference (raw, nats); grad norm = global "
            "L2 norm of each optimizer step's gradient before clipping.")
    return _table("Inner PPO iterations (trace.iterations)", header, rows, html.escape(note), "rwd-iterations")


def iteration_ratio_histogram_from_trace(trace: Any, *, bins: int = 60):
    """Histogram of the per-token ratio r_it of each pass (masked tokens only), with the clip bounds."""
    import plotly.graph_objects as go
    its = tuple(getattr(trace, "iterations", ()) or ())
    if not its:
        raise ValueError("no inner iterations recorded in this trace")
    fig = go.Figure()
    for it in its:
        lo = it.loss
        r = lo.per_token_ratio[lo.completion_mask > 0].float().numpy()
        fig.add_trace(go.Histogram(x=r, nbinsx=bins, name=f"pass {it.index + 1}", opacity=0.55))
    cfg = trace.config
    for x, label in ((1 - cfg.epsilon_low, "1 − ε_low"), (1 + cfg.epsilon_high, "1 + ε_high")):
        fig.add_vline(x=x, line_dash="dash", line_color="#b00020", annotation_text=label)
    fig.update_layout(barmode="overlay", height=320, margin=dict(l=50, r=20, t=60, b=40),
                      title=("Importance ratio r = π_θ/π_old per token, by inner pass (sampled rollout, "
                             "masked tokens excluded)"),
                      xaxis_title="r (1 = on-policy; dashed: PPO clip bounds)", yaxis_title="tokens")
    return fig


def iteration_token_strips_from_trace(trace: Any, iteration: int = -1, metric: str = "ratio",
                                      rows: Optional[Sequence[int]] = None, **kw):
    """Token strips of one pass (default the last): ratio strips outline the tokens that pass clipped."""
    from .adapters import token_strips_from_trace
    its = tuple(getattr(trace, "iterations", ()) or ())
    if not its:
        raise ValueError("no inner iterations recorded in this trace")
    it = its[iteration]
    view = replace(trace, loss=it.loss, update=None, evaluation=None)     # the step as this pass saw it
    kw.setdefault("title", f"pass {it.index + 1} of μ = {len(its)}: {metric} (clipped tokens outlined)")
    return token_strips_from_trace(view, metric, rows=rows, **kw)


def loss_type_comparison_table(rows: Sequence[Any], *, batch: str) -> HTMLView:
    """LossTypeRow records side by side: terms, normaliser, |weights| and the gradient norm w.r.t. log-probs."""
    header = ["loss_type", "loss", "PG term", "β·KL term", "entropy term", "normaliser", "mean |token weight|",
              "max |token weight|", "‖∂loss/∂logπ‖₂", "extra metric"]
    out = []
    for r in rows:
        lo = r.loss
        m = lo.completion_mask > 0
        w = r.token_weight[m].abs()
        extra = {k: v for k, v in lo.metrics.items() if k in ("clip_ratio/region_mean", "cispo_clip_ratio",
                                                               "vespo/phi_seq_mean")}
        out.append([f"<b>{html.escape(r.loss_type)}</b>", _fmt(lo.loss), _fmt(lo.pg_loss), _fmt(lo.kl_loss),
                    _fmt(lo.entropy_term), html.escape(str(lo.normalizer)), _fmt(w.mean() if w.numel() else 0),
                    _fmt(w.max() if w.numel() else 0), _fmt(r.grad_norm_logps),
                    ", ".join(f"{html.escape(k)} {_fmt(v)}" for k, v in extra.items())])
    note = (f"Batch: {html.escape(batch)}. The SAME tensors under each loss_type — a pure recompute, no forward "
            "pass. token weight = −∂loss/∂logπ_it: how much each token's ∇logπ enters the gradient (sign = push up "
            "/ down). ‖∂loss/∂logπ‖₂ is the gradient norm with respect to the per-token log-probs, not the model "
            "weights. Definitions: each record's `definition` (grpo/objective/loss.py).")
    return _table("Loss-type comparison", header, out, note, "rwd-loss-types")


def loss_type_comparison_from_trace(trace: Any, iteration: Optional[int] = -1, loss_types=None):
    """(table, figure) of `compare_loss_types` on pass `iteration` (None = the sampling-time record)."""
    import plotly.graph_objects as go

    from rookworld_debug.grpo.phases.iterations import compare_loss_types
    its = tuple(getattr(trace, "iterations", ()) or ())
    if iteration is not None and its and not (isinstance(iteration, int) and -len(its) <= iteration < len(its)):
        from rookworld_debug.errors import ConfigError
        raise ConfigError("iteration", f"this trace has {len(its)} pass(es): give 0..{len(its) - 1}, -1 for the "
                                       f"last, or None for the sampling-time record (got {iteration!r})")
    it = its[iteration] if (iteration is not None and its) else None
    rows = compare_loss_types(trace.rollout, trace.advantages, trace.config, iteration=it, loss_types=loss_types)
    batch = ("the sampled rollout at sampling time (r ≡ 1)" if it is None else
             f"the sampled rollout, pass {it.index + 1} of μ = {len(its)} (r vs log-probs frozen at sampling)")
    fig = go.Figure()
    names = [r.loss_type for r in rows]
    for label, attr in (("PG term", "pg_loss"), ("β·KL term", "kl_loss"), ("entropy term", "entropy_term")):
        fig.add_trace(go.Bar(name=label, x=names, y=[float(getattr(r.loss, attr)) for r in rows]))
    fig.add_trace(go.Scatter(name="‖∂loss/∂logπ‖₂", x=names, y=[r.grad_norm_logps for r in rows], yaxis="y2",
                             mode="markers+lines", marker=dict(color="#222")))
    fig.update_layout(barmode="relative", height=340, margin=dict(l=50, r=60, t=60, b=40),
                      title=f"Loss terms by loss_type — {batch}",
                      yaxis=dict(title="loss term"), yaxis2=dict(title="grad norm w.r.t. log-probs", overlaying="y",
                                                                 side="right", rangemode="tozero"))
    return loss_type_comparison_table(rows, batch=batch), fig
