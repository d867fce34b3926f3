"""Generate RookWorld-format P: and A: samples with python-chess + Stockfish.

Positions come from *mixed-policy games*: each game opens with 0..``random_opening_max`` uniformly
random plies, then every position is analysed by Stockfish (fixed depth, multipv 5, Threads 1; see
*Labels* below) and the next move is, with the game's own probability ``eps`` (drawn per game in ``eps_range``), a
uniformly random legal move, otherwise one of the engine's top-5 picked with weight ``0.5**rank``.
Games stop at checkmate/stalemate/draw or at a per-game ply cap drawn in ``ply_range``. This gives
realistic openings, middlegames and endgames (and some game ends), not only random-walk positions.

**Labels = the reward's search.** Each position is searched exactly as the P: reward searches it:
through :class:`rookworld_debug.chess.engine.Engine` (the reward engine's own code path, so the two
cannot drift apart), from the FEN alone (no move history, so no repetition knowledge), on a fresh hash
(``ucinewgame`` before every search), at the same depth, multipv, ``Threads`` and ``Hash``. A label is
therefore what the engine reward computes for that FEN: on white-to-move records ``B`` is the
reward's #1 (tests/test_data.py checks every bundled one). The game's next move is drawn from the
same analysis. (Before this, a game was searched with its move stack on one per-game hash: in the old
bundled sample 67 of 200 sampled white-to-move ``B`` labels were not the reward's #1 at depth 10.)

**P: samples** (one per analysed position): ``moves`` = the multipv-5 first moves, ``evals`` =
``str(score.relative.score(mate_score=100000) / 100)`` (pawns, side to move; mate ±(100000−n)/100),
pairs shuffled jointly, laid out with :func:`rookworld_debug.chess.formats.format_p` (FEN width 90).
The ``B:`` label follows ``b_label``:

* ``"rookworld"`` (default, fidelity to the published data): ``moves[0]`` of the engine ranking for
  white to move but ``moves[-1]`` (the 5th-ranked move, i.e. the *worst* of the five) for black to
  move — the generator's ordering assumption that the real ``rook`` data and RookWorld-LM carry;
* ``"stockfish_best"``: always the engine's #1 move.

**A: samples** (one per played ply): ``transition(fen, move, history)`` from the arbiter (ArbiterSim
semantics), history = the last ≤10 half-moves including the current one. Like ArbiterSim's imperfect
self-play policy, with probability ``p_illegal`` a ply also yields an *illegal* attempt (a move of a
side-to-move piece to a random square, or random squares): ``-1.0`` / truncated ``1``. Game-ending
moves give ``1.0``/``0.5`` with terminated ``1``. Game ends are rare before a game's ply cap, so with
probability ``p_game_end`` a game is played on past its cap to its end with ``measure``'s policy (a
game-ending move half the time when one exists) and its last ply becomes an A: record.

Records are dicts: ``text`` (the full line, ``text == prompt + completion``), ``task`` (``"P"``/``"A"``),
``prompt``, ``completion``, ``split`` (``"train"``/``"heldout"``, chosen per *game* so held-out positions
come from unseen games), ``game``, ``ply`` and task fields. Duplicates (same P: FEN / same A: prompt)
are dropped; a position that occurs in a train game too is kept as train, so the held-out split holds
only positions unique to held-out games. Everything is seeded: the same arguments give the
same file (every search is a fresh engine game/hash, ``ucinewgame``, on the FEN alone).

CLI: ``rookworld-debug generate-data --out data.jsonl --n-p 2000 --n-a 1000 --depth 10`` (see
:func:`main`); a ``<out>.meta.json`` (or ``meta.json`` in ``--meta``) records the settings.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import chess

from rookworld_debug.chess.arbiter import transition
from rookworld_debug.chess.formats import MAX_HISTORY, PSample, format_a_prompt, format_p, split_p
from rookworld_debug.data.records import (_ENGINES, _a_record, _game_seed, _illegal_move,  # noqa: F401 - re-exported
                                          label_engine, p_label)
from rookworld_debug.errors import ConfigError

B_LABELS = ("rookworld", "stockfish_best")


@dataclass(frozen=True)
class GenSettings:
    depth: int = 10
    multipv: int = 5
    seed: int = 0
    b_label: str = "rookworld"
    heldout_frac: float = 0.2
    p_illegal: float = 0.04
    eps_range: tuple = (0.05, 0.5)
    ply_range: tuple = (10, 200)
    random_opening_max: int = 8
    keep: float = 1.0  # probability that a visited position yields records (< 1: more games, more diversity)
    p_game_end: float = 0.0  # probability that a game is played on past its cap to its end (one game-end A: record)
    fen_width: int = 90
    engine_path: str | None = None
    full_games: bool = False  # games played to their natural end (lab/games.py)
    p_random_game: float = 0.25  # full_games: share of pure random-play games
    p_share_p: float = 0.15  # full_games: probability that a kept position also yields a P: record
    p_end_branch: float = 0.3  # full_games: probability a kept position yields its game-ending move's record
    max_game_plies: int = 600  # full_games: hard cap (the 75-move rule ends random games long before)

    def check(self):
        if self.b_label not in B_LABELS:
            raise ConfigError("b_label", f"must be one of {B_LABELS}, got {self.b_label!r}")
        if self.depth < 1:
            raise ConfigError("depth", "must be >= 1")
        if not 0 <= self.heldout_frac <= 1:
            raise ConfigError("heldout_frac", "must be in [0, 1]")
        if not 0 < self.keep <= 1:
            raise ConfigError("keep", "must be in (0, 1]")
        if not 0 <= self.p_illegal <= 1:
            raise ConfigError("p_illegal", "must be in [0, 1]")
        for name in ("p_game_end", "p_random_game", "p_share_p", "p_end_branch"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(name, "must be in [0, 1]")


def _stockfish(path):
    """The shared finder (chess.engine.find_stockfish) when present, else the Debian path / PATH."""
    try:
        from rookworld_debug.chess.engine import find_stockfish
    except ImportError:  # the shared engine module is optional for generation
        import shutil

        from rookworld_debug.errors import EngineNotFound

        cands = [path, "/usr/games/stockfish", shutil.which("stockfish")]
        for c in cands:
            if c and Path(c).exists():
                return c
        raise EngineNotFound([c for c in cands if c])
    return find_stockfish(path)


def label_mismatches(records, engine) -> list[dict]:
    """The P: records whose labels are NOT ``engine``'s search of their FEN alone (empty = reproducible).

    Checks the ranking (``ranked_moves``), its evals and ``best`` (by the record's ``b_label``
    convention), one row per differing record: ``fen``, ``game``, ``ply``, ``turn`` and the differing
    fields as (label, engine) pairs. ``engine`` is a :class:`rookworld_debug.chess.engine.Engine`.
    """
    ps = [r for r in records if r["task"] == "P"]
    out = []
    for r, a in zip(ps, engine.analyse_many([r["fen"] for r in ps])):
        turn = chess.Board(r["fen"]).turn
        want = dict(ranked_moves=list(a.moves), ranked_evals=[str(v) for v in a.scores],
                    best=p_label(a.moves, turn, r.get("b_label", "rookworld")) if a.moves else None)
        diff = {k: (r.get(k), v) for k, v in want.items() if r.get(k) != v}
        if diff:
            out.append(dict(fen=r["fen"], game=r.get("game"), ply=r.get("ply"),
                            turn="white" if turn == chess.WHITE else "black", **diff))
    return out


def play_game(args) -> list[dict]:
    """One mixed-policy game → its P: and A: records (in ply order). Deterministic in (settings, gid)."""
    s, gid = args
    rng = random.Random(_game_seed(s.seed, gid))
    eps = rng.uniform(*s.eps_range)
    max_plies = rng.randint(*s.ply_range)
    n_random = rng.randint(0, s.random_opening_max)
    heldout = rng.random() < s.heldout_frac
    split = "heldout" if heldout else "train"
    eng = label_engine(s)
    board = chess.Board()
    history: list[str] = []
    out: list[dict] = []
    ply = 0
    while not board.is_game_over() and ply < max_plies:
        fen = board.fen()
        legal = list(board.legal_moves)
        keep = s.keep >= 1 or rng.random() < s.keep
        if ply < n_random or (not keep and eps >= 1):  # pure random play needs no search for an unkept ply
            move = rng.choice(legal).uci()
        else:
            # the reward's search: FEN alone (not `board` with its move stack), fresh hash, same settings
            a = eng.analyse(fen)
            ranked = [(m, str(v)) for m, v in zip(a.moves, a.scores)]  # str(cp / 100): the P: eval format
            if ranked and keep:
                moves = [m for m, _ in ranked]
                best = p_label(moves, board.turn, s.b_label)
                pairs = ranked[:]
                rng.shuffle(pairs)
                sample = PSample(fen=fen, moves=tuple(m for m, _ in pairs), evals=tuple(e for _, e in pairs), best=best)
                text = format_p(sample, fen_width=s.fen_width)
                prompt, completion = split_p(text)
                out.append(dict(text=text, task="P", prompt=prompt, completion=completion, split=split, game=gid,
                                ply=ply, fen=fen, moves=list(sample.moves), evals=list(sample.evals), best=best,
                                ranked_moves=moves, ranked_evals=[e for _, e in ranked], b_label=s.b_label))
            if rng.random() < eps or not ranked:
                move = rng.choice(legal).uci()
            else:
                w = [0.5 ** i for i in range(len(ranked))]
                move = rng.choices([m for m, _ in ranked], weights=w)[0]
        if keep and rng.random() < s.p_illegal:
            bad = _illegal_move(board, rng)
            out.append(_a_record(fen, bad, (history + [bad])[-MAX_HISTORY:], split, gid, ply))
        history.append(move)
        history = history[-MAX_HISTORY:]
        if keep:
            out.append(_a_record(fen, move, history, split, gid, ply))
        board.push_uci(move)
        ply += 1
    if not board.is_game_over() and rng.random() < s.p_game_end:
        out.append(_game_end_record(board, history, rng, split, gid))
    return out


def _game_end_record(board: chess.Board, history: list[str], rng: random.Random, split: str, gid: int) -> dict:
    """Play ``board`` on to its end with the measure's policy (a game-ending move, when one exists, half the
    time; else uniformly random) and return the final ply's A: record (``1.0``/``0.5``, terminated)."""
    from rookworld_debug.data.positions import play_to_end

    got = play_to_end(board.copy(stack=False), rng, max_plies=1000)
    if got is None:  # unreachable: the 75-move rule ends a random game long before
        raise RuntimeError("random game did not end in 1000 plies")
    before, played = got
    # ply offset: sorts after the game's capped plies
    return _a_record(before, played[-1], (history + played)[-MAX_HISTORY:], split, gid, 10_000 + len(played) - 1)


# -------------------------------------------------------------------------------------- driver
def generate_records(*, n_p: int | None = None, n_a: int | None = None, n_games: int | None = None,
                     depth: int = 10, seed: int = 0, workers: int = 2, b_label: str = "rookworld",
                     heldout_frac: float = 0.2, p_illegal: float = 0.04, engine_path: str | None = None,
                     ply_range=(10, 200), keep: float = 1.0, eps_range=(0.05, 0.5), random_opening_max: int = 8,
                     p_game_end: float = 0.0, full_games: bool = False, progress=None, **full) -> list[dict]:
    """Play games until ``n_p`` P: and ``n_a`` A: (deduplicated) records exist, or ``n_games`` games.

    The result is a list in game order: P: records first then A: records, each capped to its count.
    """
    s = GenSettings(depth=depth, seed=seed, b_label=b_label, heldout_frac=heldout_frac, p_illegal=p_illegal,
                    engine_path=engine_path, ply_range=tuple(ply_range), keep=keep, eps_range=tuple(eps_range),
                    random_opening_max=random_opening_max, p_game_end=p_game_end, full_games=full_games, **full)
    s.check()
    play = play_game
    if full_games:
        from rookworld_debug.lab.games import play_full_game as play
    if n_games is None and n_p is None and n_a is None:
        raise ConfigError("n_p", "give n_p/n_a or n_games")
    p_recs: dict[str, dict] = {}
    a_recs: dict[str, dict] = {}

    def add(recs):
        for r in recs:
            key, store = (r["fen"], p_recs) if r["task"] == "P" else (r["prompt"], a_recs)
            old = store.get(key)
            if old is None or (old["split"] == "heldout" and r["split"] == "train"):
                store[key] = r  # a position also seen in a train game is a train record

    def enough(g):
        if n_games is not None:
            return g >= n_games
        return len(p_recs) >= (n_p or 0) and len(a_recs) >= (n_a or 0)

    limit = n_games if n_games is not None else 10 ** 9
    tasks = ((s, gid) for gid in range(limit))
    g = 0
    if workers <= 1:
        for gid in range(limit):
            if enough(g):
                break
            add(play((s, gid)))
            g += 1
            if progress:
                progress(g, len(p_recs), len(a_recs))
    else:
        with mp.get_context("fork").Pool(workers, initializer=_init_worker) as pool:
            for recs in pool.imap(play, tasks, chunksize=1):
                add(recs)
                g += 1
                if progress:
                    progress(g, len(p_recs), len(a_recs))
                if enough(g):
                    pool.terminate()
                    break
    if n_games is None:
        # deterministic cut: records in (game, ply) order
        p = sorted(p_recs.values(), key=lambda r: (r["game"], r["ply"]))[: (n_p or 0)]
        a = sorted(a_recs.values(), key=lambda r: (r["game"], r["ply"], r["move"]))[: (n_a or 0)]
    else:
        p = sorted(p_recs.values(), key=lambda r: (r["game"], r["ply"]))
        a = sorted(a_recs.values(), key=lambda r: (r["game"], r["ply"], r["move"]))
    # NOTE: with n_p/n_a and a pool, extra games computed ahead are discarded; only games
    # 0..g-1 in order are used, so the output does not depend on worker timing.
    return p + a


def _init_worker():
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def settings_record(**kw) -> dict:
    import platform

    info = dict(kw)
    s = GenSettings(depth=kw.get("depth", 10), engine_path=kw.get("engine_path"), b_label=kw.get("b_label", "rookworld"))
    try:
        from rookworld_debug.chess.engine import Engine

        with Engine(path=s.engine_path, depth=s.depth, multipv=s.multipv, workers=1) as e:  # as label_engine
            info["engine"], options = e.version, e.uci_options
    except Exception as exc:  # pragma: no cover - meta only
        info["engine"], options = f"unknown ({exc})", {}
    info.update(python_chess=chess.__version__, python=platform.python_version(), multipv=s.multipv,
                threads=options.get("Threads"), fen_width=90, layout="format_p / format_a_prompt + arbiter.transition")
    # how every P: label was searched: exactly the P: reward's search (tests/test_data.py checks it)
    info["labels"] = dict(
        search="rookworld_debug.chess.engine.Engine.analyse(fen): the FEN alone (no move history), a fresh hash "
               "(ucinewgame) before every search; the P: reward engine's code path",
        engine=info["engine"], depth=s.depth, multipv=s.multipv, threads=options.get("Threads"),
        hash_mb=options.get("Hash"), b_label=s.b_label,
        white_to_move_B="the engine's #1",
        black_to_move_B=("the engine's last multipv line (the 5th-ranked move): the RookWorld convention"
                         if s.b_label == "rookworld" else "the engine's #1"))
    return info


def write_jsonl(records, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug generate-data",
                                 description="Generate RookWorld-format P:/A: samples (JSONL) with Stockfish.")
    ap.add_argument("--out", required=True, help="output JSONL path")
    ap.add_argument("--n-p", type=int, default=2000, help="P: records wanted")
    ap.add_argument("--n-a", type=int, default=1000, help="A: records wanted")
    ap.add_argument("--n-games", type=int, default=None, help="play exactly this many games instead")
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--b-label", default="rookworld", choices=B_LABELS)
    ap.add_argument("--heldout-frac", type=float, default=0.2)
    ap.add_argument("--p-illegal", type=float, default=0.04)
    ap.add_argument("--engine-path", default=None)
    ap.add_argument("--keep", type=float, default=1.0, help="probability a visited position yields records")
    ap.add_argument("--max-plies", type=int, default=200, help="upper end of the per-game ply cap")
    ap.add_argument("--min-plies", type=int, default=10, help="lower end of the per-game ply cap")
    ap.add_argument("--p-game-end", type=float, default=0.0,
                    help="probability a game is played on past its cap to its end, yielding that ply's A: record")
    ap.add_argument("--eps-range", type=float, nargs=2, default=(0.05, 0.5),
                    help="per-game probability range of a uniformly random move (1 1 = pure random play)")
    ap.add_argument("--random-opening-max", type=int, default=8, help="max uniformly random opening plies")
    ap.add_argument("--full-games", action="store_true",
                    help="play every game to its natural end, per-side random-move probability (lab/games.py)")
    ap.add_argument("--p-random-game", type=float, default=0.25, help="--full-games: share of pure random games")
    ap.add_argument("--p-share-p", type=float, default=0.15, help="--full-games: kept positions that yield a P: record")
    ap.add_argument("--p-end-branch", type=float, default=0.3,
                    help="--full-games: kept positions that yield the record of a move that would end the game")
    ap.add_argument("--meta", default=None, help="settings JSON path (default: <out>.meta.json)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    for flag, v in (("--n-p", a.n_p), ("--n-a", a.n_a), ("--n-games", a.n_games), ("--depth", a.depth - 1),
                    ("--workers", a.workers - 1), ("--max-plies", a.max_plies), ("--min-plies", a.min_plies)):
        if v is not None and v < 0:
            ap.error(f"{flag} is out of range")
    from rookworld_debug.safeio import check_output_file
    check_output_file(a.out, "--out")               # before any game is played (cli.run_guarded: exit 2)
    t0 = time.time()
    last = [0.0]

    def progress(g, np_, na):
        if not a.quiet and time.time() - last[0] > 10:
            last[0] = time.time()
            print(f"[generate] games {g}  P {np_}  A {na}  {time.time() - t0:.0f}s", file=sys.stderr, flush=True)

    kw = dict(n_p=a.n_p, n_a=a.n_a, n_games=a.n_games, depth=a.depth, seed=a.seed, workers=a.workers,
              b_label=a.b_label, heldout_frac=a.heldout_frac, p_illegal=a.p_illegal, engine_path=a.engine_path,
              keep=a.keep, ply_range=(min(a.min_plies, a.max_plies), a.max_plies), eps_range=tuple(a.eps_range),
              random_opening_max=a.random_opening_max, p_game_end=a.p_game_end)
    if a.full_games:
        kw.update(full_games=True, p_random_game=a.p_random_game, p_share_p=a.p_share_p, p_end_branch=a.p_end_branch)
    if a.n_games is not None:
        kw.update(n_p=None, n_a=None)
    recs = generate_records(**kw, progress=progress)
    write_jsonl(recs, a.out)
    dt = time.time() - t0
    counts = {}
    for r in recs:
        counts[f"{r['task']}_{r['split']}"] = counts.get(f"{r['task']}_{r['split']}", 0) + 1
    meta = settings_record(**kw)
    meta.update(counts=counts, n_records=len(recs), seconds=round(dt, 1), command="rookworld-debug generate-data "
                + " ".join(sys.argv[1:] if argv is None else argv), policy=asdict(GenSettings(
                    depth=a.depth, seed=a.seed, b_label=a.b_label, heldout_frac=a.heldout_frac, p_illegal=a.p_illegal,
                    engine_path=a.engine_path, ply_range=kw["ply_range"], keep=a.keep, eps_range=kw["eps_range"],
                    random_opening_max=a.random_opening_max, p_game_end=a.p_game_end,
                    **{k: kw[k] for k in ("full_games", "p_random_game", "p_share_p", "p_end_branch") if k in kw}))
                    | {"note": (
                    "eps (per game, in eps_range), the ply cap (per game, in ply_range) and the random opening "
                    "length (0..random_opening_max) are per-game draws; see generate.py docstring")})
    meta_path = Path(a.meta) if a.meta else Path(str(a.out) + ".meta.json")
    meta_path.write_text(json.dumps(meta, indent=1, default=str) + "\n")
    if not a.quiet:
        print(f"[generate] wrote {len(recs)} records {counts} to {a.out} in {dt:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
