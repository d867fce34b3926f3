"""The sweep index: index.json (every run's status, params, metrics) and index.html (sortable table +
metric-vs-parameter plots, plotly.js inline)."""
from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rookworld_debug.report.export import _PAGE_CSS
from rookworld_debug.report.grid import _fmt_value
from rookworld_debug.report.store import (
    INDEX_SCHEMA, IncompleteSummaryError, _flatten_metrics, _now, _sha256_file, atomic_write_json,
    atomic_write_text, read_summary, to_jsonable,
)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not (isinstance(v, float) and not math.isfinite(v))


def _nonfinite(v: Any) -> bool:
    return v in ("NaN", "Infinity", "-Infinity") or (isinstance(v, float) and not math.isfinite(v))


def build_index(sweep_dir, *, current: Sequence[Mapping] | None = None, grid: Mapping | None = None,
                notebook=None) -> dict:
    """The machine-readable index of a sweep folder: every run folder that has a params.json (those of
    ``current``, the sweep being run, first and in grid order; pending ones included), its status
    (ok / failed / incomplete / pending), parameters, flattened metrics and links."""
    sweep_dir = Path(sweep_dir)
    entries: list[dict] = []
    listed: set[str] = set()
    nb_sha = _sha256_file(Path(notebook)) if notebook else None

    def entry(rid: str, params: Mapping | None, phash: str | None, in_current: bool) -> dict:
        rdir = sweep_dir / rid
        e: dict[str, Any] = {"run_id": rid, "in_current_grid": in_current, "params": dict(params or {}),
                             "params_hash": phash, "status": "pending", "metrics": {}, "error": None,
                             "report_html": None, "error_html": None, "report_ipynb": None,
                             "duration_s": None, "notebook_sha256": None, "stale_notebook": False,
                             "warnings": []}
        try:
            s = read_summary(rdir, params_hash=phash, require_ok=False)
        except IncompleteSummaryError as exc:
            if (rdir / "params.json").exists():
                e["status"] = "incomplete"
                e["warnings"].append(exc.reason)
            return e
        files = s.get("files") or {}
        e.update(status=s["status"], params=s.get("params", e["params"]), params_hash=s.get("params_hash"),
                 metrics=_flatten_metrics(s.get("metrics")), notebook_sha256=s.get("notebook_sha256"),
                 duration_s=(s.get("runner") or {}).get("total_s"),
                 warnings=list((s.get("runner") or {}).get("warnings") or []))
        if s["status"] == "ok" and not (rdir / files.get("report_html", "report.html")).exists():
            e["status"] = "incomplete"
            e["warnings"].append("report.html missing")
        for key, name in (("report_html", "report.html"), ("error_html", "error.html"),
                          ("report_ipynb", "report.ipynb")):
            if (rdir / name).exists():
                e[key] = f"{rid}/{name}"
        if s["status"] == "failed":
            err = s.get("error") or {}
            e["error"] = {"ename": err.get("ename"), "evalue": err.get("evalue"),
                          "cell_index": err.get("cell_index")}
        if nb_sha and e["notebook_sha256"] and e["notebook_sha256"] != nb_sha:
            e["stale_notebook"] = True
        return e

    for r in current or ():
        entries.append(entry(r["run_id"], r["params"], r["params_hash"], True))
        listed.add(r["run_id"])
    if sweep_dir.is_dir():
        for sub in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name not in listed):
            pj = sub / "params.json"
            if not pj.exists():
                continue
            try:
                meta = json.loads(pj.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            entries.append(entry(sub.name, meta.get("params"), meta.get("params_hash"), False))

    param_keys: list[str] = []
    for e in entries:
        param_keys.extend(k for k in e["params"] if k not in param_keys)
    swept = [k for k in param_keys
             if len({json.dumps(e["params"].get(k), sort_keys=True) for e in entries}) > 1]
    metric_keys: list[str] = []
    for e in entries:
        metric_keys.extend(k for k, v in e["metrics"].items()
                           if k not in metric_keys and (_is_number(v) or _nonfinite(v)))
    counts = {s: sum(e["status"] == s for e in entries) for s in ("ok", "failed", "incomplete", "pending")}
    return {"schema": INDEX_SCHEMA, "sweep": sweep_dir.name, "sweep_dir": str(sweep_dir),
            "notebook": None if notebook is None else str(notebook), "notebook_sha256": nb_sha,
            "generated_at": _now(), "grid": to_jsonable(grid or {}), "swept": swept, "param_keys": param_keys,
            "metric_keys": metric_keys, "counts": {**counts, "total": len(entries)}, "runs": to_jsonable(entries)}


def _fmt_cell(v: Any) -> str:
    if _nonfinite(v):
        return f"<span class='flag'>{html.escape(str(v))}</span>"
    if isinstance(v, float):
        return f"{v:.6g}"
    return html.escape(_fmt_value(v))


def _metric_figures(index: dict) -> list[str]:
    """One plotly figure per swept parameter: a subplot per numeric metric against it, one line per
    combination of the other swept parameters (ok runs only)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [e for e in index["runs"] if e["status"] == "ok"]
    metrics = [m for m in index["metric_keys"] if any(_is_number(e["metrics"].get(m)) for e in ok)]
    if not ok or not metrics or not index["swept"]:
        return []
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    divs = []
    for p in index["swept"]:
        others = [q for q in index["swept"] if q != p]
        xs_all = [e["params"].get(p) for e in ok]
        numeric_x = all(_is_number(x) and not isinstance(x, bool) for x in xs_all)
        groups: dict[str, list] = {}
        for e in ok:
            label = ", ".join(f"{q}={_fmt_value(e['params'].get(q))}" for q in others) or p
            groups.setdefault(label, []).append(e)
        cols = min(3, len(metrics))
        rows = math.ceil(len(metrics) / cols)
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=metrics,
                            vertical_spacing=min(0.12, 0.5 / max(rows - 1, 1)) if rows > 1 else 0.1,
                            horizontal_spacing=0.08)
        for gi, (label, members) in enumerate(groups.items()):
            members = sorted(members, key=lambda e: (e["params"].get(p) if numeric_x
                                                     else _fmt_value(e["params"].get(p))))
            color = palette[gi % len(palette)]
            for mi, m in enumerate(metrics):
                pts = [(e["params"].get(p), e["metrics"].get(m), e["run_id"]) for e in members]
                pts = [(x, float(y), rid) for x, y, rid in pts if _is_number(y)]
                if not pts:
                    continue
                fig.add_trace(go.Scatter(
                    x=[x if numeric_x else _fmt_value(x) for x, _, _ in pts], y=[y for _, y, _ in pts],
                    text=[rid for _, _, rid in pts], mode="lines+markers", name=label, legendgroup=label,
                    showlegend=(mi == 0), line={"color": color}, marker={"color": color},
                    hovertemplate=f"{p}=%{{x}}<br>{m}=%{{y}}<br>%{{text}}<extra>{html.escape(label)}</extra>"),
                    row=mi // cols + 1, col=mi % cols + 1)
        fig.update_xaxes(title_text=p, type=None if numeric_x else "category")
        fig.update_layout(height=max(320, 260 * rows), title=f"headline metrics vs {p}",
                          margin={"l": 50, "r": 20, "t": 70, "b": 40}, legend={"title": " / ".join(others)})
        divs.append(fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                                config={"displaylogo": False, "responsive": True}))
    return divs


_SORT_JS = """
document.querySelectorAll('table.runs th').forEach(function(th, col){th.addEventListener('click', function(){
 var tb=th.closest('table').tBodies[0], rows=Array.from(tb.rows), asc=th.dataset.asc!=='1'; th.dataset.asc=asc?'1':'0';
 rows.sort(function(a,b){var x=a.cells[col].dataset.v??a.cells[col].innerText, y=b.cells[col].dataset.v??b.cells[col].innerText;
  var nx=parseFloat(x), ny=parseFloat(y); var c=(!isNaN(nx)&&!isNaN(ny))?nx-ny:String(x).localeCompare(String(y));
  return asc?c:-c;}); rows.forEach(function(r){tb.appendChild(r);});});});
"""


#: metrics shown as columns of the runs table when present (the rest: the "all metrics" table below), so
#: the table fits a 1,400 px window with its report links in the first column
INDEX_COLUMNS = ("reward_before", "reward_after", "delta_reward", "heldout_reward_after", "rollout_reward", "loss",
                 "kl", "kl_grad_share", "grad_norm_pre_clip", "frac_reward_zero_std")
_MAX_COLUMNS = 8


def _run_links(e: dict) -> str:
    esc = html.escape
    links = []
    if e.get("report_html") and e["status"] == "ok":
        links.append(f"<a href='{esc(e['report_html'])}'>report</a>")
    if e.get("error_html"):
        links.append(f"<a href='{esc(e['error_html'])}'>error</a>")
    if e.get("report_ipynb"):
        links.append(f"<a href='{esc(e['report_ipynb'])}'>ipynb</a>")
    return " · ".join(links)


def _all_metrics_table(index: dict) -> str:
    """Transposed: one row per metric, one column per run (scrolls sideways inside its box)."""
    esc, runs = html.escape, index["runs"]
    if not runs or not index["metric_keys"]:
        return ""
    head = "".join(f"<th>{esc(e['run_id'])}</th>" for e in runs)
    rows = "".join(f"<tr><td><code>{esc(m)}</code></td>" + "".join(
        f"<td class='num'>{'' if e['metrics'].get(m) is None else _fmt_cell(e['metrics'].get(m))}</td>" for e in runs)
        + "</tr>" for m in index["metric_keys"])
    return (f"<details><summary>All {len(index['metric_keys'])} metrics of every run</summary>"
            f"<div class='scroll'><table><thead><tr><th>metric</th>{head}</tr></thead><tbody>{rows}</tbody></table>"
            "</div></details>")


def _index_html(index: dict) -> str:
    esc = html.escape
    swept = index["swept"]
    metrics = [m for m in INDEX_COLUMNS if m in index["metric_keys"]] or list(index["metric_keys"])
    metrics = metrics[:_MAX_COLUMNS]
    other_params = [k for k in index["param_keys"] if k not in swept]
    head = ["run", "status", *swept, *metrics, "time (s)"]
    body_rows = []
    for e in index["runs"]:
        status = e["status"]
        cells = [f"<td><code>{esc(e['run_id'])}</code>{'' if e['in_current_grid'] else ' <span class=muted>(earlier grid)</span>'}"
                 f"<br>{_run_links(e)}</td>"]
        note = ""
        if e.get("error"):
            note = (f"<br><span class='flag'>{esc(str(e['error'].get('ename')))}: "
                    f"{esc(str(e['error'].get('evalue'))[:200])}</span>")
        if e.get("stale_notebook"):
            note += "<br><span class='muted'>notebook changed since this run</span>"
        for w in e.get("warnings") or []:
            note += f"<br><span class='muted'>{esc(str(w))}</span>"
        cells.append(f"<td data-v='{esc(status)}'><span class='badge {esc(status)}'>{esc(status)}</span>{note}</td>")
        for k in swept:
            v = e["params"].get(k)
            cells.append(f"<td class='num' data-v='{esc(_fmt_value(v))}'>{_fmt_cell(v)}</td>")
        for m in metrics:
            v = e["metrics"].get(m)
            dv = esc(str(v)) if _is_number(v) else ""
            cells.append(f"<td class='num' data-v='{dv}'>{'' if v is None else _fmt_cell(v)}</td>")
        d = e.get("duration_s")
        cells.append(f"<td class='num'>{'' if d is None else f'{d:.1f}'}</td>")
        body_rows.append(f"<tr class='{esc(status)}'>{''.join(cells)}</tr>")
    c = index["counts"]
    fixed_html = ""
    if other_params and index["runs"]:
        first = index["runs"][0]["params"]
        fixed_html = ("<p class='muted'>same in every run: " +
                      ", ".join(f"<code>{esc(k)}={esc(_fmt_value(first.get(k)))}</code>" for k in other_params)
                      + "</p>")
    figures = _metric_figures(index)
    plots = "".join(f"<div class='fig'>{d}</div>" for d in figures) or \
        "<p class='muted'>No plots: needs ok runs, numeric metrics and at least one parameter that varies.</p>"
    plotly_js = ""
    if figures:
        from plotly.offline import get_plotlyjs
        plotly_js = f"<script type='text/javascript'>{get_plotlyjs()}</script>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>sweep {esc(index['sweep'])}</title>
<style>{_PAGE_CSS}</style>{plotly_js}</head><body>
<h1>Sweep <code>{esc(index['sweep'])}</code></h1>
<p class="muted">notebook <code>{esc(str(index.get('notebook') or ''))}</code> · generated {esc(index['generated_at'])} ·
{c['total']} runs: <span class="badge ok">{c['ok']} ok</span> <span class="badge failed">{c['failed']} failed</span>
<span class="badge incomplete">{c['incomplete'] + c['pending']} incomplete/pending</span> ·
<a href="index.json">index.json</a></p>
{fixed_html}
<h2>Runs</h2>
<div class="scroll"><table class="runs"><thead><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr></thead>
<tbody>{''.join(body_rows)}</tbody></table></div>
<p class="muted">Metrics are the numeric values under <code>summary["metrics"]</code> of each run (definitions:
<code>rookworld_debug.metrics.GLOSSARY</code>); click a column to sort.</p>
{_all_metrics_table(index)}
<h2>Metrics vs parameters</h2>
{plots}
<script>{_SORT_JS}</script>
</body></html>
"""


def write_index(sweep_dir, *, current: Sequence[Mapping] | None = None, grid: Mapping | None = None,
                notebook=None) -> dict:
    """Build the index (see :func:`build_index`) and write index.json and index.html atomically."""
    index = build_index(sweep_dir, current=current, grid=grid, notebook=notebook)
    atomic_write_json(Path(sweep_dir) / "index.json", index)
    atomic_write_text(Path(sweep_dir) / "index.html", _index_html(index))
    return index
