"""The replay of a step, seen: one row per phase — agrees, disagrees or not replayed and why — with the quantity,
its measure, max |diff| against the tolerance and where; the first disagreement's rows and tokens highlighted in
the token strips; and recorded against recomputed for the quantity that disagrees.

    findings, replay = diagnosis.diagnose_step(trace, folder)     # what `rookworld-debug diagnose` runs
    replay_view(replay)                                             # in Jupyter: table, tokens, figure
    replay_table(replay), replay_tokens(replay), replay_figure(replay)   # the parts

Every number comes from the replay's records (`diagnosis.replay.records`); nothing is recomputed here.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Optional

import plotly.graph_objects as go

from ._style import FAIL_BG, FAIL_FG, FONT_SANS, INFO_BG, INFO_FG, PASS_BG, PASS_FG, fmt
from .htmlview import HTMLView
from .plots import OKABE_ITO, _layout

__all__ = ["ReplayView", "replay_view", "replay_table", "replay_tokens", "replay_figure"]

_E = html.escape
_STATUS = {"agree": ("agrees", PASS_BG, PASS_FG, "✓"), "disagree": ("disagrees", FAIL_BG, FAIL_FG, "✖"),
           "not replayed": ("not replayed", INFO_BG, INFO_FG, "–"),
           "suspect": ("suspect (a statistical test's warning)", INFO_BG, FAIL_FG, "?")}
MAX_TOKEN_ROWS = 4          # rows the token view shows, worst first
# scoped and specific enough to win over a notebook's own table style (JupyterLab right-aligns every cell)
_CSS = ("<style>.rw-replay .rw-replay-table{border-collapse:collapse;margin-top:4px}"
        ".rw-replay .rw-replay-table td,.rw-replay .rw-replay-table th{text-align:left;vertical-align:top;"
        "padding:3px 6px;border:1px solid #d0d7de}.rw-replay .rw-replay-table td.rw-num{text-align:right;"
        "font-variant-numeric:tabular-nums;white-space:nowrap}.rw-replay .rw-replay-table td.rw-vals{font-size:11px;"
        "max-width:20em;overflow-wrap:anywhere}.rw-replay .rw-replay-table td.rw-where{max-width:14em}"
        ".rw-replay .rw-replay-table td.rw-why{min-width:16em}</style>")
HIGHLIGHT_LABEL = "differs from the replay"


def _batch(replay) -> str:
    """The batch every number of the replay is about, in words."""
    trace = getattr(replay, "trace", None)
    ro = getattr(trace, "rollout", None)
    if ro is None:
        return "the recorded step"
    n, g = int(ro.completion_ids.shape[0]), int(getattr(ro, "num_generations", 0) or 1)
    return f"the recorded step: N = {n} rows = B {n // g} prompts × G {g} completions, T = " \
           f"{int(ro.completion_ids.shape[1])} completion tokens"


def _representative(checks: list):
    """The check a phase's row shows: its first disagreement (explained first), else the agreeing check nearest
    its tolerance, else the first not replayed."""
    dis = [c for c in checks if c.status == "disagree"] or [c for c in checks if c.status == "suspect"]
    if dis:
        return dis[0]
    agree = [c for c in checks if c.status == "agree"]
    if agree:
        return max(agree, key=lambda c: c.max_abs_diff / c.tolerance if c.tolerance and c.tolerance > 0
                   and math.isfinite(c.max_abs_diff) else 0.0)
    return checks[0]


def _status_cell(status: str) -> str:
    word, bg, fg, icon = _STATUS.get(status, (status, INFO_BG, INFO_FG, "?"))
    return f'<td style="background:{bg};color:{fg};font-weight:600;white-space:nowrap">{icon} {_E(word)}</td>'


def _others(checks: list, shown) -> str:
    rest = [c for c in checks if c is not shown]
    if not rest:
        return ""
    items = "; ".join(f"{_E(c.quantity.split(':')[0])} ({_E(_STATUS.get(c.status, (c.status,))[0])})" for c in rest)
    return f'<div style="color:#555;font-size:11px">also: {items}</div>'


def _phase_row(phase: dict, checks: list, first) -> str:
    c = _representative(checks)
    skipped = c.status == "not replayed"
    why = phase["why"] if skipped else (f"{c.cause}: {c.explanation}" if c.cause else c.explanation) or \
        ("no known mechanism reproduces the recorded values" if c.status == "disagree" else "")
    values = "" if skipped or not (c.recorded or c.recomputed) else \
        f"{_E(c.recorded or '—')} → {_E(c.recomputed or '—')}"
    is_first = first is not None and c is first
    cls = f"rw-replay-phase rw-replay-{c.status.replace(' ', '-')}" + (" rw-replay-first" if is_first else "")
    num = 'class="rw-num" style="text-align:right"'
    ring = f' style="outline:2px solid {FAIL_FG}"' if is_first else ""
    return (f'<tr class="{cls}" data-phase="{_E(phase["phase"], quote=True)}" data-status="{_E(c.status, quote=True)}"'
            f'{ring}>'
            f'<td><b>{_E(phase["phase"])}</b>{" ← first" if is_first else ""}</td>{_status_cell(phase["status"])}'
            f'<td>{_E(c.quantity)}{_others(checks, c)}</td><td style="color:#444">{"—" if skipped else _E(c.measure)}</td>'
            f'<td {num}>{"—" if skipped else _E(fmt(c.max_abs_diff))}</td>'
            f'<td {num}>{"—" if skipped else _E(fmt(c.tolerance))}</td>'
            f'<td class="rw-where">{_E(c.where)}</td><td class="rw-vals">{values}</td><td class="rw-why">{_E(why)}</td>'
            "</tr>")


def _headline(replay) -> str:
    first = replay.first_disagreement
    if first is not None:
        return (f"First disagreement: <b>{_E(first.phase)}</b> — {_E(first.quantity)}"
                + (f" (<code>{_E(first.cause)}</code>)" if first.cause else " (no known mechanism explains it)"))
    if all(c.status == "not replayed" for c in replay.checks):
        return "No phase could be replayed (each row says why)."
    return "Every replayed phase agrees with the record."


def _declarations(replay) -> str:
    if not replay.declarations:
        return ""
    items = "; ".join(f"<code>{_E(str(d.keyword))}</code> declared {_E(repr(d.declared))}, computed "
                      f"{_E(repr(d.fitted))} ({_E(d.phase)})" for d in replay.declarations)
    return (f'<div style="margin:2px 0">The step agrees under a neighbouring declaration: {items}; the rows below '
            "are the replay under it.</div>")


def replay_table(replay) -> HTMLView:
    """One row per replayed phase: its status, the quantity shown (its first disagreement, else the agreeing
    quantity nearest its tolerance), the measure, max |diff| against the tolerance, where, recorded → recomputed
    there, and the cause or why it was not replayed. The first disagreeing phase's row is outlined."""
    first = replay.first_disagreement
    rows = "".join(_phase_row(p, [c for c in replay.checks if c.phase == p["phase"]], first)
                   for p in replay.phases())
    head = "".join(f"<th>{h}</th>" for h in ("phase", "status", "quantity", "measure (definition of max |diff|)",
                                             "max |diff|", "tolerance", "where", "recorded → recomputed there",
                                             "cause / why not replayed"))
    return HTMLView(
        f'<section class="rw-replay" aria-label="Replay" style="font-family:{FONT_SANS};font-size:12px;margin:6px 0">'
        f"{_CSS}"
        f'<div style="font-size:15px;font-weight:700">Replay, phase by phase</div>'
        f'<div style="margin:2px 0">{_headline(replay)}</div>{_declarations(replay)}'
        f'<div style="color:#444;margin:2px 0">Each phase recomputed from the previous phase\'s RECORDED output by '
        f"the trusted implementation and compared with what the step recorded. Batch: {_E(_batch(replay))}. "
        f"Weights: {_E(replay.weights)}. Replayed in {replay.seconds:.2f} s. max |diff| is each quantity's own "
        f"measure (relative for the gradient and the update), held to the tolerance of the recorded precision.</div>"
        f'<table class="rw-replay-table"><thead><tr style="background:#f4f4f4">{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table>"
        "</section>")


def _first_with_samples(replay):
    first = replay.first_disagreement
    return (first, first.samples) if first is not None else (None, None)


def _token_marks(c, s) -> dict:
    """{(row, t): tooltip} of the disagreement's positions: its tokens, or every token of a disagreeing row."""
    values = {p: (r, v) for p, r, v in zip(s.positions, s.recorded, s.recomputed)}

    def said(p) -> str:
        if p in values:
            return f"recorded {fmt(values[p][0])}, recomputed {fmt(values[p][1])}"
        return f"|recorded − recomputed| > {fmt(s.threshold)}"
    return {p: said(p) for p in s.beyond}


def replay_tokens(replay, trace: Any = None, *, max_rows: int = MAX_TOKEN_ROWS) -> HTMLView:
    """The first disagreement's rows (worst first, `max_rows` at most) as token strips with its tokens marked —
    every in-loss token of a row whose per-row quantity disagrees — or a line saying why there is none."""
    from .adapters import token_strips_from_trace
    trace = trace if trace is not None else getattr(replay, "trace", None)
    c, s = _first_with_samples(replay)
    wrap = f'<div class="rw-replay-tokens" style="font-family:{FONT_SANS};font-size:12px;margin:6px 0">'
    if c is None:
        return HTMLView(wrap + "No phase disagrees: no token to highlight.</div>")
    if s is None or s.axes not in (("row",), ("row", "token")) or getattr(trace, "rollout", None) is None:
        return HTMLView(wrap + f"The first disagreement ({_E(c.quantity)}) keeps no rows or tokens "
                        f"of the rollout to highlight; where: {_E(c.where or '—')}.</div>")
    rows = list(dict.fromkeys(p[0] for p in s.beyond))[:max_rows]
    marks = _token_marks(c, s)
    if s.axes == ("row",):             # a per-row quantity: the whole row is the place
        mask = trace.rollout.completion_mask
        marks = {(r, t): f"this row's {c.quantity.split(':')[0]}: {marks[(r,)]}" for r in rows
                 for t in range(int(mask.shape[1])) if bool(mask[r, t])}
    metric = "ref_logp" if c.quantity.startswith("ref_per_token") else "logp"
    unit = "rows" if s.axes == ("row",) else "tokens (inside the loss mask where it has one)"
    title = (f"Where the replay first disagrees — {c.phase}: {c.quantity}. {s.n_beyond} of the {s.total} compared "
             f"{unit} differ by more than {fmt(s.threshold)}; rows {rows} shown, worst first (colour: {metric}; "
             f"batch: {_batch(replay)})")
    try:
        strips = token_strips_from_trace(trace, metric, rows=rows, highlight=marks, highlight_label=HIGHLIGHT_LABEL,
                                         title=title)
    except ValueError as err:          # the trace lacks that metric: say so, keep the page
        return HTMLView(wrap + f"The token view cannot be drawn from this trace: {_E(str(err))}</div>")
    return HTMLView(wrap + strips.html + "</div>")


def _where_label(s, k: int) -> str:
    p = s.positions[k]
    if not s.axes:
        return "the step's total"
    if s.parameter:
        return f"{s.parameter}[{p[0]}]"
    return " · ".join(f"{a} {v}" for a, v in zip(s.axes, p))


def replay_figure(replay) -> Optional[go.Figure]:
    """Recorded against recomputed for the first disagreeing quantity (its kept values: all, or the farthest apart
    and an even spread), the diagonal where they agree, the values beyond the tolerance in orange; a total as two
    bars. None when no phase disagrees or the disagreement kept no values."""
    c, s = _first_with_samples(replay)
    if c is None or s is None or not s.recorded:
        return None
    batch = _batch(replay)
    title = f"Replay — {c.phase}: recorded vs recomputed"
    if not s.axes:
        fig = go.Figure(go.Bar(x=["recorded", "recomputed"], y=[s.recorded[0], s.recomputed[0]],
                               marker_color=[OKABE_ITO[1], OKABE_ITO[0]], text=[fmt(s.recorded[0]), fmt(s.recomputed[0])],
                               textposition="outside", hovertemplate="%{x}: %{y:.6g}<extra></extra>"))
        return _layout(fig, title, f"{c.quantity}. recorded: what the step recorded; recomputed: the trusted "
                       f"implementation from the previous phase's recorded output; |diff| {fmt(c.max_abs_diff)} > "
                       f"tolerance {fmt(c.tolerance)}. Batch: {batch}.", yaxis_title=c.quantity.split(":")[0],
                       showlegend=False)
    beyond = set(s.beyond)
    fig = go.Figure()
    for name, keep, color in ((f"within {fmt(s.threshold)}", False, "#9a9a9a"),
                              (f"|diff| > {fmt(s.threshold)}", True, OKABE_ITO[3])):
        ks = [k for k in range(len(s.recorded)) if (s.positions[k] in beyond) == keep]
        if ks:
            fig.add_scatter(x=[s.recomputed[k] for k in ks], y=[s.recorded[k] for k in ks], mode="markers", name=name,
                            marker={"color": color, "size": 6, "opacity": 0.8},
                            text=[_where_label(s, k) for k in ks],
                            hovertemplate="%{text}<br>recorded %{y:.6g}<br>recomputed %{x:.6g}<extra></extra>")
    finite = [v for v in (*s.recorded, *s.recomputed) if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="recorded = recomputed",
                    line={"color": "#333", "dash": "dot", "width": 1}, hoverinfo="skip")
    of = f" (elements of {s.parameter})" if s.parameter else ""
    definition = (f"{c.quantity}{of}. x: recomputed by the trusted implementation from the previous phase's "
                  f"recorded output; y: what the step recorded; on the dotted diagonal they agree. Orange: the "
                  f"{s.n_beyond} of {s.total} values whose |recorded − recomputed| > {fmt(s.threshold)}. Shown: "
                  f"{s.picked}. Batch: {batch}.")
    _layout(fig, title, definition, xaxis_title="recomputed", yaxis_title="recorded", height=480)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0.0},
                      margin={"b": 90})            # below the plot: the definition above takes the title's width
    return fig


@dataclass(frozen=True, repr=False)
class ReplayView:
    """The table, the token view and the figure (None: nothing disagrees) of one replay. In Jupyter it displays
    the three in that order; `.html` is the table and the token view (the figure is a plotly figure)."""
    table: HTMLView
    tokens: HTMLView
    figure: Optional[go.Figure]

    @property
    def html(self) -> str:
        return self.table.html + self.tokens.html

    def _repr_html_(self) -> str:
        return self.html

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(self.table)
        display(self.tokens)
        if self.figure is not None:
            self.figure.show()

    def __repr__(self) -> str:
        return f"ReplayView(table, tokens, figure={'yes' if self.figure is not None else 'none'})"


def replay_view(replay, trace: Any = None) -> ReplayView:
    """The replay of one step (`diagnosis.diagnose_step(trace, folder)[1]`) as a table, a token view and a
    figure. `trace`: the step to draw tokens from (default: the trace the replay replayed). None (a diagnosis run
    with `replay=False`) is said in one line."""
    if replay is None:
        return ReplayView(HTMLView(f'<div class="rw-replay" style="font-family:{FONT_SANS};font-size:12px">Not '
                                   "replayed: this diagnosis ran without its replay (replay=False).</div>"),
                          HTMLView(""), None)
    return ReplayView(table=replay_table(replay), tokens=replay_tokens(replay, trace), figure=replay_figure(replay))
