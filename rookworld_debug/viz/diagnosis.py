"""The Diagnosis card: the top findings of a step or a run, each with its cause, evidence and fix.

Renders `diagnosis.Finding` records or their `to_dict()` form (what triage.json and captures.json hold), so the
same card shows a live step, a saved trace and a run's triage page. Every value is escaped; the card is
self-contained HTML (inline CSS, no script), readable offline.
"""
from __future__ import annotations

import html
import math
from typing import Any, Iterable

from ._style import FAIL_BG, FAIL_FG, FONT_SANS, INFO_BG, INFO_FG, PASS_BG, PASS_FG, WARN_BG, WARN_FG
from .htmlview import HTMLView

__all__ = ["diagnosis_card", "diagnosis_card_from_trace"]

_STYLE = {"error": (FAIL_BG, FAIL_FG, "✖"), "warning": (WARN_BG, WARN_FG, "⚠"), "info": (INFO_BG, INFO_FG, "ℹ")}
_E = html.escape


def _d(f: Any) -> dict:
    """A finding as the card reads it: a Finding's to_dict, or a file's dict read through Finding's closed schema;
    one that does not fit is shown as a flagged item naming why (never dropped, never shown half-read)."""
    from rookworld_debug.diagnosis.findings import Finding
    from rookworld_debug.errors import DataError
    if isinstance(f, Finding):
        return f.to_dict()
    try:
        return Finding.from_dict(f).to_dict()
    except DataError as err:
        return {"code": "unreadable_finding", "title": "unreadable finding", "severity": "warning",
                "cause": f"This finding could not be read: {err}", "evidence": [], "fix": {}, "alternatives": []}


def _v(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return _E(str(x))
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def _fix(fix: dict) -> str:
    changes = [f"StepConfig.{k} = {v!r}" for k, v in (fix.get("step_config") or {}).items()]
    changes += [f"GRPOConfig.{k} = {v!r}" for k, v in (fix.get("grpo_config") or {}).items()]
    out = f'<div><b>Fix:</b> {_E(str(fix.get("description", "")))}'
    if changes:
        out += " " + " ".join(f'<code style="background:#ffffffcc;padding:0 3px">{_E(c)}</code>' for c in changes)
    if fix.get("code_change"):
        out += f'<br><i>code:</i> {_E(str(fix["code_change"]))}'
    return out + "</div>"


def _item(f: dict, evidence: int) -> str:
    bg, fg, icon = _STYLE.get(f.get("severity"), _STYLE["warning"])
    step = f' · step {_E(str(f["step"]))}' if f.get("step") is not None else ""
    rows = "".join(
        f'<tr><td style="padding:1px 6px"><code>{_E(str(e.get("name", "")))}</code></td>'
        f'<td style="padding:1px 6px;text-align:right;font-variant-numeric:tabular-nums">{_v(e.get("value"))}</td>'
        f'<td style="padding:1px 6px">{_E(str(e.get("definition", "")))}</td>'
        f'<td style="padding:1px 6px;color:#555">{_E(str(e.get("batch", "")))}'
        f'{(" · " + _E(str(e["where"]))) if e.get("where") else ""}</td></tr>'
        for e in (f.get("evidence") or [])[:evidence])
    alts = [a for a in (f.get("alternatives") or []) if a]
    return (f'<div class="rw-finding rw-{_E(str(f.get("severity")))}" data-code="{_E(str(f.get("code")), quote=True)}" '
            f'style="background:{bg};color:{fg};border-left:6px solid {fg};padding:6px 10px;margin:6px 0">'
            f'<div style="font-weight:700">{icon} {_E(str(f.get("severity", "")).upper())} — '
            f'{_E(str(f.get("title") or f.get("code")))} <code style="font-weight:400">{_E(str(f.get("code")))}</code>'
            f'<span style="font-weight:400">{step}</span></div>'
            f'<div style="margin:3px 0"><b>Cause:</b> {_E(str(f.get("cause", "")))}</div>'
            + (f'<table style="border-collapse:collapse;font-size:12px;color:#222;margin:2px 0">'
               f'<tr><th colspan="4" style="text-align:left;padding:1px 6px">Evidence</th></tr>{rows}</table>'
               if rows else "")
            + _fix(f.get("fix") or {})
            + (f'<div style="color:#444"><b>Could also be:</b> {_E("; ".join(alts))}</div>' if alts else "")
            + "</div>")


def diagnosis_card(findings: Iterable[Any], *, title: str = "Diagnosis", limit: int = 5, evidence: int = 4,
                   notes: bool = False) -> HTMLView:
    """The top `limit` findings (ranked most likely first), or a green line when no check found anything.
    `notes=False` leaves out the info-level phase notes (they stay in the step log)."""
    items = [_d(f) for f in findings]
    items = [f for f in items if notes or not (f.get("code") == "phase_note" and f.get("severity") == "info")]
    head = f'font-family:{FONT_SANS};font-size:13px;margin:6px 0'
    if not items:
        return HTMLView(f'<div class="rw-diagnosis rw-ok" style="{head};background:{PASS_BG};color:{PASS_FG};'
                        f'border-left:5px solid {PASS_FG};padding:6px 10px">✓ {_E(title)}: no check found a problem '
                        "in these records</div>")
    n_err = sum(f.get("severity") == "error" for f in items)
    more = f" (showing {limit} of {len(items)})" if len(items) > limit else ""
    return HTMLView(f'<section class="rw-diagnosis" aria-label="{_E(title, quote=True)}" style="{head}">'
                    f'<div style="font-size:15px;font-weight:700;margin-bottom:2px">{_E(title)}: {len(items)} '
                    f'finding(s), {n_err} error-level{_E(more)}, most likely first</div>'
                    + "".join(_item(f, evidence) for f in items[:limit]) + "</section>")


def diagnosis_card_from_trace(trace: Any, folder: Any = None, *, replay: bool = True, **kw) -> HTMLView:
    """The card of `diagnosis.diagnose_step(trace, folder)`: the findings `rookworld-debug diagnose` prints for the
    step, its replay included (`folder`: where a recorded step keeps its weights)."""
    from rookworld_debug.diagnosis import diagnose_step
    return diagnosis_card(diagnose_step(trace, folder, replay=replay)[0], **kw)
