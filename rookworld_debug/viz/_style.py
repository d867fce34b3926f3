"""Shared visual grammar for every view: palettes, colour scaling, number formatting, visible whitespace.

Only formatting lives here; no GRPO math. One palette for the whole package so a token strip, a
table cell and a plotly heatmap of the same metric look the same:

- signed metrics (advantage, Δlogp, log-ratio, per-token pg): orange (< 0) · white (0) · blue (> 0).
  Orange/blue is safe for the common colour-vision deficiencies (unlike red/green).
- sequential metrics (|logp|, KL, entropy): white (unremarkable) → purple (notable).
Text colour on a coloured background is chosen by WCAG contrast, never fixed.
"""
from __future__ import annotations

import html
import math
import unicodedata
from typing import Any, Iterable

import numpy as np

NEG_RGB = (230, 97, 1)        # #e66101, negative end of the diverging scale
POS_RGB = (33, 102, 172)      # #2166ac, positive end
SEQ_RGB = (84, 39, 143)       # #54278f, strong end of the sequential scale
NEUTRAL_RGB = (255, 255, 255)
MASKED_BG = "#e6e6e6"
MASKED_FG = "#8a8a8a"
NAN_BG = "repeating-linear-gradient(45deg,#ffffff 0 3px,#f2a7a7 3px 6px)"
OUTLINE = "#c51b7d"           # magenta outline for clipped tokens: distinct from both scale ends
HIGHLIGHT = "#000000"         # black underline + ring for highlighted tokens (e.g. where a replay disagrees)

PASS_BG, PASS_FG = "#d9f0d3", "#1b5e20"
FAIL_BG, FAIL_FG = "#fddbc7", "#8b0000"
WARN_BG, WARN_FG = "#fff3cd", "#6b4e00"
INFO_BG, INFO_FG = "#deebf7", "#08306b"

FONT_MONO = "ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono',monospace"
FONT_SANS = "system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif"


# ----------------------------------------------------------------------------------------- arrays
def to_numpy(x: Any, dtype=float) -> np.ndarray:
    """Anything array-like (list, numpy, torch tensor on any device) -> numpy, without importing torch."""
    if x is None:
        raise ValueError("expected an array, got None")
    if hasattr(x, "detach"):  # torch.Tensor: detach, move to cpu, upcast bf16 (numpy has no bf16)
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        x = x.numpy()
    return np.asarray(x, dtype=dtype)


# ----------------------------------------------------------------------------------------- numbers
def fmt(v: Any, digits: int = 4) -> str:
    """Compact number for a cell: 4 significant digits, sci notation for tiny/huge, 'nan'/'inf' spelled."""
    if v is None:
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "+inf" if f > 0 else "-inf"
    if f == 0:
        return "0"
    if abs(f) >= 1e5 or abs(f) < 1e-3:
        return f"{f:.{max(digits - 1, 1)}e}"
    return f"{f:.{digits}g}"


def fmt_exact(v: Any) -> str:
    """Hover value: 6 significant digits (enough to compare against a printed tensor)."""
    return fmt(v, digits=6)


def fmt_signed(v: Any, digits: int = 4) -> str:
    s = fmt(v, digits)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return s
    return "+" + s if f > 0 and not s.startswith("+") else s


# ----------------------------------------------------------------------------------------- colours
def _lerp(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    return tuple(int(round(x + (y - x) * t)) for x, y in zip(a, b))  # type: ignore[return-value]


def hex_rgb(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _rel_luminance(rgb: tuple[int, int, int]) -> float:
    def ch(c: int) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (ch(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_on(rgb: tuple[int, int, int]) -> str:
    """Black or white text, whichever has the higher WCAG contrast against the background."""
    lum = _rel_luminance(rgb)
    contrast_black = (lum + 0.05) / 0.05
    contrast_white = 1.05 / (lum + 0.05)
    return "#000000" if contrast_black >= contrast_white else "#ffffff"


def diverging_rgb(t: float) -> tuple[int, int, int]:
    """t in [-1, 1] -> colour; 0 is exactly white."""
    t = max(-1.0, min(1.0, t))
    if t < 0:
        return _lerp(NEUTRAL_RGB, NEG_RGB, -t)
    return _lerp(NEUTRAL_RGB, POS_RGB, t)


def sequential_rgb(t: float) -> tuple[int, int, int]:
    """t in [0, 1] -> colour; 0 is exactly white."""
    return _lerp(NEUTRAL_RGB, SEQ_RGB, max(0.0, min(1.0, t)))


def plotly_diverging() -> list[list]:
    return [[0.0, hex_rgb(NEG_RGB)], [0.5, hex_rgb(NEUTRAL_RGB)], [1.0, hex_rgb(POS_RGB)]]


def plotly_sequential(reverse: bool = False) -> list[list]:
    lo, hi = hex_rgb(NEUTRAL_RGB), hex_rgb(SEQ_RGB)
    return [[0.0, hi], [1.0, lo]] if reverse else [[0.0, lo], [1.0, hi]]


def cell_css(rgb: tuple[int, int, int]) -> str:
    return f"background-color:{hex_rgb(rgb)};color:{text_on(rgb)}"


def signed_cell_css(v: Any, half_range: float, max_t: float = 0.7) -> str:
    """Styler helper: diverging background for one signed number, NaN striped.

    Intensity is capped at max_t so full-scale cells stay calm and readable in dense tables."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    if math.isnan(f) or math.isinf(f):
        return f"background:{NAN_BG};color:#000000"
    t = 0.0 if half_range <= 0 else max(-1.0, min(1.0, f / half_range)) * max_t
    return cell_css(diverging_rgb(t))


def finite_abs_max(values: Iterable[Any]) -> float:
    arr = np.asarray([float(v) for v in values if v is not None], dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(np.max(np.abs(arr))) if arr.size else 0.0


# ----------------------------------------------------------------------------------------- whitespace
EOS_STRINGS = ("<|endoftext|>",)
_WS_GLYPHS = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", "\u00a0": "⍽"}
# invisible / format characters, named so nothing renders empty (a soft hyphen used to)
_NAMED = {0x00AD: "SHY", 0x034F: "CGJ", 0x061C: "ALM", 0x180E: "MVS", 0x200B: "ZWSP", 0x200C: "ZWNJ",
          0x200D: "ZWJ", 0x200E: "LRM", 0x200F: "RLM", 0x2028: "LSEP", 0x2029: "PSEP", 0x202A: "LRE",
          0x202B: "RLE", 0x202C: "PDF", 0x202D: "LRO", 0x202E: "RLO", 0x2060: "WJ", 0x2066: "LRI",
          0x2067: "RLI", 0x2068: "FSI", 0x2069: "PDI", 0xFEFF: "BOM"}
# characters used as glyphs: a literal one in the text is escaped, so every label reads one way
_GLYPH_CHARS = set(_WS_GLYPHS.values()) | set("␡⟨⟩◌∅") | {chr(0x2400 + c) for c in range(32)}


def visible_char(ch: str) -> tuple[str, str]:
    """(kind, shown) for one character: kind "ws" = `shown` is a glyph standing for whitespace, a
    control or an invisible character ('␣', '⏎', '␀', '⟨SHY⟩', '⟨U+2003⟩'); "text" = the character
    itself (a lone combining mark gets a dotted-circle base '◌́'). Literal glyph characters are escaped
    ('⟨U+2423⟩'), so a shown string maps back to one text."""
    cp = ord(ch)
    if ch in _WS_GLYPHS:
        return "ws", _WS_GLYPHS[ch]
    if cp < 32:
        return "ws", chr(0x2400 + cp)                               # Unicode control pictures
    if cp == 127:
        return "ws", "␡"
    if ch in _GLYPH_CHARS:
        return "ws", f"⟨U+{cp:04X}⟩"
    cat = unicodedata.category(ch)
    if cp in _NAMED or cat in ("Cc", "Cf", "Zs", "Zl", "Zp", "Co", "Cn", "Cs"):
        return "ws", f"⟨{_NAMED.get(cp, f'U+{cp:04X}')}⟩"
    if cat in ("Mn", "Me"):
        return "text", "◌" + ch
    return "text", ch


def visible_ws_html(text: str, *, break_lines: bool = False) -> str:
    """Escape text for HTML and make every whitespace/control/invisible character visible.

    The glyphs sit in a faded `rw-ws` span so a visible-space glyph cannot be confused with a real
    '␣' character in the text. With break_lines, a newline also breaks the line after its glyph.
    """
    out: list[str] = []
    for ch in text:
        kind, shown = visible_char(ch)
        if kind == "text":
            out.append(html.escape(shown))
        else:
            out.append(f'<span class="rw-ws" style="opacity:.55">{html.escape(shown)}</span>')
            if ch == "\n" and break_lines:
                out.append("<br>")
    return "".join(out)


def visible_ws_text(text: str, *, collapse_runs: int = 4) -> str:
    """Plain-text version for table cells: '␣' for spaces, runs of ≥ collapse_runs spaces as '␣×33'.

    The P: padding is ~30–40 single-space tokens: spelled out, it would hide the moves in a table.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == " ":
            j = i
            while j < len(text) and text[j] == " ":
                j += 1
            n = j - i
            out.append(f"␣×{n}" if n >= collapse_runs else "␣" * n)
            i = j
            continue
        out.append(visible_char(ch)[1])
        i += 1
    return "".join(out)


def truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max(max_chars - 1, 0)] + "…"


def attr(text: str) -> str:
    """Escape for a double-quoted HTML attribute; newlines become line breaks in a title tooltip."""
    return html.escape(text, quote=True).replace("\n", "&#10;")


def stable_id(*parts: Any) -> str:
    """Deterministic short id from content (snapshot-stable, yet distinct for different tables)."""
    import hashlib
    h = hashlib.sha1(repr(parts).encode("utf-8", "replace")).hexdigest()
    return h[:10]
