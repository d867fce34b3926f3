"""Chess board SVG of a prompt's position with the model's moves drawn as arrows.

- P: tasks: every M: candidate as an arrow, green when legal, red + dashed when illegal (dashes so
  the two stay distinct for red/green colour-blind readers); the B: move thicker.
- A: tasks: the prompt's move on the prompt position, next to the predicted new position, with the
  squares that differ from an expected FEN (if given) highlighted.

Never raises: a malformed FEN or move renders a red error box / a "not UCI" chip instead, because
views get raw model output. Returns a BoardView with `_repr_svg_` (the board) and `_repr_html_`
(board + legend; JupyterLab prefers it).
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Sequence

import chess
import chess.svg

from ._style import FAIL_BG, FAIL_FG, FONT_SANS, PASS_BG, PASS_FG, WARN_BG, WARN_FG
from .htmlview import HTMLView

__all__ = ["BoardView", "board_view", "board_from_p", "board_from_a", "board_from_prompt"]

# Distinct hex colours per arrow kind: the SVG is post-processed by colour (width, dashes).
LEGAL, LEGAL_BEST = "#1a9641", "#0b5e27"
ILLEGAL, ILLEGAL_BEST = "#d7191c", "#99000d"
DIFF_FILL = "#d7191c80"
_ARROW_W, _BEST_W = "9.0", "15"   # chess.svg draws arrow shafts at 0.2 × square size (45 px) = 9


@dataclass(frozen=True, repr=False)
class BoardView(HTMLView):
    """A rendered board (or an error box). `moves`: ((uci, status), ...) with status in
    {"legal", "illegal", "not UCI"}; `error` is set when the position itself could not be drawn."""
    svg: str | None = None
    error: str | None = None
    moves: tuple = ()

    def _repr_svg_(self) -> str | None:   # None → Jupyter falls back to the HTML (error box)
        return self.svg

    def __repr__(self) -> str:
        return f"BoardView(error={self.error!r}, moves={list(self.moves)!r})"


def _error_box(message: str) -> str:
    return (f'<div class="rw-board-err" role="alert" style="font-family:{FONT_SANS};font-size:13px;'
            f'border:2px solid {FAIL_FG};background:{FAIL_BG};color:{FAIL_FG};padding:8px 10px;'
            f'border-radius:4px;max-width:36em;display:inline-block">⚠ cannot draw board: '
            f'{html.escape(message)}</div>')


def _chip(text: str, kind: str) -> str:
    bg, fg = {"legal": (PASS_BG, PASS_FG), "illegal": (FAIL_BG, FAIL_FG)}.get(kind, (WARN_BG, WARN_FG))
    return (f'<span style="background:{bg};color:{fg};border-radius:3px;padding:0 4px;margin:0 3px 0 0;'
            f'font-family:monospace;white-space:pre">{html.escape(text)}</span>')


def _restyle_lines(svg: str, color: str, *, width: str | None = None, dash: str | None = None) -> str:
    """Change stroke-width / add dashes on the arrow shafts drawn in `color` (chess.svg has no option)."""
    def fix(m: re.Match) -> str:
        tag = m.group(0)
        if width is not None:
            tag = re.sub(r'stroke-width="[^"]*"', f'stroke-width="{width}"', tag)
        if dash is not None:
            tag = tag.replace("<line ", f'<line stroke-dasharray="{dash}" ', 1)
        return tag
    return re.sub(r'<line [^>]*stroke="' + re.escape(color) + r'"[^>]*>', fix, svg)


def _parse_board(fen: str) -> tuple[chess.Board | None, str | None, str | None]:
    """(board, error, warning). Accepts 'P: <fen>' too. Impossible-but-parseable positions draw with a warning."""
    if not isinstance(fen, str) or not fen.strip():
        return None, f"no FEN given ({fen!r})", None
    text = fen.strip()
    if text.startswith("P:"):
        text = text[2:].strip()
    try:
        board = chess.Board(text)
    except (ValueError, IndexError) as exc:
        return None, f"invalid FEN {text!r}: {exc}", None
    warning = None
    if not board.is_valid():
        warning = f"python-chess calls this position impossible ({board.status()!r}); legality may be meaningless"
    return board, None, warning


def _classify(board: chess.Board, uci: str) -> tuple[chess.Move | None, str]:
    try:
        move = chess.Move.from_uci(uci.strip())
    except (ValueError, AttributeError):
        return None, "not UCI"
    if not move:       # null move "0000"
        return None, "not UCI"
    return move, ("legal" if move in board.legal_moves else "illegal")


def board_view(fen: str, moves: Sequence[str] = (), *, best: str | None = None, size: int = 320,
               title: str = "", lastmove: str | None = None, fill: dict | None = None,
               orientation: bool | None = None) -> BoardView:
    """Board of `fen` from the side to move, with `moves` (UCI) as arrows and `best` thicker."""
    try:
        board, error, warning = _parse_board(fen)
        if board is None:
            return BoardView(html=_error_box(error or "unknown error"), error=error)
        moves = [m for m in (moves or ()) if isinstance(m, str)]
        ordered = [m for m in dict.fromkeys(moves) if m != best] + ([best] if best else [])  # best drawn last, on top
        arrows, statuses = [], []
        for uci in ordered:
            move, status = _classify(board, uci)
            statuses.append((uci, status))
            if move is None:
                continue
            is_best = uci == best
            color = (LEGAL_BEST if is_best else LEGAL) if status == "legal" else (ILLEGAL_BEST if is_best else ILLEGAL)
            arrows.append(chess.svg.Arrow(move.from_square, move.to_square, color=color))
        last = None
        if lastmove:
            last, _ = _classify(board, lastmove)
        svg = chess.svg.board(board, arrows=arrows, size=size, lastmove=last, fill=fill or {},
                              orientation=board.turn if orientation is None else orientation)
        svg = _restyle_lines(svg, LEGAL_BEST, width=_BEST_W)
        svg = _restyle_lines(svg, ILLEGAL_BEST, width=_BEST_W, dash="10 6")
        svg = _restyle_lines(svg, ILLEGAL, dash="10 6")
        side = "white" if board.turn else "black"
        chips = "".join(_chip(("B: " if u == best else "") + u + {"legal": " ✓", "illegal": " ✗"}.get(s, " ?"), s)
                        for u, s in statuses)
        legend = (f'<div style="font-size:11.5px;color:#333;margin-top:3px;max-width:{max(size, 260)}px">'
                  f"{side} to move · arrows: green = legal, red dashed = illegal, thick = B: (best) · "
                  f"{chips or 'no moves'}</div>")
        warn = (f'<div style="font-size:11.5px;color:{WARN_FG};background:{WARN_BG};padding:2px 4px;'
                f'max-width:{max(size, 260)}px">⚠ '
                f"{html.escape(warning)}</div>") if warning else ""
        head = f'<div style="font-weight:600;font-size:12.5px">{html.escape(title)}</div>' if title else ""
        page = (f'<div class="rw-board" style="display:inline-block;vertical-align:top;margin:4px 10px 4px 0;'
                f'font-family:{FONT_SANS}">{head}{svg}{legend}{warn}</div>')
        return BoardView(html=page, svg=svg, moves=tuple(statuses))
    except Exception as exc:  # a view must never take the notebook down; say what happened instead
        msg = f"{type(exc).__name__}: {exc}"
        return BoardView(html=_error_box(msg), error=msg)


def board_from_p(prompt: str, completion: str, *, size: int = 320, title: str = "") -> BoardView:
    """P: task: the prompt's FEN with the completion's M: candidates and B: move."""
    try:
        from ..chess.formats import parse_p_completion
        parsed = parse_p_completion(completion)
        moves = list(parsed.moves)
        # keep non-UCI M: tokens visible as "not UCI" chips instead of silently dropping them
        raw = (parsed.raw_moves or "").split()
        moves += [t for t in raw if t not in moves]
        best = parsed.best if parsed.best else ((parsed.raw_best or "").split() or [None])[0]
        return board_view(prompt, moves, best=best, size=size, title=title or "P: prompt position, predicted moves")
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        return BoardView(html=_error_box(msg), error=msg)


def board_from_a(prompt: str, completion: str, *, expected_fen: str | None = None, size: int = 260) -> BoardView:
    """A: task: the prompt position with its move, and the predicted new position beside it (squares that
    differ from `expected_fen`, when given, filled red)."""
    try:
        from ..chess.formats import parse_a_completion, parse_a_prompt
        try:
            p = parse_a_prompt(prompt)
        except Exception as exc:   # FormatError: show it, do not raise
            msg = f"A: prompt not parseable: {exc}"
            return BoardView(html=_error_box(msg), error=msg)
        left = board_view(p.fen, [p.move], size=size, title="A: prompt position + move")
        c = parse_a_completion(completion)
        fill = {}
        exp_board = _parse_board(expected_fen)[0] if expected_fen else None
        pred_board = _parse_board(c.new_fen)[0] if c.new_fen else None
        if exp_board is not None and pred_board is not None:
            fill = {sq: DIFF_FILL for sq in chess.SQUARES if exp_board.piece_at(sq) != pred_board.piece_at(sq)}
        right = board_view(c.new_fen or "", (), size=size, fill=fill,
                           title="predicted new position" + (f" ({len(fill)} square(s) differ from expected)"
                                                             if expected_fen and pred_board is not None else ""),
                           orientation=left_orientation(p.fen))
        page = f'<div class="rw-boards" style="display:flex;flex-wrap:wrap">{left.html}{right.html}</div>'
        return BoardView(html=page, svg=left.svg, error=left.error or right.error, moves=left.moves)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        return BoardView(html=_error_box(msg), error=msg)


def left_orientation(fen: str) -> bool:
    board = _parse_board(fen)[0]
    return True if board is None else board.turn


def board_from_prompt(prompt: str, completion: str, **kw) -> BoardView:
    """Dispatch on the task prefix (P: / A:)."""
    text = prompt.strip() if isinstance(prompt, str) else ""
    if text.startswith("A:"):
        return board_from_a(text, completion, **kw)
    return board_from_p(text, completion, **kw)
