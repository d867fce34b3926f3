"""Record builders the generators share (generate.py: capped games; games.py: games to their natural end)."""
from __future__ import annotations

import hashlib
import os
import random

import chess

from rookworld_debug.chess.arbiter import transition
from rookworld_debug.chess.formats import format_a_prompt

_ENGINES: dict = {}


def label_engine(s: GenSettings):
    """This process's label engine for ``s``: the reward's :class:`Engine` at the same search settings.

    One Stockfish per process (games are sequential: the next move depends on the analysis; the pool's
    parallelism is across games). ``cache=False``: every search is a fresh one on the FEN alone (the
    answer is the same either way; no memo grows over a long run). Engine closes its process at exit.
    """
    from rookworld_debug.chess.engine import Engine

    # keyed by pid: a forked pool worker must not reuse (or collect, killing the parent's process) an
    # Engine inherited from its parent, whose event-loop thread does not exist in the child
    key = (os.getpid(), s.engine_path, s.depth, s.multipv)
    if key not in _ENGINES:
        _ENGINES[key] = Engine(path=s.engine_path, depth=s.depth, multipv=s.multipv, workers=1, cache=False)
    return _ENGINES[key]


def _game_seed(seed: int, gid: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{gid}".encode()).digest()[:8], "big")


def _illegal_move(board: chess.Board, rng: random.Random) -> str:
    legal = {m.uci() for m in board.legal_moves}
    own = [sq for sq in chess.SQUARES if board.color_at(sq) == board.turn]
    for _ in range(100):
        if own and rng.random() < 0.7:
            frm = rng.choice(own)
        else:
            frm = rng.randrange(64)
        to = rng.randrange(64)
        if to == frm:
            continue
        uci = chess.square_name(frm) + chess.square_name(to)
        if uci not in legal and (uci + "q") not in legal:
            return uci
    return "a1a1"


def p_label(moves, turn: bool, b_label: str) -> str:
    """The ``B:`` label for an engine ranking ``moves`` (best first) with ``turn`` to move (see module doc)."""
    return moves[-1] if b_label == "rookworld" and turn == chess.BLACK else moves[0]


def _a_record(fen, move, history, split, gid, ply) -> dict:
    tr = transition(fen, move, history)
    prompt = format_a_prompt(fen, move, history)
    completion = tr.completion
    return dict(text=prompt + completion, task="A", prompt=prompt, completion=completion, split=split, game=gid,
                ply=ply, fen=fen, move=move, history=list(history), new_fen=tr.new_fen, reward=tr.reward,
                terminated=tr.terminated, truncated=tr.truncated, outcome=tr.outcome)
