"""The fresh random-play evaluation (data.positions) and `rookworld-debug measure` on it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import chess
import pytest

from rookworld_debug.chess.formats import parse_a_prompt
from rookworld_debug.data.positions import a_cases, overlap, random_play_positions
from rookworld_debug.lab.measure import p_metrics, wilson

ROOT = Path(__file__).resolve().parents[1]


def test_positions_are_seeded_distinct_and_legal():
    a = random_play_positions(40, seed=3)
    assert a == random_play_positions(40, seed=3)
    assert a != random_play_positions(40, seed=4)
    assert len({f for f, _ in a}) == 40
    for fen, hist in a:
        board = chess.Board()
        for m in hist:
            board.push_uci(m)  # the history replays legally to the position
        assert board.fen() == fen and not board.is_game_over()


def test_a_cases_cover_illegal_and_game_end_with_arbiter_labels():
    cases = a_cases(60, seed=11, p_illegal=0.2, p_game_end=0.2)
    kinds = Counter(c.kind for c in cases)
    assert kinds["illegal"] > 0 and kinds["game_end"] > 0 and kinds["legal"] > 0
    for c in cases:
        ap = parse_a_prompt(c.prompt)
        fields = c.expected.split("+")
        if c.kind == "illegal":
            assert fields[1:] == ["-1.0", "0", "1"] and fields[0] == ap.fen
        elif c.kind == "game_end":
            assert fields[2] == "1" and fields[1] in ("1.0", "0.5")
        else:
            board = chess.Board(ap.fen)
            board.push_uci(ap.move)
            assert fields[0] == board.fen()


def test_p_metrics_and_wilson():
    fen = chess.STARTING_FEN
    good = " M: e2e4 d2d4 g1f3 c2c4 b1c3 E: 0.3 0.3 0.2 0.2 0.1 B: e2e4"
    m = p_metrics(fen, good)
    assert m == dict(well_formed=True, well_formed_distinct=True, all5_legal=True, best_legal=True)
    bad = " M: e2e5 d2d4 g1f3 c2c4 b1c3 E: 0.3 0.3 0.2 0.2 0.1 B: e7e5"
    m = p_metrics(fen, bad)
    assert m["well_formed"] and not m["all5_legal"] and not m["best_legal"]
    lo, hi = wilson(80, 100)
    assert lo < 0.8 < hi and 0.70 < lo and hi < 0.88
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    assert overlap(["a", "b"], {"a"}) == 0.5


@pytest.mark.slow                       # the measure command as a subprocess, about 25 s
def test_measure_cli_on_fresh_positions_exits_with_rates(tmp_path):
    out = tmp_path / "m.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    # `--model tiny` as the README writes it (the positional form is the same)
    r = subprocess.run([sys.executable, "-m", "rookworld_debug.lab.measure", "--model", "tiny", "--n-positions", "3",
                        "--group-size", "2", "--seed", "5", "--threads", "1", "--json", str(out),
                        "--n-per-band", "2", "--n-real-p", "3", "--real-p", str(ROOT.parent / "shared" / "fixtures" /
                                                                                "rook_p_lines.txt")],
                       cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res["rates"]) == {"p_well_formed", "p_best_legal", "p_all5_legal", "p_greedy_well_formed",
                                 "a_greedy_exact"}
    assert res["rates"]["p_well_formed"]["n"] == 6 and res["rates"]["a_greedy_exact"]["n"] == 3
    for r_ in res["rates"].values():
        assert 0 <= r_["ci95"][0] <= r_["value"] <= r_["ci95"][1] <= 1
    assert "p_greedy_well_formed" in r.stdout and "n=" in r.stdout and "model tiny" in r.stdout
    # by band of game length (a second generator) and by kind, each with n and an interval
    assert set(res["bands"]["by_band"]) == {"1-20", "21-40", "41-60", "61-80", "81+"}
    assert all(b["n"] == 2 for b in res["bands"]["by_band"].values()) and "band_a_cases" in res["bands"]["generator"]
    assert "a_band_exact[81+]" in r.stdout
    if (ROOT.parent / "shared" / "fixtures" / "rook_p_lines.txt").is_file():
        assert res["real_p"]["real_p_best_legal"]["n"] == 6 and "real_p_all5_legal" in r.stdout


def test_well_formed_is_the_grammar_and_strict_also_rejects_repeats():
    fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    pad = " " * (90 - len(fen))
    repeated = pad + "M: e2e4 e2e4 e2e4 e2e4 e2e4      E: 0.3 0.3 0.3 0.3 0.3           B: e2e4"
    distinct = pad + "M: e2e4 d2d4 g1f3 c2c4 b1c3      E: 0.3 0.3 0.2 0.2 0.1           B: e2e4"
    m = p_metrics(fen, repeated)
    assert m["well_formed"] and not m["well_formed_distinct"] and not m["all5_legal"] and m["best_legal"]
    m = p_metrics(fen, distinct)
    assert m["well_formed"] and m["well_formed_distinct"] and m["all5_legal"]
    for bad in ("", "garbage", pad + "M: e2e4 E: 0.3 0.1 B: e2e4", pad + "M: e2e4      E: x      B: e2e4"):
        assert not p_metrics(fen, bad)["well_formed"], bad
