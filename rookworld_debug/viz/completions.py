"""The completions table: one row per sampled completion, the whole group side by side — the completion
with visible whitespace, the parsed fields, every reward component and the total, the engine / dataset
reference, the advantage, the length and EOS/truncation, the format flags. The table TRL/W&B users read
first. Click a column header to sort (inline handler, works in JupyterLab and the offline report).

Filters (`group=`, `failures_only=`, `top=`/`bottom=` by advantage) select rows; nothing is recomputed:
every number comes from the Rollout / Rewards / Advantages records.
"""
from __future__ import annotations

import html
import math
from typing import Any, Sequence

from ._style import FONT_MONO, fmt, signed_cell_css, stable_id, to_numpy, visible_ws_html
from .htmlview import HTMLView

__all__ = ["completion_name", "completions_rows", "completions_table", "completions_table_from_trace"]

_SORT_JS = ("(function(th){var t=th.closest('table'),b=t.tBodies[0],i=[].indexOf.call(th.parentNode.children,th),"
            "d=th.dataset.dir==='a'?'d':'a';th.dataset.dir=d;var rs=[].slice.call(b.rows);rs.sort(function(x,y){"
            "var p=x.cells[i].dataset.v,q=y.cells[i].dataset.v,u=parseFloat(p),w=parseFloat(q);"
            "var c=(!isNaN(u)&&!isNaN(w))?u-w:String(p).localeCompare(String(q));return d==='a'?c:-c});"
            "rs.forEach(function(r){b.appendChild(r)})})(this)")


def completion_name(row: int, num_generations: int) -> str:
    """The one name of a completion everywhere: p<prompt>·g<generation> (TRL row order)."""
    return f"p{row // num_generations}·g{row % num_generations}"


def _fmt_list(xs: Any, n: int = 5) -> str:
    if not xs:
        return ""
    xs = list(xs)
    return " ".join(str(x) for x in xs[:n]) + (" …" if len(xs) > n else "")


def completions_rows(trace: Any, *, tiny_std_fraction: float | None = None) -> list[dict]:
    """One dict per completion from a StepTrace (or anything with rollout/rewards/advantages)."""
    from rookworld_debug.metrics import tiny_std_groups

    ro, rw, adv = trace.rollout, trace.rewards, trace.advantages
    g = int(adv.num_generations)
    frac = tiny_std_fraction if tiny_std_fraction is not None else \
        getattr(getattr(trace, "config", None), "tiny_std_fraction", 0.0)
    tiny = set(tiny_std_groups(adv.group_std, adv.batch_std, frac))
    lengths = to_numpy(ro.completion_mask).sum(1)
    trunc = to_numpy(ro.is_truncated, dtype=bool)
    a = to_numpy(adv.advantages)
    total = to_numpy(rw.rewards)
    comps = {k: to_numpy(v) for k, v in (rw.components or {}).items()}
    bds = list(rw.breakdowns or [None] * len(ro.completions))
    rows = []
    for i, text in enumerate(ro.completions):
        d = dict(getattr(bds[i], "details", {}) or {}) if bds[i] is not None else {}
        b = i // g
        group_note = "zero-σ" if b in set(adv.zero_std_groups) else ("tiny-σ" if b in tiny else "")
        flags = tuple(rw.flags[i] or ()) if rw.flags else ()
        if trunc[i]:
            flags = ("truncated",) + flags
        rows.append({
            "name": completion_name(i, g), "row": i, "group": b, "task": ro.tasks[i], "completion": text,
            "parsed_M": _fmt_list(d.get("moves")), "parsed_E": _fmt_list(d.get("evals")),
            "parsed_B": d.get("best") or d.get("predicted_fen") or "",
            "components": {k: float(v[i]) for k, v in comps.items()}, "reward": float(total[i]),
            "ref_moves": _fmt_list(d.get("sf_moves") or d.get("label_moves")),
            "ref_evals": _fmt_list([f"{s:+.2f}" if isinstance(s, (int, float)) else s for s in d.get("sf_scores") or []]),
            "label": d.get("label_best") or d.get("expected") or "",
            "advantage": float(a[i]), "group_mean": float(adv.group_mean[b]), "group_std": float(adv.group_std[b]),
            "group_note": group_note, "length": int(lengths[i]), "eos": not bool(trunc[i]),
            "format_ok": bool(rw.format_valid[i]) if rw.format_valid else True, "flags": flags,
        })
    return rows


def _select(rows: list[dict], group: int | None, failures_only: bool, top: int | None, bottom: int | None) -> list[dict]:
    if group is not None:
        rows = [r for r in rows if r["group"] == group]
    if failures_only:
        rows = [r for r in rows if not r["format_ok"] or r["flags"] or not math.isfinite(r["reward"])]
    if top or bottom:
        ranked = sorted(rows, key=lambda r: r["advantage"], reverse=True)
        rows = (ranked[:top] if top else []) + (ranked[-bottom:] if bottom else [])
    return rows


def _td(value: Any, shown_html: str, style: str = "", cls: str = "") -> str:
    """A cell: `value` is what sorting compares (data-v), `shown_html` is already escaped HTML."""
    v = "" if value is None else (f"{value:.9g}" if isinstance(value, float) else str(value))
    return (f'<td data-v="{html.escape(v, quote=True)}"{f" class={cls!r}" if cls else ""}'
            f'{f" style={style!r}" if style else ""}>{shown_html}</td>')


def completions_table(rows: Sequence[dict], *, group: int | None = None, failures_only: bool = False,
                      top: int | None = None, bottom: int | None = None,
                      batch_label: str = "rollout (sampled completions of this step)",
                      normalization: str = "") -> HTMLView:
    """Render `completions_rows(...)` as a sortable HTML table (see module docstring for the filters)."""
    rows = _select(list(rows), group, failures_only, top, bottom)
    comp_names = list(dict.fromkeys(k for r in rows for k in r["components"]))
    amax = max([abs(r["advantage"]) for r in rows if math.isfinite(r["advantage"])] or [0.0])
    head = ["completion", "group μ / σ", "text", "M (moves)", "E (evals)", "B (best)",
            *comp_names, "reward", "engine top moves", "engine evals", "label", "advantage", "len", "EOS",
            "format / flags"]
    th = "".join(f'<th onclick="{_SORT_JS}" title="click to sort">{html.escape(h)}</th>' for h in head)
    body = []
    for r in rows:
        note = f' <b style="color:#a40e26">{r["group_note"]}</b>' if r["group_note"] else ""
        flags = ", ".join(r["flags"])
        cells = [
            _td(r["row"], html.escape(r["name"])),
            _td(r["group_std"], f'μ {fmt(r["group_mean"])} / σ {fmt(r["group_std"])}{note}'),
            _td(r["completion"], f'<span style="font-family:{FONT_MONO};white-space:pre-wrap;word-break:break-all">'
                                 f'{visible_ws_html(r["completion"])}</span>', cls="txt"),
            _td(r["parsed_M"], html.escape(r["parsed_M"])), _td(r["parsed_E"], html.escape(r["parsed_E"])),
            _td(r["parsed_B"], html.escape(str(r["parsed_B"]))),
            *[_td(r["components"].get(k, math.nan),
                  "—" if math.isnan(r["components"].get(k, math.nan)) else fmt(r["components"][k])) for k in comp_names],
            _td(r["reward"], f"<b>{html.escape(fmt(r['reward']))}</b>"),
            _td(r["ref_moves"], html.escape(r["ref_moves"])), _td(r["ref_evals"], html.escape(r["ref_evals"])),
            _td(r["label"], html.escape(str(r["label"]))),
            _td(r["advantage"], html.escape(f"{r['advantage']:+.3f}"), style=signed_cell_css(r["advantage"], amax)),
            _td(r["length"], str(r["length"])), _td(int(r["eos"]), "EOS" if r["eos"] else "truncated"),
            _td(flags or ("ok" if r["format_ok"] else "bad"),
                html.escape(flags) if flags else ("ok" if r["format_ok"] else "format problem"),
                style="" if (r["format_ok"] and not flags) else "color:#a40e26;font-weight:600"),
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    sel = [f"group p{group}" if group is not None else "", "failures only" if failures_only else "",
           f"top {top} by advantage" if top else "", f"bottom {bottom} by advantage" if bottom else ""]
    sel_txt = ", ".join(s for s in sel if s) or "all rows"
    uid = stable_id("completions", sel_txt, len(rows), *(r["name"] for r in rows))
    caption = (f"<b>Completions</b> — batch: {html.escape(batch_label)}; {html.escape(sel_txt)} ({len(rows)} rows). "
               "M/E/B = fields parsed from the completion; reward columns = each component c_k (— = not applicable) "
               "and the weighted total Σ w_k·c_k; engine = Stockfish top moves/evals for the prompt position "
               "(label = the dataset's best move, or the expected A: output); advantage A_i "
               "(blue = positive: its tokens become more likely, orange = negative)"
               + (f"; {html.escape(normalization)}" if normalization else "")
               + "; len = completion tokens incl. EOS. Click a header to sort.")
    css = (f"#{uid}{{border-collapse:collapse;font-size:12px;font-family:system-ui,sans-serif}}"
           f"#{uid} th{{background:#f3f3f3;border:1px solid #ddd;padding:3px 6px;cursor:pointer;position:sticky;top:0;"
           f"text-align:left}}#{uid} td{{border:1px solid #e3e3e3;padding:3px 6px;vertical-align:top;white-space:nowrap}}"
           f"#{uid} td.txt{{max-width:36em;min-width:18em;white-space:normal}}")
    # the caption sits above the scrolling box, so it wraps to the visible width (a wide table scrolls alone)
    out = (f'<div class="rw-completions"><style>{css}</style>'
           f'<div style="font-size:12px;font-family:system-ui,sans-serif;margin:4px 0 6px">{caption}</div>'
           f'<div style="overflow-x:auto;max-width:100%"><table id="{uid}"><thead><tr>{th}</tr></thead>'
           f'<tbody>{"".join(body)}</tbody></table></div></div>')
    return HTMLView(out)


def completions_table_from_trace(trace: Any, **kw: Any) -> HTMLView:
    """`completions_table` over a StepTrace (filters: group=, failures_only=, top=, bottom=)."""
    frac = kw.pop("tiny_std_fraction", None)
    return completions_table(completions_rows(trace, tiny_std_fraction=frac),
                             normalization=getattr(trace.advantages, "normalization", ""), **kw)
