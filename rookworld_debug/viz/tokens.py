"""Token strips: completions drawn token by token, coloured by one per-token metric.

Self-contained HTML (inline CSS, no script, no CDN), so a strip looks the same in JupyterLab, in an
nbconvert/papermill HTML export and in a saved file. Hover uses the `title` attribute (works without
JavaScript and survives JupyterLab's HTML sanitizer).

What a strip shows, per token:
- the token rendered from its bytes by `token_text` (the one renderer: strips, tooltips, top-k lists,
  tables and plot hovers): whole UTF-8 characters as themselves, visible whitespace (`␣` space, `⏎`
  newline, `⇥` tab, control pictures), invisible characters named (`⟨SHY⟩`), bytes of an incomplete
  UTF-8 character as `⟨C3⟩`. The P: padding is ~30–40 real single-space tokens the model generates
  and is trained on, so it must be seen;
- `<|endoftext|>` as a `⟂ EOS` chip (EOS is part of the completion mask);
- background colour by the chosen metric: diverging for signed metrics in ONE colour language, blue =
  the step makes this token more likely / lowers the loss (so a negative per-token loss is blue), the
  ratio on log scale centred at r = 1 (blue r > 1), sequential (white → purple) for logp/KL/entropy;
- masked tokens (not in the loss) greyed with a dashed border, clipped tokens outlined in magenta,
  NaN/inf striped red;
- hover: position, token id, the exact value of every metric passed in, and the top-k alternatives.

Views never compute GRPO math: values come from the records; the only arithmetic here is colour
scaling (and the one labelled display product A·logp in the adapter).
"""
from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from html import escape as html_escape
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ._style import (EOS_STRINGS, FONT_MONO, FONT_SANS, HIGHLIGHT, MASKED_BG, MASKED_FG, NAN_BG, OUTLINE, attr,
                     diverging_rgb, fmt, fmt_exact, fmt_signed, hex_rgb, text_on, visible_char)
from .htmlview import HTMLView
from .token_scale import METRICS, ColorScale, Metric, _resolve_metric, make_scale

__all__ = ["Metric", "METRICS", "TokenStrip", "token_strip", "token_strips", "token_metric_stack",
           "ColorScale", "make_scale", "display_token", "TokenText", "token_text", "token_text_from_raw"]


# ----------------------------------------------------------------------------------------- tokens
_SPECIAL_RE = re.compile(r"<\|[^|<>]{1,40}\|>\Z")


@dataclass(frozen=True)
class TokenText:
    """One token as every view shows it, rendered from its BYTES (the one renderer of the package).

    label: plain text, visible and unambiguous: 'é', '␣M' (space), '⏎', '⟨C3⟩' (a byte that is only part
    of a UTF-8 character), '⟨SHY⟩' (an invisible character, named), '<|endoftext|>' (special).
    parts: (kind, text) pieces of the label; kind "text", "ws" (a glyph standing for whitespace or an
    invisible character), "byte" (an incomplete UTF-8 byte) or "special".
    data: the token's bytes (None for a special token); note: tooltip remark (incomplete UTF-8, names).
    """
    label: str
    parts: tuple[tuple[str, str], ...]
    data: bytes | None
    note: str = ""

    @property
    def special(self) -> bool:
        return self.data is None

    @property
    def complete(self) -> bool:
        """Valid UTF-8 on its own (a special token counts as complete)."""
        return not any(k == "byte" for k, _ in self.parts)

    @property
    def text(self) -> str:
        """Decoded text (special: its name; incomplete bytes: U+FFFD), for search and comparisons."""
        return self.label if self.data is None else self.data.decode("utf-8", errors="replace")

    def html(self) -> str:
        """Escaped HTML: glyphs faded (so '␣' for a space differs from text), bytes boxed, EOS as a chip."""
        if self.special:
            name = "⟂ EOS" if self.label in EOS_STRINGS else self.label[2:-2]
            return ('<span class="rw-chip" style="font-size:10px;font-weight:600;padding:0 3px;'
                    f'border-radius:3px;border:1px solid #555;background:#fafafa;color:#222">{html_escape(name)}</span>')
        out = []
        for kind, txt in self.parts:
            if kind == "ws":
                out.append(f'<span class="rw-ws" style="opacity:.55">{html_escape(txt)}</span>')
            elif kind == "byte":
                out.append(f'<span class="rw-byte" style="font-size:85%;border:1px dotted currentColor;'
                           f'border-radius:2px;padding:0 1px">{html_escape(txt)}</span>')
            else:
                out.append(html_escape(txt))
        return "".join(out)

    def __str__(self) -> str:
        return self.label


@lru_cache(maxsize=1 << 17)
def _render_bytes(data: bytes) -> TokenText:
    # surrogateescape: each byte that is not part of a complete UTF-8 character becomes U+DC80..U+DCFF
    decoded = data.decode("utf-8", errors="surrogateescape")
    parts: list[tuple[str, str]] = []
    n_bytes, named = 0, []
    for ch in decoded:
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            parts.append(("byte", f"⟨{ord(ch) - 0xDC00:02X}⟩"))
            n_bytes += 1
            continue
        kind, txt = visible_char(ch)
        if txt.startswith("⟨"):
            named.append(f"{txt} = U+{ord(ch):04X} {unicodedata.name(ch, '(unnamed)')}")
        parts.append((kind, txt))
    merged: list[tuple[str, str]] = []
    for kind, txt in parts:                                          # adjacent same-kind pieces → one span
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + txt)
        else:
            merged.append((kind, txt))
    notes = []
    if n_bytes:
        notes.append(f"incomplete UTF-8: {n_bytes} byte(s) shown as ⟨XX⟩ are part of a character that "
                     "continues in a neighbouring token")
    notes.extend(named)
    label = "".join(t for _, t in merged) or "∅"
    return TokenText(label, tuple(merged) or (("ws", "∅"),), data, "; ".join(notes) if not data == b"" else "empty token")


def token_text(tok: "TokenText | bytes | str") -> TokenText:
    """The renderer. bytes: a token's exact bytes; str: decoded text (its UTF-8), or a special token
    '<|…|>'; a TokenText is returned unchanged. Byte-level vocab strings ('ĠM') go through
    `token_text_from_raw` instead."""
    if isinstance(tok, TokenText):
        return tok
    if isinstance(tok, (bytes, bytearray)):
        return _render_bytes(bytes(tok))
    tok = str(tok)
    if tok in EOS_STRINGS or _SPECIAL_RE.match(tok):
        return TokenText(tok, (("special", tok),), None, "special token")
    return _render_bytes(tok.encode("utf-8", errors="surrogatepass"))


@lru_cache(maxsize=1 << 17)
def _from_raw(raw: str) -> TokenText:
    if raw in EOS_STRINGS or _SPECIAL_RE.match(raw):
        return token_text(raw)
    from rookworld_debug.models.tokenizer import byte_level_bytes
    data = byte_level_bytes(raw)
    return token_text(raw if data is None else data)


def token_text_from_raw(raw: str) -> TokenText:
    """A token string as recorded in a Rollout (models.tokenizer.token_strings): byte-level ('ĠM', 'Ã©'),
    special ('<|endoftext|>') or, for records made by other code, plain text (' M')."""
    return _from_raw(str(raw))        # cached: a strip asks for the same few thousand ids again and again


def display_token(tok: "TokenText | bytes | str") -> str:
    """HTML for one token (see TokenText.html)."""
    return token_text(tok).html()


def _quote_tok(tok: "TokenText | bytes | str") -> str:
    """Token label for a tooltip (plain text), quoted; specials unquoted."""
    tt = token_text(tok)
    if tt.special:
        return ("⟂ EOS " if tt.label in EOS_STRINGS else "special ") + tt.label
    return "'" + tt.label + "'"


_CSS = (
    "<style>"
    f".rw-view{{font-family:{FONT_SANS};font-size:13px;color:#111;margin:4px 0 8px 0;line-height:1.45}}"
    ".rw-title{font-weight:600;margin:2px 0 4px 0}"
    ".rw-row{display:flex;align-items:flex-start;gap:10px;margin:3px 0}"
    ".rw-lab{flex:0 0 13em;font-size:12px;color:#222;overflow-wrap:anywhere}"
    f".rw-toks{{flex:1 1 auto;font-family:{FONT_MONO};font-size:12.5px;line-height:1.9}}"
    ".rw-tok{display:inline-block;white-space:pre;padding:0 2px;margin:1px 1px;border-radius:3px;"
    "border:1px solid rgba(0,0,0,.10);cursor:default}"
    ".rw-tok:hover{box-shadow:0 0 0 2px #000}"
    ".rw-legend{font-size:11.5px;color:#333;margin:4px 0 0 0;display:flex;flex-wrap:wrap;gap:6px 16px;"
    "align-items:center}"
    ".rw-bar{display:inline-block;width:160px;height:10px;border:1px solid #999;vertical-align:middle}"
    ".rw-def{flex-basis:100%;color:#444}"
    "</style>"
)


@dataclass(frozen=True, repr=False)
class TokenStrip(HTMLView):
    """HTML of one or more token strips; `metric` and `n_tokens` are kept for tests and callers."""
    metric: str = ""
    n_tokens: int = 0
    n_rows: int = 0

    def __repr__(self) -> str:
        return f"TokenStrip(metric={self.metric!r}, rows={self.n_rows}, tokens={self.n_tokens})"


@dataclass
class _Row:
    tokens: list[TokenText]
    values: np.ndarray
    label: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)
    mask: list[bool] | None = None
    outline: list[Any] | None = None
    hover: list[Mapping[str, Any]] | None = None
    topk: list[Sequence[tuple]] | None = None   # per token [(token, logp) or (token, logp, id), …]
    token_ids: list[int] | None = None
    joins: list[str] | None = None     # per token: characters its incomplete bytes spell with its neighbours
    highlight: list[Any] | None = None    # per token: falsy, True, or what the highlight says there (tooltip)
    highlight_label: str = "highlighted"  # what a highlight means (legend and tooltip)


def _joined_chars(tokens: Sequence[TokenText]) -> list[str]:
    """Per token, the characters that its incomplete UTF-8 bytes form together with neighbouring tokens
    (GPT-2 splits 'д' as ⟨D0⟩ + ⟨B4⟩ across two tokens): '' where a token holds whole characters only."""
    out = [""] * len(tokens)
    if all(t.complete for t in tokens):
        return out
    owner = [t for t, tok in enumerate(tokens) for _ in range(len(tok.data or b""))]   # byte → token
    data = b"".join(tok.data or b"" for tok in tokens)
    i = 0
    while i < len(data):
        b = data[i]
        n = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF8 else 1
        try:
            ch = data[i:i + n].decode("utf-8") if n > 1 else ""
        except UnicodeDecodeError:
            ch, n = "", 1
        if ch and owner[i] != owner[i + n - 1]:                 # a character split across tokens
            name = unicodedata.name(ch, "")
            for t in sorted(set(owner[i:i + n])):
                out[t] += ("; " if out[t] else "") + f"'{ch}' U+{ord(ch):04X}{' ' + name if name else ''}"
        i += n
    return out


def _check_len(name: str, seq: Sequence | None, n: int, row: int | None = None) -> None:
    if seq is not None and len(seq) != n:
        where = "" if row is None else f" (row {row})"
        raise ValueError(f"{name} has {len(seq)} entries but there are {n} tokens{where}")


def _values(values: Any) -> np.ndarray:
    from ._style import to_numpy
    return to_numpy(values, dtype=float).ravel()


def _tooltip(row: _Row, t: int, metric: Metric, outline_label: str) -> str:
    tok = row.tokens[t]
    tid = int(row.token_ids[t]) if row.token_ids is not None else None
    head = f"t={t} · {_quote_tok(tok)}" + (f" (id {tid})" if tid is not None else "")
    lines = [head]
    if tok.data is not None and (not tok.data.isascii() or tok.note):
        lines.append("bytes " + tok.data.hex(" ").upper() + (f" · {tok.note}" if tok.note else ""))
    if row.joins and row.joins[t]:
        lines.append(f"with the neighbouring token(s) these bytes spell {row.joins[t]}")
    lines.append(f"{metric.name} = {fmt_exact(row.values[t])}" + (f" {metric.unit}" if metric.unit else ""))
    if row.hover is not None:
        for k, v in row.hover[t].items():
            if k == metric.key or k == metric.name:
                continue
            lines.append(f"{k} = {fmt_exact(v) if not isinstance(v, str) else v}")
    if row.mask is not None and not row.mask[t]:
        lines.append("masked: not in the loss (completion_mask = 0)")
    if row.outline is not None and row.outline[t]:
        o = row.outline[t]
        lines.append(f"{outline_label}: {o}" if isinstance(o, str) else outline_label)
    if row.highlight is not None and row.highlight[t]:
        h = row.highlight[t]
        lines.append(f"{row.highlight_label}: {h}" if isinstance(h, str) else row.highlight_label)
    if row.topk is not None and row.topk[t]:
        lines.append("top-k alternatives (token, logp):")
        for r, (alt, lp, *alt_id) in enumerate(row.topk[t], 1):
            # the same token is the same id; labels only when a caller gave no ids
            same = (int(alt_id[0]) == tid) if alt_id and tid is not None else token_text(alt).label == tok.label
            lines.append(f"  {r}. {_quote_tok(alt)}{f' (id {int(alt_id[0])})' if alt_id else ''}  {fmt(lp, 4)}"
                         + ("  ← sampled" if same else ""))
    return "\n".join(lines)


def _token_span(row: _Row, t: int, metric: Metric, scale: ColorScale, outline_label: str) -> str:
    v = float(row.values[t])
    masked = row.mask is not None and not row.mask[t]
    styles = []
    if masked:
        styles.append(f"background:{MASKED_BG};color:{MASKED_FG};border:1px dashed #a0a0a0")
    else:
        rgb = scale.rgb(v)
        styles.append(f"background:{NAN_BG};color:#000000" if rgb is None
                      else f"background:{hex_rgb(rgb)};color:{text_on(rgb)}")
    if row.outline is not None and row.outline[t]:
        styles.append(f"outline:2px solid {OUTLINE};outline-offset:0")
    lit = row.highlight is not None and bool(row.highlight[t])
    if lit:                     # black underline + ring: apart from the magenta clip outline and the scales
        styles.append(f"border-bottom:3px solid {HIGHLIGHT};box-shadow:0 0 0 1px {HIGHLIGHT}")
    cls = ("rw-tok" + (" rw-masked" if masked else "") + (" rw-out" if row.outline is not None and row.outline[t] else "")
           + (" rw-hl" if lit else ""))
    return (f'<span class="{cls}" data-t="{t}" style="{";".join(styles)}" '
            f'title="{attr(_tooltip(row, t, metric, outline_label))}">{row.tokens[t].html()}</span>'
            + ("<br>" if (row.tokens[t].data or b"").endswith(b"\n") else ""))  # keep the text's line structure


def _legend(metric: Metric, scale: ColorScale, *, any_masked: bool, any_outline: bool, any_nan: bool,
            outline_label: str, note: str = "", highlight_label: str = "") -> str:
    lo, mid, hi = scale.ticks()
    if scale.kind == "signed":
        white = "white = 0" + ("; every value is 0" if scale.hi == scale.lo else "")
    elif scale.kind == "ratio":
        white = "white = ratio 1; log scale" + ("; every ratio is 1" if scale.hi == scale.lo else "")
    else:
        white = f"white = {fmt(scale.hi if scale.neutral == 'high' else scale.lo, 3)}"
        if metric.clamp_lo is not None and scale.lo == metric.clamp_lo:
            white += f"; values below {fmt(metric.clamp_lo)} drawn as {fmt(metric.clamp_lo)}"
    parts = [
        f'<span><b>{attr(metric.name)}</b>{" [" + attr(metric.unit) + "]" if metric.unit else ""}</span>',
        f'<span>{attr(lo)} <span class="rw-bar" style="background:{scale.gradient_css()}"></span> {attr(hi)}'
        f' <span style="color:#666">({attr(white)})</span></span>',
    ]
    if scale.kind in ("signed", "ratio"):     # the one colour language, said in words
        words = metric.meaning or ("blue = negative · orange = positive" if scale.flip else
                                   "blue = positive · orange = negative")
        parts.append(f'<span class="rw-meaning">{attr(words)}</span>')
    if any_masked:
        parts.append(f'<span><span class="rw-tok" style="background:{MASKED_BG};color:{MASKED_FG};'
                     'border:1px dashed #a0a0a0">tok</span> masked (not in loss)</span>')
    if any_outline:
        parts.append(f'<span><span class="rw-tok" style="outline:2px solid {OUTLINE}">tok</span> '
                     f'{attr(outline_label)}</span>')
    if any_nan:
        parts.append(f'<span><span class="rw-tok" style="background:{NAN_BG}">tok</span> NaN/inf</span>')
    if highlight_label:
        parts.append(f'<span><span class="rw-tok" style="border-bottom:3px solid {HIGHLIGHT};box-shadow:0 0 0 1px '
                     f'{HIGHLIGHT}">tok</span> {attr(highlight_label)}</span>')
    if scale.basis:
        parts.append(f'<span class="rw-basis" style="color:#444">{attr(scale.basis)}</span>')
    parts.append('<span style="color:#666">hover a token for exact values and top-k</span>')
    parts.append(f'<span class="rw-def">{attr(metric.definition)}{(" " + attr(note)) if note else ""}</span>')
    return '<div class="rw-legend">' + "".join(parts) + "</div>"


def _row_label(row: _Row, adv_half: float) -> str:
    bits = [f"<b>{attr(row.label)}</b>"] if row.label else []
    for k, v in row.info.items():
        txt = fmt_signed(v) if "adv" in k.lower() and not isinstance(v, str) else (v if isinstance(v, str) else fmt(v))
        style = ""
        if "adv" in k.lower() and not isinstance(v, str):
            rgb = diverging_rgb(0.0 if adv_half == 0 or not math.isfinite(float(v)) else float(v) / adv_half)
            style = f' style="background:{hex_rgb(rgb)};color:{text_on(rgb)};padding:0 3px;border-radius:3px"'
        bits.append(f"<span{style}>{attr(k)} {attr(txt)}</span>")
    return '<div class="rw-lab">' + "<br>".join(bits) + "</div>"


def _render(rows: list[_Row], metric: Metric, scale: ColorScale, *, title: str, outline_label: str,
            note: str = "", show_labels: bool = True, adv_half: float | None = None) -> str:
    if adv_half is None:            # the advantage chips' own scale: the shown rows (unless the caller pins it)
        adv = [float(v) for r in rows for k, v in r.info.items()
               if "adv" in k.lower() and not isinstance(v, str) and math.isfinite(float(v))]
        adv_half = max((abs(a) for a in adv), default=0.0)
    out = [f'<div class="rw-view rw-strips" data-metric="{attr(metric.key)}">', _CSS]
    if title:
        out.append(f'<div class="rw-title">{attr(title)}</div>')
    for row in rows:
        row.joins = _joined_chars(row.tokens)
        out.append('<div class="rw-row">')
        if show_labels:
            out.append(_row_label(row, adv_half))
        out.append('<div class="rw-toks">')
        out.extend(_token_span(row, t, metric, scale, outline_label) for t in range(len(row.tokens)))
        out.append("</div></div>")
    any_masked = any(r.mask is not None and not all(r.mask) for r in rows)
    any_outline = any(r.outline is not None and any(r.outline) for r in rows)
    any_nan = any(not np.all(np.isfinite(r.values)) for r in rows)
    split = any(not t.complete for r in rows for t in r.tokens)
    if split:       # say what ⟨XX⟩ means once, where it appears
        note = (note + " " if note else "") + ("⟨XX⟩ = one byte (hex) of a UTF-8 character split across "
                                               "tokens; the tooltip names the character.")
    lit = next((r.highlight_label for r in rows if r.highlight is not None and any(r.highlight)), "")
    out.append(_legend(metric, scale, any_masked=any_masked, any_outline=any_outline, any_nan=any_nan,
                       outline_label=outline_label, note=note, highlight_label=lit))
    out.append("</div>")
    return "".join(out)


def _scale_values(rows: list[_Row]) -> np.ndarray:
    """Values that set the automatic colour range: unmasked only (padding must not stretch the scale)."""
    vals = [r.values[np.asarray(r.mask, dtype=bool)] if r.mask is not None else r.values for r in rows]
    return np.concatenate(vals) if vals else np.zeros(0)


# ----------------------------------------------------------------------------------------- public
def token_strip(tokens: Sequence[str], values: Any, *, metric: str | Metric = "logp", label: str = "",
                signed: bool | None = None, outline: Sequence[Any] | None = None,
                hover: Sequence[Mapping[str, Any]] | None = None, vmin: float | None = None,
                vmax: float | None = None, mask: Sequence[bool] | None = None,
                topk: Sequence[Sequence[tuple[str, float]]] | None = None,
                token_ids: Sequence[int] | None = None, outline_label: str = "clipped by the loss",
                definition: str | None = None, info: Mapping[str, Any] | None = None,
                title: str = "", vocab_size: int | None = None) -> TokenStrip:
    """One completion's tokens coloured by one metric.

    tokens: one per sampled id: its bytes (exact), a TokenText, or decoded text (`tokenizer.decode([id])`,
    exact only for whole characters); rendered by `token_text`;
    values: one float per token (list, numpy or torch); metric: a key of `METRICS` (logp, ref_logp,
    ratio, kl, full_kl, entropy, delta_logp, adv_x_logp, pg, loss…) or any name with `signed`;
    outline: truthy per token = clipped (a string is shown in the hover, e.g. "low"/"high");
    hover: per token {name: value} of extra metrics; topk: per token [(token, logp) or (token, logp, id), …]
    (with ids and token_ids the "← sampled" mark compares ids);
    mask: False = not in the loss (greyed; excluded from the automatic colour range);
    vmin/vmax: pin the colour range (signed metrics stay symmetric around 0, ratio around 1);
    vocab_size: V of the model, quoted in logp/entropy legends as the uniform-guess reference ln V.
    """
    tokens = [token_text(t) for t in tokens]
    vals = _values(values)
    n = len(tokens)
    _check_len("values", vals, n)
    for name, seq in (("outline", outline), ("hover", hover), ("mask", mask), ("topk", topk),
                      ("token_ids", token_ids)):
        _check_len(name, seq, n)
    m = _resolve_metric(metric, signed, vals, definition)
    row = _Row(tokens, vals, label=label, info=dict(info or {}), mask=None if mask is None else [bool(x) for x in mask],
               outline=None if outline is None else list(outline), hover=None if hover is None else list(hover),
               topk=None if topk is None else list(topk), token_ids=None if token_ids is None else list(token_ids))
    scale = make_scale(m, _scale_values([row]), vmin, vmax, vocab_size=vocab_size)
    html = _render([row], m, scale, title=title, outline_label=outline_label,
                   show_labels=bool(label or info))
    return TokenStrip(html=html, metric=m.key, n_tokens=n, n_rows=1)


def token_strips(tokens: Sequence[Sequence[str]], values: Sequence[Any], *, metric: str | Metric = "logp",
                 labels: Sequence[str] | None = None, row_info: Sequence[Mapping[str, Any]] | None = None,
                 masks: Sequence[Sequence[bool]] | None = None, outlines: Sequence[Sequence[Any]] | None = None,
                 hovers: Sequence[Sequence[Mapping[str, Any]]] | None = None,
                 topk: Sequence[Sequence[Sequence[tuple[str, float]]]] | None = None,
                 token_ids: Sequence[Sequence[int]] | None = None, signed: bool | None = None,
                 vmin: float | None = None, vmax: float | None = None, title: str = "",
                 outline_label: str = "clipped by the loss", definition: str | None = None,
                 note: str = "", vocab_size: int | None = None, adv_half: float | None = None,
                 highlights: Sequence[Sequence[Any]] | None = None, highlight_label: str = "highlighted") -> TokenStrip:
    """Several completions stacked, one row each, on ONE shared colour scale (so rows compare).
    `vmin`/`vmax` pin that scale (e.g. the whole batch's range when only some rows are shown, or an
    absolute ±value); `adv_half` pins the advantage chips' scale the same way.

    labels: a row label each (e.g. "prompt 0 · g 2"); row_info: {name: value} chips under the label
    (e.g. {"reward": 0.25, "advantage": 0.87}; keys containing "adv" get a diverging chip).
    Per-row arguments mirror `token_strip`. Rows may have different lengths. `highlights`: per row per token
    falsy, True or a string (shown in the tooltip after `highlight_label`): those tokens get a black underline
    and ring (e.g. where a replay disagrees with the record).
    """
    n_rows = len(tokens)
    if len(values) != n_rows:
        raise ValueError(f"values has {len(values)} rows but tokens has {n_rows}")
    for name, seq in (("labels", labels), ("row_info", row_info), ("masks", masks), ("outlines", outlines),
                      ("hovers", hovers), ("topk", topk), ("token_ids", token_ids), ("highlights", highlights)):
        if seq is not None and len(seq) != n_rows:
            raise ValueError(f"{name} has {len(seq)} rows but tokens has {n_rows}")
    rows: list[_Row] = []
    for i in range(n_rows):
        toks = [token_text(t) for t in tokens[i]]
        vals = _values(values[i])
        # (N, T) arrays are padded to T: cut each row to its own token count
        if len(vals) > len(toks):
            vals = vals[:len(toks)]

        def cut(seq, i=i, toks=toks):
            return None if seq is None else list(seq[i])[:len(toks)]
        row = _Row(toks, vals, label=labels[i] if labels is not None else f"#{i}",
                   info=dict(row_info[i]) if row_info is not None else {},
                   mask=None if masks is None else [bool(x) for x in cut(masks)],
                   outline=cut(outlines), hover=cut(hovers), topk=cut(topk), token_ids=cut(token_ids),
                   highlight=cut(highlights), highlight_label=highlight_label)
        _check_len("values", row.values, len(toks), i)
        for name in ("mask", "outline", "hover", "topk", "token_ids", "highlight"):
            _check_len(name, getattr(row, name), len(toks), i)
        rows.append(row)
    all_vals = _scale_values(rows)
    m = _resolve_metric(metric, signed, all_vals, definition)
    scale = make_scale(m, all_vals, vmin, vmax, vocab_size=vocab_size)
    html = _render(rows, m, scale, title=title, outline_label=outline_label, note=note, adv_half=adv_half)
    return TokenStrip(html=html, metric=m.key, n_tokens=sum(len(r.tokens) for r in rows), n_rows=n_rows)


def token_metric_stack(tokens: Sequence[str], metrics: Mapping[str, Any], *, label: str = "",
                       mask: Sequence[bool] | None = None, outline: Sequence[Any] | None = None,
                       outline_metric: str = "ratio", topk: Sequence[Sequence[tuple[str, float]]] | None = None,
                       token_ids: Sequence[int] | None = None, title: str = "",
                       vocab_size: int | None = None) -> HTMLView:
    """One completion, one strip per metric (CircuitsVis' multi-metric idea without a JS toggle).

    Every strip's hover lists all metrics at that token, so any row gives the full picture.
    The outline (clip state) is drawn on the `outline_metric` row only.
    """
    tokens = [token_text(t) for t in tokens]
    arrays = {k: _values(v) for k, v in metrics.items()}
    for k, v in arrays.items():
        _check_len(f"metrics[{k!r}]", v, len(tokens))
    hover = [{k: float(v[t]) for k, v in arrays.items()} for t in range(len(tokens))]
    parts = [f'<div class="rw-view"><div class="rw-title">{attr(title or label)}</div>'] if (title or label) else []
    for k, v in arrays.items():
        strip = token_strip(tokens, v, metric=k, mask=mask, hover=hover, topk=topk, token_ids=token_ids,
                            vocab_size=vocab_size,
                            outline=outline if k == outline_metric else None,
                            info={"metric": METRICS[k].name if k in METRICS else k})
        parts.append(strip.html)
    if title or label:
        parts.append("</div>")
    return HTMLView("".join(parts))
