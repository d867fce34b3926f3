"""P:/A: formats against the real RookWorld lines and hand-written edge cases."""
import pytest

from rookworld_debug.chess.formats import (
    ACompletion, APrompt, ASample, FenDiff, PSample, fen_diff, format_a, format_a_prompt, format_p,
    p_prompt, parse_a, parse_a_completion, parse_a_prompt, parse_p, parse_p_completion, split_p)
from rookworld_debug.errors import FormatError

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
AFTER_B3 = "rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1"
A_LINE = ("A: 8/2k2b2/R1p4r/3p1p2/P7/2P2B1P/5PPK/4R3 w - - 1 31+a6a5+f7e7 h5f3 e6f7 b1b6 h8h6 a1e1 "
          "e7d8 b6a6 d8c7 a6a5+8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0")


@pytest.fixture(scope="module")
def p_lines(fixtures_dir):
    return (fixtures_dir / "rook_p_lines.txt").read_text().splitlines()


def test_every_fixture_line_round_trips_byte_for_byte(p_lines):
    assert len(p_lines) == 250
    for line in p_lines:
        assert format_p(parse_p(line), fen_width=89) == line


def test_generator_width_90_puts_m_at_column_93(p_lines):
    sample = parse_p(p_lines[0])
    line = format_p(sample)
    assert line.index("M: ") == 93 and parse_p(line) == sample
    assert line.index("E: ") == 93 + 33 and line.index("B: ") == 93 + 33 + 43


def test_parse_p_keeps_eval_spelling():
    s = parse_p("P: 8/3R4/p6k/b2N4/8/7P/6K1/3q4 b - - 1 55   M: d1e2 d1c2 h6g5 a5e1 d1d2 "
                "E: 999.85 999.83 999.81 999.83 999.8  B: d1d2")
    assert s == PSample("8/3R4/p6k/b2N4/8/7P/6K1/3q4 b - - 1 55",
                        ("d1e2", "d1c2", "h6g5", "a5e1", "d1d2"),
                        ("999.85", "999.83", "999.81", "999.83", "999.8"), "d1d2")
    assert parse_p(f"P: {START} M: e2e4 E: -2.0 B: e2e4").evals == ("-2.0",)


@pytest.mark.parametrize("bad", [
    "", "garbage", f"P: {START}", f"P: {START} M: e2e4 E: 0.3",               # missing tags
    f"P: {START} M: e2e4 d2d4 E: 0.3 B: e2e4",                                 # count mismatch
    f"P: {START} M: e2e4 E: nan B: e2e4", f"P: {START} M: Nf3 E: 0.3 B: Nf3",  # nan, SAN
    f"P: {START} M: E: B: e2e4", "P: not/a/fen w - - 0 1 M: e2e4 E: 0.1 B: e2e4",
    "P: 8/8/8/8/8/8/8/8 w - - 0 1 M: e2e4 E: 0.1 B: e2e4",                   # no kings
])
def test_parse_p_rejects_malformed_lines(bad):
    with pytest.raises(FormatError):
        parse_p(bad)


def test_split_p_completion_includes_pad_spaces(p_lines):
    for line in p_lines[:20]:
        prompt, completion = split_p(line + "\n")
        assert prompt == p_prompt(parse_p(line).fen) and prompt + completion == line
        assert completion.startswith(" ") and completion.lstrip().startswith("M: ")
    prompt, completion = split_p(format_p(parse_p(p_lines[0])))
    assert len(prompt) - 3 + completion.index("M:") == 90    # the model generates 90 − len(FEN) spaces
    assert p_prompt(f"P: {START}   ") == f"P: {START}"


def test_parse_p_completion_well_formed_real_completion():
    c = parse_p_completion("                M: a6c5 c6d7 c8b8 h8e8 d4d3      "
                           "E: -3.37 -3.37 -3.37 -3.37 -3.37           B: c6d7")
    assert c.ok and c.moves == ("a6c5", "c6d7", "c8b8", "h8e8", "d4d3") and c.best == "c6d7"
    assert c.evals == (-3.37,) * 5


@pytest.mark.parametrize("text,problem", [
    ("", "empty"), (None, "empty"), ("hello world", "missing M:"),
    ("M: e2e4 E: 0.1", "missing B:"), ("M: e2e4 B: e2e4", "missing E:"),
    ("M: e2e4 foo E: 0.1 B: e2e4", "move not UCI"), ("M: e2e4 E: abc B: e2e4", "eval not a number"),
    ("M: e2e4 E: 0.1 B: Nf3", "best not UCI"), ("B: e2e4 M: e2e4 E: 0.1", "tags out of order"),
    ("M: e2e4 d2d4 E: 0.1 B: e2e4", "evals/moves count mismatch"),
    ("M: a2a3 a2a4 b2b3 b2b4 c2c3 c2c4 E: 0 0 0 0 0 0 B: a2a3", "more than 5 moves"),
    ("M: e2e4 E: 0.1 B: e2e4 <|endoftext|>P:", "text after B: move"),
    ("x M: e2e4 E: 0.1 B: e2e4", "text before M:"), ("M: e2e4 e2e4 E: 1 1 B: e2e4", "repeated move"),
    ("M: E: 1 B: e2e4", "no moves"),
])
def test_parse_p_completion_flags_problems_without_raising(text, problem):
    assert problem in parse_p_completion(text).problems


def test_parse_a_full_line_with_and_without_prefix():
    s = parse_a(A_LINE)
    assert isinstance(s, ASample) and s.move == "a6a5" and len(s.history) == 10 and s.history[-1] == s.move
    assert (s.reward, s.terminated, s.truncated) == ("0.001", "0", "0")
    assert format_a(s) == A_LINE and parse_a(A_LINE[3:]) == s and format_a(s, prefix=False) == A_LINE[3:]
    assert s.completion == "8/2k2b2/2p4r/R2p1p2/P7/2P2B1P/5PPK/4R3 b - - 2 31+0.001+0+0"


def test_a_prompt_round_trip():
    prompt = format_a_prompt(START, "b2b3", ["b2b3"])
    assert prompt == f"A: {START}+b2b3+b2b3+" and format_a_prompt(START, "b2b3", "b2b3") == prompt
    assert parse_a_prompt(prompt) == APrompt(START, "b2b3", ("b2b3",))
    assert parse_a_prompt(prompt[3:-1]) == APrompt(START, "b2b3", ("b2b3",))
    assert parse_a_prompt(f"A: {START}+zz+zz+").move == "zz"   # garbage moves are the arbiter's job
    assert parse_a(A_LINE).prompt == parse_a_prompt(A_LINE.rsplit("+", 4)[0] + "+")


@pytest.mark.parametrize("bad", [
    "", "A: ", f"A: {START}+e2e4+", f"A: {START}+e2e4+,+", f"A: {START}+e2e4+e2e4+{AFTER_B3}",
    f"A: {START}+e2e4+{' '.join(['e2e4'] * 11)}+", "A: 8/8 w+e2e4+e2e4+",
])
def test_parse_a_prompt_rejects_malformed(bad):
    with pytest.raises(FormatError):
        parse_a_prompt(bad)


@pytest.mark.parametrize("bad", [
    f"A: {START}+b2b3+b2b3+{AFTER_B3}+0.001+false+false",        # anchor-doc flag spelling
    f"A: {START}+b2b3+b2b3+{AFTER_B3}+x+0+0", f"A: {START}+b2b3+b2b3+{AFTER_B3}+0.001+0",
    f"A: {START}+b2b3+b2b3+8/8 b+0.001+0+0", None,
])
def test_parse_a_rejects_malformed(bad):
    with pytest.raises(FormatError):
        parse_a(bad)


def test_parse_a_completion_exact_and_garbage():
    assert parse_a_completion(f"{AFTER_B3}+0.001+0+0") == ACompletion(AFTER_B3, "0.001", "0", "0", ())
    c = parse_a_completion(f" {AFTER_B3}+1+true")
    assert {"leading whitespace", "reward not a data value", "terminated not 0/1",
            "missing truncated"} <= set(c.problems) and c.reward_value == 1.0
    assert parse_a_completion("").problems == ("empty",)
    assert "extra fields" in parse_a_completion(f"{AFTER_B3}+0.001+0+0+junk").problems
    assert "reward not a number" in parse_a_completion(f"{AFTER_B3}+abc+0+0").problems
    assert parse_a_completion("+").problems == ("missing new_fen", "missing reward", "missing terminated",
                                                "missing truncated")
    assert "fen not 6 fields" in parse_a_completion("nonsense").problems


def test_fen_diff_fields_and_garbage():
    d = fen_diff(AFTER_B3, AFTER_B3)
    assert d.exact and d.valid and d.n_fields_match == 6 and (d.white_kings, d.black_kings) == (1, 1)
    wrong_full = fen_diff(AFTER_B3, AFTER_B3[:-1] + "2")
    assert not wrong_full.exact and not wrong_full.fullmove and wrong_full.n_fields_match == 5
    assert wrong_full.fields() == {"board": True, "side": True, "castling": True, "en_passant": True,
                                   "halfmove": True, "fullmove": False}
    nine_pawns = fen_diff(AFTER_B3, "rnbqkbnr/pppppppp/8/8/8/1P6P/P1PPPP/RNBQKBNR b KQkq - 0 2")
    assert not nine_pawns.board and not nine_pawns.valid and nine_pawns.n_fields_match == 4
    two_kings = fen_diff(AFTER_B3, "rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBKKBNR b KQkq - 0 1")
    assert two_kings.white_kings == 2 and not two_kings.valid
    for garbage in ["", None, "+++", "a b c d e f g h", "\x00"]:
        g = fen_diff(AFTER_B3, garbage)
        assert isinstance(g, FenDiff) and not g.exact and not g.valid


def test_fen_diff_en_passant_convention():
    """python-chess writes ep only when capturable; lichess FENs may carry a dead ep square."""
    lichess = "r4rk1/1p2qpp1/2p4p/3nbB2/p2P4/1P2PR2/PBQ3PP/5RK1 b - d3 0 1"
    normal = "r4rk1/1p2qpp1/2p4p/3nbB2/p2P4/1P2PR2/PBQ3PP/5RK1 b - - 0 1"
    d = fen_diff(normal, lichess)
    assert d.valid and not d.en_passant and d.n_fields_match == 5
