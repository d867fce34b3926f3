"""A: ground truth (ArbiterSim semantics) against the real opening prompts and hand cases."""
import json

import chess
import pytest

from rookworld_debug.chess.arbiter import ATransition, expected_a_completion, transition
from rookworld_debug.chess.formats import format_a_prompt
from rookworld_debug.errors import FormatError

START = chess.STARTING_FEN


def test_all_opening_prompts_match_expected_fen(fixtures_dir):
    records = json.loads((fixtures_dir / "a_task_openings.json").read_text())
    assert len(records) == 870
    for r in records:
        assert expected_a_completion(r["prompt"]) == f"{r['expected_fen']}+0.001+0+0", r["prompt"]


def test_real_model_prompt_from_k8_fixture(fixtures_dir):
    sample = json.loads((fixtures_dir / "model_completions_k8.json").read_text())["sample_results"][2]
    assert expected_a_completion(sample["prompt"]) == sample["completions"][0]


def test_fools_mate_wins():
    fen = "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2"
    t = transition(fen, "d8h4", ["f2f3", "e7e5", "g2g4", "d8h4"])
    assert t == ATransition("rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3",
                            "1.0", 1, 0, True, "checkmate")
    assert t.completion.endswith("+1.0+1+0")


def test_stalemate_and_insufficient_material_draw():
    stalemate = transition("7k/8/5K2/6Q1/8/8/8/8 w - - 0 1", "g5g6")
    assert (stalemate.reward, stalemate.terminated, stalemate.outcome) == ("0.5", 1, "stalemate")
    bare = transition("8/8/8/4k3/8/8/3n4/4K3 w - - 0 50", "e1d2")  # K takes the last knight
    assert (bare.reward, bare.terminated, bare.outcome) == ("0.5", 1, "insufficient_material")


def test_seventyfive_move_rule_from_halfmove_clock():
    t = transition("8/8/8/4k3/8/8/3R4/4K3 w - - 149 120", "d2d3")
    assert (t.reward, t.terminated, t.outcome, t.new_fen.split()[4]) == ("0.5", 1, "seventyfive_moves", "150")


def test_promotion_and_castling_and_en_passant():
    promo = transition("8/4P1k1/8/8/8/8/8/4K3 w - - 0 60", "e7e8q")
    assert promo.new_fen == "4Q3/6k1/8/8/8/8/8/4K3 b - - 0 60" and promo.reward == "0.001"
    under = transition("8/4P1k1/8/8/8/8/8/4K3 w - - 0 60", "e7e8n")
    assert under.new_fen.startswith("4N3/")
    assert not transition("8/4P1k1/8/8/8/8/8/4K3 w - - 0 60", "e7e8").legal  # promotion piece needed
    castle = transition("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1g1")
    assert castle.new_fen == "r3k2r/8/8/8/8/8/8/R4RK1 b kq - 1 1"
    assert transition("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 0 1", "e8c8").new_fen == \
        "2kr3r/8/8/8/8/8/8/R3K2R w KQ - 1 2"
    # python-chess (and so the generator) also reads king-takes-rook as castling
    assert transition("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1h1").new_fen == castle.new_fen
    # double push with a capturable ep square → written; without a capturer → "-" (python-chess default)
    assert transition("4k3/8/8/8/3p4/8/4P3/4K3 w - - 0 1", "e2e4").new_fen.split()[3] == "e3"
    assert transition("4k3/8/8/8/8/8/4P3/4K3 w - - 0 1", "e2e4").new_fen.split()[3] == "-"
    ep = transition("4k3/8/8/8/3pP3/8/8/4K3 b - e3 0 1", "d4e3")
    assert ep.new_fen == "4k3/8/8/8/8/4p3/8/4K3 w - - 0 2" and ep.legal


def test_lichess_dead_ep_square_is_normalised():
    fen = "r4rk1/1p2qpp1/2p4p/3nbB2/p2P4/1P2PR2/PBQ3PP/5RK1 b - d3 0 1"
    illegal = transition(fen, "a1a2")
    assert illegal.new_fen == fen.replace(" d3 ", " - ")


@pytest.mark.parametrize("move,outcome", [
    ("e2e5", "illegal_move"), ("e7e5", "illegal_move"), ("0000", "illegal_move"),
    ("zz", "unparsable_move"), ("", "unparsable_move"), ("e2e4 ", "unparsable_move"),
    ("E2E4", "unparsable_move"), (None, "unparsable_move"),
])
def test_illegal_and_garbage_moves_truncate(move, outcome):
    t = transition(START, move)
    assert t == ATransition(START, "-1.0", 0, 1, False, outcome)


def test_illegal_move_in_a_prompt():
    assert expected_a_completion(format_a_prompt(START, "e2e5", ["e2e5"])) == f"{START}+-1.0+0+1"
    assert expected_a_completion(f"A: {START}+hello+hello+") == f"{START}+-1.0+0+1"


def test_move_on_finished_game_is_illegal_and_terminated():
    mated = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"
    assert transition(mated, "e2e4").completion == f"{mated}+-1.0+1+1"


@pytest.mark.parametrize("fen", ["", "garbage", "8/8/8/8/8/8/8/8 w - - 0 1",
                                 "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR x KQkq - 0 1"])
def test_malformed_prompt_fen_raises_format_error(fen):
    with pytest.raises(FormatError):
        transition(fen, "e2e4")
    with pytest.raises(FormatError):
        expected_a_completion(f"A: {fen}+e2e4+e2e4+")
