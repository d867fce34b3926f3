"""Signal or noise: the view of `StepTrace.diagnostics` (grpo.signal.noise.SignalNoise).

Every number says its estimator and its batch (definitions: `metrics.GLOSSARY` snr, b_simple, delta_reward_ci,
group_cos_step). Nothing is recomputed here.
"""
from __future__ import annotations

import html
import math
from typing import Any

from ._style import fmt
from .htmlview import HTMLView

__all__ = ["signal_noise_from_trace", "group_cosine_figure_from_trace", "group_size_figure_from_trace",
           "sampler_gap_figure_from_trace"]


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
    rows += _group_size_rows(d) + _entropy_rows(d) + _gap_rows(d)
    body = "".join(f'<tr title="{html.escape(definition(k), quote=True)}"><th style="text-align:left">{html.escape(a)}'
                   f"</th><td><b>{html.escape(b)}</b></td><td>{html.escape(c)}</td></tr>" for a, b, c, k in rows)
    groups = "".join(f"<tr><td>{i}</td><td>{fmt(float(nm))}</td><td>{fmt(float(cs))}</td><td>{fmt(float(w))}</td></tr>"
                     for i, (nm, cs, w) in enumerate(zip(d.group_grad_norms, d.group_cos_step, d.group_weights)))
    trust = "" if n.trustworthy else (f'<p style="color:#9a6700"><b>Cannot be trusted as a point value:</b> '
                                      f"{html.escape(n.note)}.</p>")
    if n.num_groups < 2:                   # nothing to compare across: the rows above are NaN, say why
        trust = f'<p style="color:#9a6700"><b>Noise scale across groups:</b> {html.escape(n.note)}.</p>'
    return HTMLView(
        '<div class="rw-signal"><table class="rw-table"><caption style="text-align:left">Batch: the sampled rollout '
        "at the step's start (the first optimizer step's gradient), split by group; Δreward: greedy, same prompts, "
        f"after − before</caption>{body}</table>{trust}"
        '<table class="rw-table"><caption style="text-align:left">Per group b: ‖g_b‖ (its gradient), cos(g_b, step '
        "gradient), and its share of Σ|row loss terms| (the loss type's std/length normalization included)"
        "</caption><tr><th>group</th><th>‖g_b‖</th><th>cos with step</th><th>weight</th></tr>"
        f"{groups}</table>{_clip_table(d)}<p style='font-size:.85em'>computed in {fmt(d.seconds)} s "
        f"({html.escape(_parts(d))})</p></div>")


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


def _parts(d) -> str:
    parts = getattr(d, "seconds_parts", None) or {}
    return ", ".join(f"{k} {fmt(v)} s" for k, v in parts.items()) or "one backward per group"


def _group_size_rows(d) -> list:
    sw = getattr(d, "group_size", None)
    if sw is None:
        return [("cos(g_G′, g_G), what if G were smaller", "n/a", "G < 3: no G′ with 2 ≤ G′ < G", "group_size_cos")]
    vals = "; ".join(f"G′={g}: {fmt(m)} ± {fmt(s)}" for g, m, s in zip(sw.sizes, sw.cos_mean, sw.cos_std))
    return [("cos(g_G′, g_G), what if G were smaller", vals,
             f"mean ± sd over {sw.draws} seeded draws of G′ of the G = {sw.full_g} completions per group; advantages "
             "recomputed on the kept rewards, the step's loss and normalizers on the kept rows, same forward"
             + _flagged(sw.flags), "group_size_cos")]


def _flagged(flags) -> str:
    return "".join(f" ⚠ {f}." for f in flags)


def _entropy_rows(d) -> list:
    e = getattr(d, "entropy", None)
    if e is None:
        return []
    meas = e.measured_first_step if math.isfinite(e.measured_first_step) else e.measured_delta_entropy
    which = "after ONE optimizer step" if math.isfinite(e.measured_first_step) else "after the whole update"
    agree = {None: "sign: n/a", True: "sign agrees", False: "sign DISAGREES"}[e.sign_agrees]
    return [
        ("Cov(log π, A) over sampled tokens", fmt(e.cov), f"Σ m(ℓ − ℓ̄)(A − Ā)/n, n = {e.n_tokens} masked tokens of the "
         "sampled rollout, ℓ from the trainer's forward at the step's start", "entropy_cov"),
        ("predicted entropy change −η·Cov", fmt(e.predicted_delta_entropy),
         f"first-order (Cui et al. 2025, natural-PG softmax step), η = lr = {fmt(e.eta)}; read the sign",
         "predicted_delta_entropy"),
        ("measured entropy change", fmt(meas), f"token mean of H_after − H_before on the same sampled tokens, {which} "
         f"(whole update: {fmt(e.measured_delta_entropy)}); H_before = {fmt(e.entropy_before)} nats; {agree}; "
         f"implied η_eff = {fmt(e.implied_eta)}" + _flagged(e.flags), "measured_delta_entropy"),
    ]


def _gap_rows(d) -> list:
    g = getattr(d, "gap", None)
    if g is None:
        return []
    q = dict(g.quantiles)
    return [
        ("sampler–trainer gap Δ = log π_sampler − log π_trainer", f"max |Δ| {fmt(g.max_abs)}, mean |Δ| {fmt(g.mean_abs)}",
         f"quantiles 1 % {fmt(q.get(0.01, math.nan))}, 50 % {fmt(q.get(0.5, math.nan))}, 99 % "
         f"{fmt(q.get(0.99, math.nan))}; n = {g.n_tokens} masked tokens of the rollout; sampler: {g.sampler}; "
         f"trainer: {g.trainer}" + _flagged(g.flags), "sampler_gap"),
        ("truncated IS weights ESS", f"per token {fmt(g.ess_token_frac)}, per sequence {fmt(g.ess_seq_frac)}",
         f"ESS/n with ESS = (Σw)²/Σw², w = min(e^(−Δ), C), C = {fmt(g.cap)} (TRL token/sequence_truncate); "
         f"w in [{fmt(g.is_min)}, {fmt(g.is_max)}], {fmt(100 * g.frac_capped)} % capped", "is_ess"),
    ]


def _clip_table(d) -> str:
    e = getattr(d, "entropy", None)
    if e is None or not e.clip:
        return ""
    body = "".join(f"<tr><td>{c.pass_index + 1}</td><td>{c.clip_low_neg} ({fmt(100 * c.share_clip_low_neg)} %)</td>"
                   f"<td>{c.clip_high_pos} ({fmt(100 * c.share_clip_high_pos)} %)</td><td>{c.low_pos}</td>"
                   f"<td>{c.high_neg}</td><td>{c.n_tokens}</td></tr>" for c in e.clip)
    from rookworld_debug.metrics import definition
    title = html.escape(definition("clip_events"), quote=True)
    return (f'<table class="rw-table" title="{title}"><caption style="text-align:left">Clip events by bound and sign of A, '
            "per inner pass μ (tokens, share of the n masked tokens of the rollout)</caption><tr><th>pass</th>"
            "<th>clip-low, A&lt;0 (entropy-raising side)</th><th>clip-high, A&gt;0 (entropy-lowering side)</th>"
            "<th>r &lt; 1−ε, A&gt;0 (not binding)</th><th>r &gt; 1+ε, A&lt;0 (not binding)</th><th>n</th></tr>"
            f"{body}</table>")


def group_size_figure_from_trace(trace: Any):
    """cos(g_G′, g_G) against G′ (mean ± sd over the draws, each draw a dot), or None without the sweep."""
    d = getattr(trace, "diagnostics", None)
    sw = getattr(d, "group_size", None)
    if sw is None:
        return None
    import plotly.graph_objects as go
    xs = list(sw.sizes) + [sw.full_g]
    fig = go.Figure()
    dots = [(g, float(c)) for g, row in zip(sw.sizes, sw.cosines) for c in row if math.isfinite(float(c))]
    fig.add_trace(go.Scatter(x=[g for g, _ in dots], y=[c for _, c in dots], mode="markers", name="one draw",
                             marker=dict(size=6, opacity=0.5)))
    fig.add_trace(go.Scatter(x=xs, y=list(sw.cos_mean) + [1.0], mode="lines+markers", name="mean over draws",
                             error_y=dict(type="data", array=[0 if not math.isfinite(s) else s for s in sw.cos_std] + [0])))
    fig.update_layout(height=320, width=460, margin=dict(l=50, r=10, t=60, b=45),
                      title=f"What if G were smaller? cos(g_G′, g_G)<br><sub>{sw.draws} seeded draws per G′; "
                            "advantages recomputed; sampled rollout, step start</sub>",
                      xaxis=dict(title="G′ completions kept per group", dtick=1), yaxis=dict(title="cosine with full-G gradient"))
    return fig


def sampler_gap_figure_from_trace(trace: Any):
    """Histogram of Δ = log π_sampler − log π_trainer over the masked tokens, or None without it."""
    d = getattr(trace, "diagnostics", None)
    g = getattr(d, "gap", None)
    if g is None or g.n_tokens == 0:
        return None
    import plotly.graph_objects as go
    fig = go.Figure(go.Histogram(x=g.delta.tolist(), nbinsx=60, name="tokens"))
    fig.update_layout(height=300, width=460, margin=dict(l=50, r=10, t=60, b=45), bargap=0.02,
                      title=f"Sampler–trainer gap Δ = log π_sampler − log π_trainer<br><sub>n = {g.n_tokens} masked "
                            f"tokens; sampler: {html.escape(g.sampler)}</sub>",
                      xaxis=dict(title="Δ (nats)"), yaxis=dict(title="tokens", type="log"))
    return fig
