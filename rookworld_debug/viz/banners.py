"""Warning banners: one coloured HTML box listing what is off in a step (NaN, zero-std groups, all
completions truncated, empty completions, logp recompute mismatch, failed step-0 invariants…).

(Named `banners`, not `warnings`, so it never shadows the standard library module.)

`flags_from_records` collects flags from the records' own `flags`/`warnings` fields and from a few
cheap checks on recorded values (finiteness, truncation, empty text); it never recomputes GRPO math.
`warning_banner` renders any list of flags.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ._style import (FAIL_BG, FAIL_FG, FONT_SANS, INFO_BG, INFO_FG, PASS_BG, PASS_FG, WARN_BG, WARN_FG, fmt,
                     to_numpy, truncate, visible_ws_text)
from .htmlview import HTMLView

__all__ = ["Flag", "warning_banner", "flags_from_records", "SEVERITIES"]

SEVERITIES = ("error", "warning", "info")
_STYLE = {"error": (FAIL_BG, FAIL_FG, "✖"), "warning": (WARN_BG, WARN_FG, "⚠"), "info": (INFO_BG, INFO_FG, "ℹ")}


@dataclass(frozen=True)
class Flag:
    """One problem: a short code (for tests/filters), a sentence, a severity and where it was found."""
    code: str
    message: str
    severity: str = "warning"
    where: str = ""


def _as_flag(f: Any) -> Flag:
    if isinstance(f, Flag):
        return f
    if isinstance(f, str):
        return Flag("flag", f)
    if isinstance(f, Mapping):
        return Flag(str(f.get("code", "flag")), str(f.get("message", "")), str(f.get("severity", "warning")),
                    str(f.get("where", "")))
    if isinstance(f, (tuple, list)) and 2 <= len(f) <= 4:
        return Flag(*(str(x) for x in f))
    return Flag("flag", str(f))


def warning_banner(flags: Iterable[Any] | Mapping[str, str], *, title: str = "Checks for this step",
                   show_ok: bool = True) -> HTMLView:
    """Render flags (Flag, str, (code, message[, severity[, where]]), dict, or {code: message}) as one
    box coloured by the worst severity; errors first. No flags → a small green "all clear" line
    (show_ok=False → empty), so a reader knows the checks ran."""
    items = [Flag(k, v) for k, v in flags.items()] if isinstance(flags, Mapping) else [_as_flag(f) for f in flags]
    items = [f if f.severity in SEVERITIES else Flag(f.code, f.message, "warning", f.where) for f in items]
    items.sort(key=lambda f: SEVERITIES.index(f.severity))
    if not items:
        if not show_ok:
            return HTMLView("")
        return HTMLView(f'<div class="rw-banner rw-ok" role="status" style="font-family:{FONT_SANS};font-size:13px;'
                        f'background:{PASS_BG};color:{PASS_FG};border-left:5px solid {PASS_FG};padding:5px 10px;'
                        f'margin:4px 0">✓ {html.escape(title)}: no flags</div>')
    worst = items[0].severity
    bg, fg, icon = _STYLE[worst]
    counts = ", ".join(f"{sum(f.severity == s for f in items)} {s}{'s' if sum(f.severity == s for f in items) > 1 else ''}"
                       for s in SEVERITIES if any(f.severity == s for f in items))
    lis = []
    for f in items:
        b, c, i = _STYLE[f.severity]
        where = f' <span style="color:#555">({html.escape(f.where)})</span>' if f.where else ""
        lis.append(f'<li class="rw-flag rw-{f.severity}" data-code="{html.escape(f.code, quote=True)}" '
                   f'style="margin:2px 0;color:{c}"><span aria-hidden="true">{i}</span> '
                   f'<b>{html.escape(f.severity.upper())}</b> <code style="background:#ffffffaa;padding:0 3px;'
                   f'border-radius:3px">{html.escape(f.code)}</code> {html.escape(f.message)}{where}</li>')
    return HTMLView(f'<div class="rw-banner rw-{worst}" role="alert" style="font-family:{FONT_SANS};font-size:13px;'
                    f'background:{bg};color:{fg};border-left:6px solid {fg};padding:6px 12px;margin:4px 0">'
                    f'<div style="font-weight:700">{icon} {html.escape(title)}: {counts}</div>'
                    f'<ul style="margin:4px 0 2px 0;padding-left:1.4em;list-style:none">{"".join(lis)}</ul></div>')


# ----------------------------------------------------------------------------------------- collection
def _nonfinite(name: str, x: Any, mask: Any = None) -> Flag | None:
    if x is None:
        return None
    a = to_numpy(x, dtype=float)
    bad = ~np.isfinite(a)
    if mask is not None:
        m = to_numpy(mask, dtype=bool)
        if m.shape == a.shape:
            bad &= m
    n = int(bad.sum())
    if not n:
        return None
    rows = sorted({int(i) for i in np.nonzero(bad)[0]}) if a.ndim >= 1 else []
    return Flag("nan", f"{n} NaN/inf value(s) in {name}", "error",
                f"rows {rows[:12]}{'…' if len(rows) > 12 else ''}" if rows else "scalar")


def _record_flags(source: str, record: Any, attr: str, skip: Sequence[str] = ()) -> list[Flag]:
    out = []
    for msg in getattr(record, attr, ()) or ():
        if any(s in str(msg) for s in skip):
            continue
        out.append(Flag(f"{source}", str(msg), "warning", f"{source}.{attr}"))
    return out


def flags_from_records(*, rollout: Any = None, advantages: Any = None, loss: Any = None, setup: Any = None,
                       update: Any = None, max_examples: int = 4, record_flags: bool = True) -> list[Flag]:
    """Flags for a step from its records (any may be None). Structured checks first, then (record_flags)
    the records' own human-readable flags. Field names follow grpo/* (Rollout, Advantages, LossBreakdown,
    Setup, UpdateResult)."""
    flags: list[Flag] = []
    mask = getattr(rollout, "completion_mask", None) if rollout is not None else None
    if rollout is not None:
        for name in ("per_token_logps", "ref_per_token_logps", "per_token_entropy", "per_token_full_kl"):
            f = _nonfinite(f"rollout.{name}", getattr(rollout, name, None), mask)
            if f:
                flags.append(f)
        trunc = getattr(rollout, "is_truncated", None)
        if trunc is not None:
            t = to_numpy(trunc, dtype=bool).ravel()
            if t.size and t.all():
                flags.append(Flag("all_truncated", f"all {t.size} completions hit max_new_tokens without EOS "
                                  "(raise max_new_tokens; EOS is never trained)", "warning", "rollout.is_truncated"))
            elif t.any():
                flags.append(Flag("truncated", f"{int(t.sum())} of {t.size} completions truncated (no EOS)", "info",
                                  f"rows {np.nonzero(t)[0].tolist()[:12]}"))
        comps = getattr(rollout, "completions", None)
        empty = [i for i, c in enumerate(comps or ()) if not str(c).strip()]
        if mask is not None:
            lens = to_numpy(mask, dtype=float).sum(axis=-1)
            empty = sorted(set(empty) | {int(i) for i in np.nonzero(lens == 0)[0]})
        if empty:
            flags.append(Flag("empty_completion", f"{len(empty)} empty completion(s) (no text or no unmasked token)",
                              "warning", f"rows {empty[:12]}"))
        if getattr(rollout, "logp_diff_flagged", False):
            flags.append(Flag("recompute_mismatch", "log-probs seen while sampling differ from the recomputed ones by "
                              f"up to {fmt(getattr(rollout, 'max_abs_logp_diff', math.nan))} nats: check padding side, "
                              "temperature scaling and dtype", "error", "rollout.max_abs_logp_diff"))
        if record_flags:
            flags += _record_flags("rollout", rollout, "warnings")
    if advantages is not None:
        zero = list(getattr(advantages, "zero_std_groups", ()) or ())
        if zero:
            G = int(getattr(advantages, "num_generations", 1))
            r = to_numpy(getattr(advantages, "rewards"), dtype=float).ravel() if hasattr(advantages, "rewards") else None
            prompts = list(getattr(rollout, "prompts", ()) or ()) if rollout is not None else []
            B = int(getattr(advantages, "B", 0) or (len(r) // G if r is not None else 0))
            examples = []
            for b in zero[:max_examples]:
                p = truncate(visible_ws_text(str(prompts[b * G]).strip()), 40) if len(prompts) > b * G else f"group {b}"
                rv = "[" + ", ".join(fmt(v) for v in r[b * G:(b + 1) * G]) + "]" if r is not None else ""
                examples.append(f"#{b} {p} rewards {rv}")
            more = f" (+{len(zero) - max_examples} more)" if len(zero) > max_examples else ""
            sev = "error" if B and len(zero) == B else "warning"
            what = "every group" if B and len(zero) == B else f"{len(zero)} of {B} groups"
            flags.append(Flag("zero_std", f"{what} with zero reward std → advantages 0, no policy-gradient signal: "
                              + "; ".join(examples) + more, sev, "advantages.zero_std_groups"))
        # the record's own zero-std sentence is replaced by the richer one above
        if record_flags:
            flags += _record_flags("advantages", advantages, "flags", skip=("zero reward std",))
    if loss is not None:
        for name in ("loss", "pg_loss", "kl_loss", "entropy_term"):
            f = _nonfinite(f"loss.{name}", getattr(loss, name, None))
            if f:
                flags.append(f)
        if record_flags:
            flags += _record_flags("loss", loss, "flags")
    if setup is not None:
        prov = getattr(setup, "provenance", None)
        # what was loaded, when it is not what the user may think (random init, stock-tokenizer fallback)
        for note in (prov.get("notes", ()) if isinstance(prov, Mapping) else getattr(prov, "notes", ())) or ():
            flags.append(Flag("provenance", str(note), "warning", "setup.provenance.notes"))
        inv = getattr(setup, "invariants", None)
        if inv is not None and not getattr(inv, "ok", True):
            for reason in getattr(inv, "failures", ()) or ("step-0 invariants failed",):
                flags.append(Flag("invariant", str(reason), "error", "setup.invariants"))
    if update is not None:
        for name in ("grad_norm_pre_clip", "loss"):
            v = getattr(update, name, None)
            if v is not None and not math.isfinite(float(v)):
                flags.append(Flag("nan", f"update.{name} is {v}", "error", "update"))
        if record_flags:
            flags += _record_flags("update", update, "flags")
    return flags
