"""Board SVG views (never raise) and warning banners."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from rookworld_debug.viz.banners import Flag, flags_from_records, warning_banner
from rookworld_debug.viz.board import (ILLEGAL, ILLEGAL_BEST, LEGAL, LEGAL_BEST, board_from_a, board_from_p,
                                       board_from_prompt, board_view)

FEN = "2k4r/ppp1q1p1/nbb1N3/4PP2/3p2P1/PB5P/1PPK3R/3RQ3 b - - 3 26"
P_PROMPT = "P: " + FEN
P_COMPLETION = " " * 31 + "M: a6c5 c6d7 c8b8 h8e8 d4d3      E: -3.37 -3.37 -3.37 -3.37 -3.37           B: c6d7"
A_PROMPT = "A: rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1+a7a5+b2b3 a7a5+"
A_EXPECTED = "rnbqkbnr/1ppppppp/8/p7/8/1P6/P1PPPPPP/RNBQKBNR w KQkq - 0 2"


def line_tags(svg: str, color: str) -> list[str]:
    return re.findall(r'<line [^>]*stroke="' + re.escape(color) + r'"[^>]*>', svg)


def test_p_board_draws_candidates_and_thicker_best():
    v = board_from_p(P_PROMPT, P_COMPLETION)
    assert v.error is None and v.svg.startswith("<svg")
    assert dict(v.moves) == {"a6c5": "legal", "c6d7": "legal", "c8b8": "legal", "h8e8": "legal", "d4d3": "legal"}
    assert len(line_tags(v.svg, LEGAL)) == 4 and len(line_tags(v.svg, LEGAL_BEST)) == 1
    assert 'stroke-width="15"' in line_tags(v.svg, LEGAL_BEST)[0]
    assert v._repr_svg_() == v.svg and v.svg in v._repr_html_()
    assert "black to move" in v.html and "B: c6d7 ✓" in v.html


def test_illegal_moves_red_and_dashed_and_non_uci_listed():
    v = board_view(FEN, ["e2e4", "zz9", "a6c5"], best="h8h1")
    status = dict(v.moves)
    assert status == {"e2e4": "illegal", "zz9": "not UCI", "a6c5": "legal", "h8h1": "illegal"}
    assert all("stroke-dasharray" in t for t in line_tags(v.svg, ILLEGAL) + line_tags(v.svg, ILLEGAL_BEST))
    assert len(line_tags(v.svg, ILLEGAL_BEST)) == 1 and "zz9 ?" in v.html


@pytest.mark.parametrize("fen", ["", "not a fen", None, "8/8/8 w - - 0 1", 42, "rnbqkbnr/pppppppp/8/8/8/8 w"])
def test_malformed_fen_renders_error_box_never_raises(fen):
    v = board_view(fen, ["e2e4"])
    assert v.error and v.svg is None and v._repr_svg_() is None
    assert "cannot draw board" in v._repr_html_() and 'role="alert"' in v.html


def test_malformed_moves_never_raise():
    for moves in (None, [None, 3, "e2e4"], ["", "0000", "e2e9", "a1a1"]):
        v = board_view("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", moves)
        assert v.error is None


def test_impossible_position_draws_with_warning():
    v = board_view("8/8/8/8/8/8/8/8 w - - 0 1", ["a1a2"])
    assert v.error is None and "impossible" in v.html


def test_p_board_from_garbage_completion():
    v = board_from_p(P_PROMPT, "M: zz a6c5 B:")
    assert v.error is None and ("zz", "not UCI") in v.moves and ("a6c5", "legal") in v.moves
    assert board_from_p("P: nonsense", "garbage").error


def test_a_board_shows_move_and_diff_against_expected():
    good = board_from_a(A_PROMPT, A_EXPECTED + "+0.001+0+0", expected_fen=A_EXPECTED)
    assert good.error is None and good.moves == (("a7a5", "legal"),)
    assert "0 square(s) differ" in good.html
    bad = board_from_a(A_PROMPT, A_EXPECTED.replace("1ppppppp/8/p7", "pppppppp/8/p7") + "+0.001+0+0",
                       expected_fen=A_EXPECTED)
    assert "1 square(s) differ" in bad.html
    assert board_from_a("A: garbage", "x").error
    assert board_from_a(A_PROMPT, "").error            # empty completion: right board is an error box, no raise
    assert board_from_prompt(A_PROMPT, "x").html and board_from_prompt(P_PROMPT, P_COMPLETION).error is None


# ----------------------------------------------------------------------------------------- banners
def test_banner_lists_flags_errors_first():
    html = warning_banner([Flag("zero_std", "2 of 4 groups", "warning"), ("nan", "NaN in loss", "error"),
                           "plain text flag", {"code": "truncated", "message": "1 of 8", "severity": "info"}]).html
    codes = re.findall(r'data-code="([^"]+)"', html)
    assert codes[0] == "nan" and set(codes) == {"nan", "zero_std", "flag", "truncated"}
    assert "rw-error" in html and "1 error, 2 warnings, 1 info" in html
    assert "✖" in html and "ERROR" in html                 # severity spelled, not colour only


def test_banner_all_clear_and_escaping():
    assert "no flags" in warning_banner([]).html and warning_banner([], show_ok=False).html == ""
    html = warning_banner({"x": "<img src=x onerror=alert(1)>"}).html
    assert "<img" not in html and "&lt;img" in html


def fake_records():
    N, T, G = 4, 3, 2
    rollout = SimpleNamespace(
        completion_mask=np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]]),
        per_token_logps=np.array([[-0.1, np.nan, 0], [-0.1, -0.2, -0.3], [-0.1, np.nan, 0], [0, 0, 0]]),
        ref_per_token_logps=np.zeros((N, T)), per_token_entropy=np.zeros((N, T)), per_token_full_kl=None,
        is_truncated=np.array([True, True, True, True]), completions=("M: a", "M: b", "", "x"),
        prompts=("P: fen0",) * G + ("P: fen1",) * G, logp_diff_flagged=True, max_abs_logp_diff=0.3,
        warnings=("something odd",))
    adv = SimpleNamespace(zero_std_groups=(0, 1), num_generations=G, rewards=np.array([0.2, 0.2, 1.0, 1.0]), B=2,
                          flags=("all groups have zero reward std: no policy-gradient signal from them",
                                 "2 advantage(s) clipped at ±2"))
    loss = SimpleNamespace(loss=np.float32("nan"), pg_loss=0.0, kl_loss=0.0, entropy_term=0.0, flags=())
    setup = SimpleNamespace(invariants=SimpleNamespace(ok=False, failures=("KL at step 0 is 0.1, not 0",)))
    return rollout, adv, loss, setup


def test_flags_from_records_cover_the_usual_suspects():
    rollout, adv, loss, setup = fake_records()
    flags = flags_from_records(rollout=rollout, advantages=adv, loss=loss, setup=setup)
    by = {f.code: f for f in flags}
    assert "nan" in by and by["nan"].severity == "error"
    nan_logps = [f for f in flags if f.code == "nan" and "per_token_logps" in f.message][0]
    assert "rows [0]" in nan_logps.where            # row 2's NaN is masked → not a problem
    assert by["all_truncated"].severity == "warning"
    assert "rows [2, 3]" in by["empty_completion"].where
    assert by["recompute_mismatch"].severity == "error"
    assert by["zero_std"].severity == "error" and "P:␣fen0 rewards [0.2, 0.2]" in by["zero_std"].message
    assert by["invariant"].message.startswith("KL at step 0")
    msgs = [f.message for f in flags]
    assert "2 advantage(s) clipped at ±2" in msgs and "something odd" in msgs
    assert not any("signal from them" in m for m in msgs)   # record sentence replaced by the richer flag
    html = warning_banner(flags).html
    assert html.count('class="rw-flag') == len(flags)


def test_flags_from_clean_records_is_empty():
    rollout = SimpleNamespace(completion_mask=np.ones((2, 2)), per_token_logps=np.zeros((2, 2)),
                              is_truncated=np.array([False, False]), completions=("a", "b"))
    assert flags_from_records(rollout=rollout) == []
