"""Stockfish wrapper against the real binary: conventions, determinism, cache, pool, crash recovery."""
import itertools
import os
import signal

import pytest

from rookworld_debug.chess import engine as engine_mod
from rookworld_debug.chess.engine import Analysis, Engine, EngineStats, find_stockfish
from rookworld_debug.chess.formats import parse_p
from rookworld_debug.errors import ConfigError, EngineNotFound, FormatError

try:
    STOCKFISH = find_stockfish()
except EngineNotFound:  # pragma: no cover - the set-up script installs it
    STOCKFISH = None
pytestmark = pytest.mark.skipif(STOCKFISH is None, reason="Stockfish not installed")

MATE_IN_1 = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"                 # Ra8#
FOOLS_MATED = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"
STALEMATED = "7k/8/6QK/8/8/8/8/8 b - - 0 1"
LICHESS_EP = "r4rk1/1p2qpp1/2p4p/3nbB2/p2P4/1P2PR2/PBQ3PP/5RK1 b - d3 0 1"


@pytest.fixture(scope="module")
def engine():
    with Engine(depth=10, multipv=5, workers=2) as e:
        yield e


@pytest.fixture(scope="module")
def val_fens(fixtures_dir):
    return [parse_p(line).fen for line in (fixtures_dir / "rook_p_lines.txt").read_text().splitlines()]


def test_find_stockfish_order_and_errors(monkeypatch, tmp_path):
    assert find_stockfish(STOCKFISH) == STOCKFISH
    monkeypatch.setenv("ROOKWORLD_STOCKFISH", STOCKFISH)
    assert find_stockfish() == STOCKFISH
    monkeypatch.setenv("ROOKWORLD_STOCKFISH", str(tmp_path / "nope"))
    with pytest.raises(EngineNotFound, match="apt-get install"):
        find_stockfish()                                   # a configured path never falls back
    with pytest.raises(EngineNotFound):
        find_stockfish(tmp_path / "missing-stockfish")
    monkeypatch.delenv("ROOKWORLD_STOCKFISH")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(engine_mod, "SEARCH_PATHS", (str(tmp_path / "sf"),))
    with pytest.raises(EngineNotFound) as info:
        find_stockfish()
    assert info.value.searched == ["stockfish (PATH)", str(tmp_path / "sf")]
    with pytest.raises(EngineNotFound):
        Engine()


def test_version_and_bad_settings(engine):
    assert engine.version.startswith("Stockfish")
    with pytest.raises(ConfigError, match="engine.depth"):
        Engine(depth=0)


def test_analysis_conventions_match_the_data(engine):
    a = engine.analyse(MATE_IN_1)
    assert isinstance(a, Analysis) and (a.depth, a.multipv, len(a.moves)) == (10, 5, 5)
    assert a.moves[0] == "a1a8" and a.scores[0] == 999.99          # mate in 1 = (100000 − 1)/100
    assert a.scores == tuple(sorted(a.scores, reverse=True))
    black = engine.analyse("8/3R4/p6k/b2N4/8/7P/6K1/3q4 b - - 1 55")  # black winning: positive
    assert black.value > 3


def test_terminal_positions_are_not_searched(engine):
    mated = engine.analyse(FOOLS_MATED)
    assert (mated.terminal, mated.moves, mated.value) == ("checkmate", (), -1000.0)
    assert engine.analyse(STALEMATED).terminal == "stalemate" and engine.analyse(STALEMATED).value == 0.0


def test_eval_after_moves_is_from_the_movers_view(engine):
    evals = engine.eval_after_moves(MATE_IN_1, ["a1a8", "a1a2", "zz", "e2e4", "g1h1"])
    assert evals[0] == 1000.0 and evals[2] is None and evals[3] is None
    assert 0 < evals[1] < 10 and 0 < evals[4] < 10                 # white is a rook up
    before = engine.stats
    assert engine.eval_after_moves(MATE_IN_1, ["g1h1"]) == [evals[4]]
    assert (engine.stats - before).cache_hits == 1


def test_lichess_ep_square_is_normalised_into_the_cache_key(engine):
    a = engine.analyse(LICHESS_EP, multipv=1)
    assert a.fen == LICHESS_EP.replace(" d3 ", " - ")
    before = engine.stats
    assert engine.analyse(a.fen, multipv=1) == a and (engine.stats - before).cache_hits == 1


@pytest.mark.parametrize("bad", ["", "garbage", "8/8/8/8/8/8/8/8 w - - 0 1", "k7/8/8/8/8/8/8/K6R b - - 0 1x"])
def test_malformed_fen_is_a_format_error_and_the_engine_survives(engine, bad):
    with pytest.raises(FormatError):
        engine.analyse_many([MATE_IN_1, bad])
    assert engine.analyse(MATE_IN_1).moves[0] == "a1a8"


def test_cache_pool_and_sequential_results_are_identical(val_fens):
    fens = val_fens[:6]
    batch = fens + fens[:3]                                         # repeats inside the batch
    with Engine(workers=1, cache=False) as seq, Engine(workers=2) as pooled:
        expected = seq.analyse_many(batch)
        assert seq.stats.cache_misses == len(batch) and seq.stats.cache_hits == 0
        first = pooled.analyse_many(batch)
        s = pooled.stats
        assert (s.calls, s.cache_hits, s.cache_misses) == (9, 3, 6)
        second = pooled.analyse_many(batch)
        assert (pooled.stats - s) == EngineStats(calls=9, cache_hits=9, seconds=(pooled.stats - s).seconds)
        assert expected == first == second
        assert [a.fen for a in first] == batch
        assert len(set(pooled.pids())) == 2


def test_per_position_multipv(engine):
    one, five = engine.analyse_many([MATE_IN_1, MATE_IN_1], multipv=[1, 5])
    assert (len(one.moves), len(five.moves)) == (1, 5) and one.moves[0] == five.moves[0]
    with pytest.raises(ConfigError):
        engine.analyse_many([MATE_IN_1], multipv=[1, 2])


def test_killed_engine_is_restarted_and_the_batch_completes(val_fens):
    fens = val_fens[:16]
    with Engine(depth=8, multipv=3, workers=1, cache=False) as ref:
        expected = ref.analyse_many(fens)
    with Engine(depth=8, multipv=3, workers=2) as e:
        victim, search, started = e.pids()[0], e._search, itertools.count()

        def search_then_kill(key):                   # SIGKILL one engine when the 4th search starts
            if next(started) == 3:
                os.kill(victim, signal.SIGKILL)
            return search(key)

        e._search = search_then_kill
        got = e.analyse_many(fens)
        assert e.stats.restarts >= 1 and victim not in e.pids()
        assert got == expected
