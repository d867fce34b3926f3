"""The triage page's parts (notebook 04), from triage.json's plain values: the curves, the flagged-steps table,
the trend table. Every string that came from the run's files (folder names, metric names, notes, errors) is
HTML-escaped; every command shown is shell-quoted where it is built (`triage_build`). A logged NaN/±inf is a
gap in its curve (and a `non_finite` firing in the table), never a failed page.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

from rookworld_debug.report.triage import moving_average

TREND_KEYS = ("n", "up_steps", "down_steps", "flat_steps", "first", "last", "net_change", "trend_change",
              "trend_change_ci95", "kl_dominated_share")
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def value(x):
    """A logged number as a float (non-finite kept: strict JSON writes them as "NaN"/"Infinity"), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    return _NONFINITE.get(x) if isinstance(x, str) else None


def _finite(x):
    v = value(x)
    return v if v is not None and math.isfinite(v) else None


def num(x) -> str:
    """A value for a table cell: 4 significant digits for numbers, the escaped text otherwise."""
    v = value(x)
    if v is not None:
        return f"{v:.4g}"
    if isinstance(x, (list, tuple)):
        return ", ".join(num(y) for y in x)
    return html.escape(str(x))


def header_lines(t: dict) -> list[str]:
    """The page's first lines (plain text: printed, not HTML)."""
    rows, flagged = t.get("rows") or [], t.get("flagged") or []
    out = [f"run: {t.get('run_dir')}  ·  log: {t.get('source')}  ·  {len(rows)} logged steps, {len(flagged)} "
           f"firings, {sum(1 for f in flagged if f.get('captured'))} of them on captured steps"]
    return out + [f"note: {n}" for n in t.get("notes") or []]


def curves_figure(t: dict):
    """One panel per metric TRL logged (non-finite values are gaps), ✕ where a trigger fired, dotted lines at the
    captured steps; None when the log holds no curve yet."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    rows = [r for r in t.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("step"), int)]
    curves = [c for c in t.get("curves") or [] if any(value(r.get(c)) is not None for r in rows)]
    if not curves:
        return None
    fig = make_subplots(rows=len(curves), cols=1, shared_xaxes=True, vertical_spacing=0.02,
                        subplot_titles=[html.escape(c) for c in curves])
    captured = sorted({int(s) for s in t.get("captured_steps") or []})
    by_step = {r["step"]: r for r in rows}                      # one lookup per mark (10,000-step logs)
    fired: dict = {}                                            # step -> the triggers that fired there
    for f in t.get("flagged") or []:
        if f.get("step") in by_step:
            fired.setdefault(f["step"], []).append(html.escape(str(f.get("trigger"))))
    for i, name in enumerate(curves, 1):
        _panel(fig, i, name, rows, by_step, fired, captured, t.get("window", 10), np, go)
    fig.update_layout(height=max(300, 170 * len(curves)), margin=dict(l=60, r=20, t=40, b=30),
                      title="Logged metrics per optimizer step (✕ trigger fired, dotted line = captured step; "
                            "a gap = a NaN/inf logged there)")
    return fig


def _panel(fig, i, name, rows, by_step, fired, captured, window, np, go) -> None:
    pts = [(r["step"], value(r.get(name))) for r in rows if value(r.get(name)) is not None]
    xs = np.asarray([p[0] for p in pts], dtype=np.int32)
    # typed arrays: plotly stores them as binary (float32 ≈ 7 digits), ~4× smaller than JSON number lists;
    # float64 when a value lies past float32's range (it would become inf)
    big = any(math.isfinite(p[1]) and abs(p[1]) > 3e38 for p in pts)
    dtype = np.float64 if big else np.float32
    ys = np.asarray([p[1] if math.isfinite(p[1]) else math.nan for p in pts], dtype=dtype)   # NaN: a gap
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, line=dict(width=1.2), showlegend=False,
                             connectgaps=False), i, 1)
    finite = [float(y) for y in ys if math.isfinite(y)]
    if len(pts) > 3:
        ma = moving_average([p[1] for p in pts], window)
        fig.add_trace(go.Scatter(x=xs, y=np.asarray(ma, dtype=dtype), mode="lines", showlegend=False,
                                 line=dict(dash="dash", width=1), name=f"{name} (moving avg)"), i, 1)
    marks = [(s, _finite(by_step[s].get(name)), ", ".join(tr)) for s, tr in sorted(fired.items())]
    marks = [m for m in marks if m[1] is not None]
    if marks:
        fig.add_trace(go.Scatter(x=[m[0] for m in marks], y=[m[1] for m in marks], mode="markers", showlegend=False,
                                 marker=dict(symbol="x", color="#cf222e", size=9), name="trigger",
                                 text=[m[2] for m in marks], hovertemplate="step %{x}: %{text}<extra></extra>"), i, 1)
    if captured and finite:                                     # one trace of dotted lines, not one shape per step
        lo, hi = min(finite), max(finite)
        fig.add_trace(go.Scatter(x=[v for s in captured for v in (s, s, None)],
                                 y=[v for _ in captured for v in (lo, hi, None)], mode="lines", showlegend=False,
                                 line=dict(color="#1a7f37", width=1, dash="dot"), name="captured",
                                 hovertemplate="captured step %{x}<extra></extra>"), i, 1)


def link(f: dict, captures_present: bool) -> str:
    """The flagged row's report cell: the link, the command that renders it, or why there is none."""
    e = html.escape
    step = e(str(f.get("step")))
    if f.get("broken"):
        return f'<span class="rw-capture-broken">capture broken: {e(str(f["broken"]))}</span>'
    if f.get("report") and f.get("report_rendered", True):
        return f'<a class="rw-step-report" href="{e(str(f["report"]), quote=True)}">step {step} report</a>'
    if f.get("report_command"):                             # a large run: rendered on demand, where the link points
        return (f'<a class="rw-step-report-pending" href="{e(str(f["report"]), quote=True)}">step {step} report</a> '
                f'(not rendered yet; run <code>{e(str(f["report_command"]))}</code>)')
    if f.get("captured"):
        return "captured (render its report with <code>rookworld-debug triage RUN_DIR</code>)"
    return "not captured" + ("" if captures_present else " (no flight recorder in this run)")


def flagged_table_html(t: dict) -> str:
    flagged = [f for f in t.get("flagged") or [] if isinstance(f, dict)]
    if not flagged:
        return "<p>No trigger fires on this log.</p>"
    e = html.escape
    body = "".join(f"<tr><td>{e(str(f.get('step')))}</td><td>{e(str(f.get('trigger')))}</td>"
                   f"<td>{e(str(f.get('kind')))}</td><td>{num(f.get('value'))}</td><td>{num(f.get('threshold'))}</td>"
                   f"<td>{e(str(f.get('detail', '')))}</td><td>{link(f, bool(t.get('captures_present')))}</td></tr>"
                   for f in flagged)
    return ('<table class="rw-flagged"><thead><tr><th>step</th><th>trigger</th><th>kind</th><th>value</th>'
            '<th>threshold</th><th>why</th><th>report</th></tr></thead><tbody>' + body + '</tbody></table>')


def trend_table_html(t: dict) -> str:
    tr = t.get("trend") or {}
    return "<table>" + "".join(f"<tr><th>{k}</th><td>{num(tr[k])}</td></tr>" for k in TREND_KEYS if k in tr) + \
        "</table>"


def demo_run(run_dir=None) -> Path:
    """The run the page triages when it is given none: `rookworld-debug trl-demo`'s run (TRL's GRPOTrainer on the
    embedded tiny model, flight recorder on), made once under RUN_DIR/demo-run (or the package cache) and reused."""
    from rookworld_debug.models.tokenizer import cache_dir
    folder = (Path(run_dir) / "demo-run") if run_dir else cache_dir() / "trl-demo"
    if not (folder / "trainer_state.json").is_file() or not (folder / "captures" / "captures.json").is_file():
        from rookworld_debug.trl.demo import run_demo
        run_demo(folder)
    return folder
