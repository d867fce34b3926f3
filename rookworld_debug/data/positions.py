"""Fresh evaluation positions made at run time from uniformly random play (``rookworld-debug measure``).

Nothing here is stored: ``measure`` builds its prompts from a seed, so a model is judged on positions
it has not seen as text (the training data comes from :mod:`rookworld_debug.lab.generate` with other
seeds; early-opening positions can still coincide, which :func:`overlap` lets a caller count).

* :func:`random_play_positions` — positions after ``U[min_plies, max_plies]`` uniformly random legal
  plies from the initial position (a game that ends earlier is replayed with the next draw).
* :func:`a_cases` — A: prompts with the mix RookWorld's environment sees: legal random moves, illegal
  attempts (``-1.0``/truncated) and game-ending moves (mate/stalemate/draw: ``1.0``/``0.5``, terminated).
  Each case carries the arbiter's expected completion.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import chess

from rookworld_debug.chess.arbiter import transition
from rookworld_debug.chess.formats import MAX_HISTORY, format_a_prompt


@dataclass(frozen=True)
class ACase:
    prompt: str  # "A: <fen>+<uci>+<history>+"
    expected: str  # the arbiter's completion "<new fen>+<reward>+<terminated>+<truncated>"
    kind: str  # "legal" | "illegal" | "game_end"


def _random_game(rng: random.Random, plies: int) -> tuple[chess.Board, list[str]] | None:
    board, hist = chess.Board(), []
    for _ in range(plies):
        moves = list(board.legal_moves)
        if not moves or board.is_game_over(claim_draw=False):
            return None
        m = rng.choice(moves)
        board.push(m)
        hist.append(m.uci())
    return (None if board.is_game_over() else board), hist


def random_play_positions(n: int, seed: int, min_plies: int = 2, max_plies: int = 80) -> list[tuple[str, list[str]]]:
    """``n`` distinct (fen, move history) pairs from random play; deterministic in ``seed``."""
    rng = random.Random(f"fresh-positions:{seed}")
    out, seen = [], set()
    while len(out) < n:
        got = _random_game(rng, rng.randint(min_plies, max_plies))
        if got is None or got[0] is None:
            continue
        board, hist = got
        fen = board.fen()
        if fen not in seen:
            seen.add(fen)
            out.append((fen, hist))
    return out


def _illegal_uci(board: chess.Board, rng: random.Random) -> str:
    legal = {m.uci() for m in board.legal_moves}
    own = [sq for sq in chess.SQUARES if board.color_at(sq) == board.turn]
    while True:  # a side-to-move piece to a square it cannot reach (own pieces always exist)
        uci = chess.square_name(rng.choice(own)) + chess.square_name(rng.randrange(64))
        if uci[:2] != uci[2:] and uci not in legal and uci + "q" not in legal:
            return uci


def _game_end_case(rng: random.Random) -> tuple[str, str, list[str]]:
    """Play random games to their end; return (fen before, final move, history) of the last ply."""
    while True:
        got = play_to_end(chess.Board(), rng, max_plies=600)
        if got is not None:
            before, hist = got
            return before, hist[-1], hist


def play_to_end(board: chess.Board, rng: random.Random, max_plies: int) -> tuple[str, list[str]] | None:
    """Play ``board`` (in place) on to its end with measure's game-end policy; return (the FEN before the
    final ply, the moves played), or None when it is not over after ``max_plies`` plies."""
    played, before = [], None
    while not board.is_game_over() and len(played) < max_plies:
        # prefer a game-ending move when one exists: random games otherwise end mostly by the 75-move rule
        moves = list(board.legal_moves)
        ending = [m for m in moves if _ends(board, m)]
        m = rng.choice(ending) if ending and rng.random() < 0.5 else rng.choice(moves)
        before = board.fen()
        board.push(m)
        played.append(m.uci())
    return (before, played) if played and board.is_game_over() else None


def _ends(board: chess.Board, move: chess.Move) -> bool:
    board.push(move)
    try:
        return board.is_game_over()
    finally:
        board.pop()


def a_cases(n: int, seed: int, p_illegal: float = 0.1, p_game_end: float = 0.1) -> list[ACase]:
    """``n`` A: cases from fresh random play: ``p_illegal`` illegal attempts, ``p_game_end`` game-ending
    moves, the rest legal random moves. History = the last ≤10 half-moves incl. the current one."""
    rng = random.Random(f"fresh-a-cases:{seed}")
    positions = random_play_positions(n, seed + 7919)
    cases = []
    for fen, hist in positions:
        u = rng.random()
        if u < p_game_end:
            fen, move, hist = _game_end_case(rng)
            kind, hist = "game_end", hist[:-1]
        else:
            board = chess.Board(fen)
            if u < p_game_end + p_illegal:
                move, kind = _illegal_uci(board, rng), "illegal"
            else:
                move, kind = rng.choice(list(board.legal_moves)).uci(), "legal"
        h = (hist + [move])[-MAX_HISTORY:]
        cases.append(ACase(format_a_prompt(fen, move, h), transition(fen, move, h).completion, kind))
    return cases


def overlap(prompts, training_prompts) -> float:
    """Share of ``prompts`` that occur verbatim in ``training_prompts`` (a set or iterable)."""
    train = training_prompts if isinstance(training_prompts, (set, frozenset)) else set(training_prompts)
    prompts = list(prompts)
    return sum(p in train for p in prompts) / len(prompts) if prompts else float("nan")


# ---------------------------------------------------------------- A: cases by band of game length
BANDS = ((1, 20), (21, 40), (41, 60), (61, 80), (81, 150))  # fullmove ranges; "81+" is measured up to 150
A_BAND_MIX = (("legal", 0.7), ("illegal", 0.15), ("game_end", 0.15))


def band_label(lo: int, hi: int) -> str:
    return f"{lo}+" if hi >= 150 else f"{lo}-{hi}"


def _walk_to(rng: random.Random, lo_ply: int, hi_ply: int, want_end: bool):
    """Uniformly random play from the start to a ply in [lo_ply, hi_ply]; returns (board, history, ending
    moves) at the first position there that qualifies (any live one, or one with a game-ending move when
    ``want_end``), or None when the game ends or passes hi_ply first."""
    board, hist = chess.Board(), []
    target = rng.randint(lo_ply, hi_ply)
    while not board.is_game_over() and len(hist) <= hi_ply:
        if len(hist) >= (lo_ply if want_end else target):
            ending = [m for m in board.legal_moves if _ends(board, m)] if want_end else []
            if ending or not want_end:
                return board, hist, ending
        m = rng.choice(list(board.legal_moves))
        board.push(m)
        hist.append(m.uci())
    return None


def band_a_cases(n_per_band: int, seed: int, bands=BANDS, mix=A_BAND_MIX) -> list[tuple[str, ACase]]:
    """(band label, case) pairs: ``n_per_band`` A: cases per band of fullmove number, from **uniformly
    random play** to a ply drawn in the band (this module's generator; the training data's comes from
    :mod:`rookworld_debug.lab.games`: engine-mixed games played to their end). The kinds follow ``mix``:
    a legal random move, an illegal attempt, or a move that ends the game there (mate, stalemate,
    insufficient material, 75-move rule). Deterministic in ``seed``."""
    rng = random.Random(f"band-a-cases:{seed}")
    out = []
    for lo, hi in bands:
        lo_ply, hi_ply = 2 * (lo - 1), 2 * hi - 1  # fullmove f covers plies 2(f-1) and 2(f-1)+1
        counts = {k: round(n_per_band * w) for k, w in mix}
        counts["legal"] += n_per_band - sum(counts.values())
        for kind, n in counts.items():
            made = 0
            while made < n:
                got = _walk_to(rng, lo_ply, hi_ply, kind == "game_end")
                if got is None:
                    continue
                board, hist, ending = got
                fen = board.fen()
                if kind == "game_end":
                    move = rng.choice(ending).uci()
                elif kind == "illegal":
                    move = _illegal_uci(board, rng)
                else:
                    move = rng.choice(list(board.legal_moves)).uci()
                h = (hist + [move])[-MAX_HISTORY:]
                out.append((band_label(lo, hi), ACase(format_a_prompt(fen, move, h), transition(fen, move, h).completion,
                                                      kind)))
                made += 1
    return out
