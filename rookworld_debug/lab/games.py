"""Whole-game records where "the game is over" cannot be read off the move number.

The ``cpu-sorted`` and ``shipped`` recipes capped games at 80 plies and took its game-end records from games played on past
the cap, so in its data "past move 40 means the game ended" always held, and the model learned that.
Here every game is played to its **natural end** (checkmate, stalemate, insufficient material, the
75-move rule, fivefold repetition; a hard cap of ``max_game_plies``), so:

* non-terminal positions cover the whole range of game lengths (random play often lasts 300+ plies);
* each side has its own random-move probability (``eps_range``, drawn per side and per game; a share
  ``p_random_game`` of games is pure random play), so one game is engine-vs-engine, the next a strong
  side mating a random one early, the next a 300-ply random walk;
* game ends come at every length: the game's last ply is always a record, and at every kept position
  a move that would end the game there (mate, stalemate, capture to insufficient material, the 150th
  half-move) is, with probability ``p_end_branch``, a record of its own (not played);
* illegal attempts come with probability ``p_illegal`` at every kept ply, so in every band.

Engine-guided moves and P: labels come from the reward's search (:func:`generate.label_engine`, the
FEN alone, fresh hash), exactly as in :mod:`rookworld_debug.lab.generate`. A P: record is made at a
kept position with probability ``p_share_p`` (the search is the expensive part). Deterministic in
(settings, game id). Used by ``generate-data --full-games``.
"""
from __future__ import annotations

import random

import chess

from rookworld_debug.chess.formats import MAX_HISTORY, PSample, format_p, split_p
from rookworld_debug.data.positions import _ends


def _p_record(s, a, fen, turn, rng, split, gid, ply) -> dict | None:
    ranked = [(m, str(v)) for m, v in zip(a.moves, a.scores)]  # str(cp / 100): the P: eval format
    if not ranked:
        return None
    from rookworld_debug.data.records import p_label

    moves = [m for m, _ in ranked]
    best = p_label(moves, turn, s.b_label)
    pairs = ranked[:]
    rng.shuffle(pairs)
    sample = PSample(fen=fen, moves=tuple(m for m, _ in pairs), evals=tuple(e for _, e in pairs), best=best)
    text = format_p(sample, fen_width=s.fen_width)
    prompt, completion = split_p(text)
    return dict(text=text, task="P", prompt=prompt, completion=completion, split=split, game=gid, ply=ply,
                fen=fen, moves=list(sample.moves), evals=list(sample.evals), best=best, ranked_moves=moves,
                ranked_evals=[e for _, e in ranked], b_label=s.b_label)


def _engine_move(a, rng) -> str | None:
    if not a.moves:
        return None
    w = [0.5 ** i for i in range(len(a.moves))]  # the engine's top-5, weight 0.5**rank (as generate.py)
    return rng.choices(list(a.moves), weights=w)[0]


def play_full_game(args) -> list[dict]:
    """One game to its natural end → its P: and A: records in ply order (see module doc)."""
    from rookworld_debug.data.records import _a_record, _illegal_move, label_engine

    s, gid = args
    rng = random.Random(f"full-game:{s.seed}:{gid}")
    pure = rng.random() < s.p_random_game
    eps = (1.0, 1.0) if pure else (rng.uniform(*s.eps_range), rng.uniform(*s.eps_range))  # (black, white)
    split = "heldout" if rng.random() < s.heldout_frac else "train"
    eng = None if pure else label_engine(s)
    board, history, out, ply = chess.Board(), [], [], 0
    while not board.is_game_over() and ply < s.max_game_plies:
        fen, turn = board.fen(), board.turn
        legal = list(board.legal_moves)
        keep = rng.random() < s.keep
        random_move = rng.random() < eps[turn]
        want_p = keep and rng.random() < s.p_share_p and eng is not None
        a = eng.analyse(fen) if (want_p or not random_move) else None
        if want_p:
            rec = _p_record(s, a, fen, turn, rng, split, gid, ply)
            if rec:
                out.append(rec)
        move = (None if random_move else _engine_move(a, rng)) or rng.choice(legal).uci()
        last = _ends(board, chess.Move.from_uci(move))
        if keep and rng.random() < s.p_illegal:
            bad = _illegal_move(board, rng)
            out.append(_a_record(fen, bad, (history + [bad])[-MAX_HISTORY:], split, gid, ply))
        if keep and not last and rng.random() < s.p_end_branch:
            ending = [m.uci() for m in legal if m.uci() != move and _ends(board, m)]
            if ending:
                alt = rng.choice(ending)
                out.append(_a_record(fen, alt, (history + [alt])[-MAX_HISTORY:], split, gid, ply))
        history = (history + [move])[-MAX_HISTORY:]
        if keep or last:  # the game's final ply is always a record
            out.append(_a_record(fen, move, history, split, gid, ply))
        board.push_uci(move)
        ply += 1
    return out
