"""Findings as plain text (the `diagnose` command, the step log)."""
from __future__ import annotations

import math

ICON = {"error": "✖", "warning": "▲", "info": "·"}


def _val(v: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    return f"{v:.4g}"


def format_finding(f, *, evidence: int = 4) -> list[str]:
    step = f" (step {f.step})" if f.step is not None else ""
    out = [f"{ICON.get(f.severity, '?')} {f.severity.upper()} {f.code}{step}: {f.title}", f"    cause: {f.cause}"]
    for e in f.evidence[:evidence]:
        where = f" [{e.where}]" if e.where else ""
        out.append(f"    evidence: {e.name} = {_val(e.value)} — {e.definition} ({e.batch}){where}")
    fix = f.fix
    changes = {**{f"StepConfig.{k}": v for k, v in fix.step_config.items()},
               **{f"GRPOConfig.{k}": v for k, v in fix.grpo_config.items()}}
    line = f"    fix: {fix.description}"
    if changes:
        line += " (" + ", ".join(f"{k}={v!r}" for k, v in changes.items()) + ")"
    out.append(line)
    if fix.code_change:
        out.append(f"    code: {fix.code_change}")
    alts = [a for a in f.alternatives if a]
    if alts:
        out.append("    could also be: " + "; ".join(alts))
    return out


def format_findings(findings, *, limit: int | None = None, notes: bool = False) -> str:
    """Ranked findings, most likely first; `notes=False` hides the info-level phase notes."""
    shown = [f for f in findings if notes or f.code != "phase_note" or f.severity != "info"]
    if not shown:
        return "no findings: no check found a problem in these records"
    shown = shown[:limit] if limit else shown
    return "\n".join(line for f in shown for line in format_finding(f))
