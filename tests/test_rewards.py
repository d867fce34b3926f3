"""Reward breakdowns: hand-computed piecewise values, real fixtures, garbage that must not raise."""
import json

import chess
import pytest

from rookworld_debug.chess.arbiter import expected_a_completion
from rookworld_debug.chess.engine import Engine, find_stockfish
from rookworld_debug.chess.formats import PSample, format_a_prompt, parse_p, split_p
from rookworld_debug.chess.rewards import (
    A_WEIGHTS, BOUNDS, P_WEIGHTS, RewardBreakdown, default_p_reward_fn, score_a, score_batch, score_p,
    score_p_batch, score_p_dataset)
from rookworld_debug.errors import EngineNotFound

START = chess.STARTING_FEN
AFTER_B3 = "rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBQKBNR b KQkq - 0 1"
B3_PROMPT = format_a_prompt(START, "b2b3", ["b2b3"])
MATE_IN_1 = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"
GARBAGE = ["", "   ", "<|endoftext|>", "M:", "E: B:", "+", "++++", "\x00\x01", "P: " + START, "🙂" * 40,
           "B: a1a1", "M: e9e4 E: 1e999 B: e2e4q", None]
ODD = ["M: e2e4 E: nan B: e2e4", "M: e2e4 E: 1e999 B: e2e4", "M: e2e4 E: 0.1 B: e2e4 B: d2d4 M: x",
       "M: e2e4 e2e4 e2e4 E: 1 1 1 B: e2e4", "M:e2e4E:0.1B:e2e4" * 3]


def check_invariant(b: RewardBreakdown):
    lo, hi = BOUNDS[b.kind]
    assert set(b.components) == set(b.weights) and abs(sum(b.weights.values()) - 1) < 1e-12
    assert b.total == min(hi, max(lo, sum(b.weights[k] * b.components[k] for k in b.weights)))
    assert lo <= b.total <= hi
    return b


def completion(moves, evals, best):
    return f"M: {' '.join(moves)} E: {' '.join(map(str, evals))} B: {best}"


# -------------------------------------------------------------------------------------------- A:

def test_a_exact_completion_scores_the_max():
    b = check_invariant(score_a(B3_PROMPT, f"{AFTER_B3}+0.001+0+0"))
    assert b.total == 1.0 and set(b.components.values()) == {1.0} and b.flags == ()


def test_a_fixture_perfect_completions_and_all_openings_score_the_max(fixtures_dir):
    sample = json.loads((fixtures_dir / "model_completions_k8.json").read_text())["sample_results"][2]
    assert all(score_a(sample["prompt"], c).total == 1.0 for c in sample["completions"])
    for r in json.loads((fixtures_dir / "a_task_openings.json").read_text()):
        assert score_a(r["prompt"], f"{r['expected_fen']}+0.001+0+0").total == 1.0


@pytest.mark.parametrize("completion,total,wrong", [
    (f"{AFTER_B3[:-1]}2+0.001+0+0", 0.9, {"fullmove"}),
    ("rnbqkbnr/pppppppp/8/8/8/1P6P/P1PPPP/RNBQKBNR b KQkq - 0 2+0.001+0+0", -0.1, {"board", "fullmove"}),
    (f"{START}+0.001+0+0", -0.1, {"board", "side"}),
    (f"{AFTER_B3}+0.001+false+false", 0.7, {"format", "terminated", "truncated"}),
    (f"{AFTER_B3}+1+0+0", 0.7, {"format", "reward_value"}),                 # not a data spelling
    (f"{AFTER_B3}+0.001", 0.7, {"format", "terminated", "truncated"}),
    (f" {AFTER_B3}+0.001+0+0", 0.9, {"format"}),                           # leading space
    (AFTER_B3.replace(" KQkq ", " Kkq "), 0.4, {"format", "castling", "reward_value", "terminated",
                                                "truncated"}),
])
def test_a_field_wise_breakdown(completion, total, wrong):
    b = check_invariant(score_a(B3_PROMPT, completion))
    assert b.total == pytest.approx(total)
    assert {k for k, v in b.components.items() if v < 0} == wrong


def test_a_garbage_scores_the_min_with_flags():
    for g in GARBAGE:
        b = check_invariant(score_a(B3_PROMPT, g))
        assert b.total <= -0.8 and b.flags, g
    assert score_a(B3_PROMPT, "").total == -1.0 and score_a(B3_PROMPT, "").flags == ("empty",)
    two_kings = score_a(B3_PROMPT, "rnbqkbnr/pppppppp/8/8/8/1P6/P1PPPPPP/RNBKKBNR b KQkq - 0 1+0.001+0+0")
    assert {"invalid_fen", "king_count"} <= set(two_kings.flags)


def test_a_game_end_and_illegal_prompts():
    mate = format_a_prompt("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", "d8h4",
                           ["f2f3", "e7e5", "g2g4", "d8h4"])
    assert score_a(mate, expected_a_completion(mate)).total == 1.0
    assert score_a(mate, expected_a_completion(mate).replace("+1.0+1+0", "+0.001+0+0")).total == \
        pytest.approx(1 - 2 * (0.1 + 0.05))
    illegal = format_a_prompt(START, "e2e5", ["e2e5"])
    assert score_a(illegal, f"{START}+-1.0+0+1").total == 1.0


@pytest.mark.parametrize("prompt", ["", "A: garbage+e2e4+e2e4+", "A: 8/8/8/8/8/8/8/8 w - - 0 1+e2e4+e2e4+",
                                    f"A: {START}+e2e4+e2e4,+"])
def test_a_bad_prompt_is_neutral(prompt):
    b = check_invariant(score_a(prompt, f"{AFTER_B3}+0.001+0+0"))
    assert b.total == 0.0 and b.flags == ("bad_prompt",) and "error" in b.details


# ------------------------------------------------------------------------------------ P: dataset

@pytest.fixture(scope="module")
def p_lines(fixtures_dir):
    return (fixtures_dir / "rook_p_lines.txt").read_text().splitlines()


def test_p_dataset_label_completion_scores_the_max(p_lines):
    for line in p_lines:
        b = score_p_dataset(split_p(line)[1], parse_p(line))
        assert b.total == 1.0 and b.details["best_matches_label"] and b.flags == (), line


def test_p_dataset_hand_computed():
    label = PSample(START, ("e2e4", "d2d4", "g1f3", "c2c4", "b1c3"), ("0.3", "0.35", "0.28", "0.32", "-0.3"),
                    "d2d4")
    # 3 of 5 label moves + 2 other legal ones; matching evals off by 0.5 / 0.5 / 0.2 → MAE 0.4
    b = check_invariant(score_p_dataset(completion(["e2e4", "d2d4", "b1c3", "a2a3", "h2h3"],
                                                   [0.8, -0.15, -0.1, 0.0, 0.0], "e2e4"), label))
    assert b.components == pytest.approx({"best": 0.0, "candidates": 0.6, "eval": 0.6 - 0.4})  # d2d4 sign
    assert b.details["sign_errors"] == 1 and b.details["mae"] == pytest.approx(0.4)
    assert b.total == pytest.approx(0.3 * 0.6 + 0.2 * 0.2)
    illegal = score_p_dataset(completion(["e2e5", "d2d4"], [0.1, 0.35], "e7e5"), label)
    assert illegal.components == pytest.approx({"best": -1.0, "candidates": 0.2 - 0.3, "eval": -0.5})
    assert {"illegal_best", "illegal_moves"} <= set(illegal.flags)
    nothing_shared = score_p_dataset(completion(["a2a3"], [0.1], "a2a3"), label)
    assert nothing_shared.components["eval"] == 0.0 and "no_eval_overlap" in nothing_shared.flags
    assert score_p_dataset("M: e2e4 B: d2d4", label).components["eval"] == -0.2
    assert score_p_dataset("M: e2e4 d2d4 E: 0.3 B: d2d4", label).components["eval"] == -0.4
    assert score_p_dataset("M: e2e4 E: 0.3", label).components["best"] == -0.5


def test_p_dataset_garbage_and_bad_label():
    label = PSample(START, ("e2e4",), ("0.3",), "e2e4")
    for g in GARBAGE:
        b = check_invariant(score_p_dataset(g, label))
        assert b.total < 0 and b.flags, g
    for odd in ODD:
        assert check_invariant(score_p_dataset(odd, label)).flags, odd
    assert score_p_dataset("", label).total == -1.0 and "no_tags" in score_p_dataset("", label).flags
    bad = score_p_dataset(completion(["e2e4"], [0.3], "e2e4"), PSample("nope", ("e2e4",), ("0.3",), "e2e4"))
    assert bad.total == 0.0 and bad.flags == ("bad_prompt",)


# ----------------------------------------------------------------------------------- P: Stockfish

try:
    find_stockfish()
    HAVE_STOCKFISH = True
except EngineNotFound:  # pragma: no cover
    HAVE_STOCKFISH = False
needs_stockfish = pytest.mark.skipif(not HAVE_STOCKFISH, reason="Stockfish not installed")


@pytest.fixture(scope="module")
def engine():
    if not HAVE_STOCKFISH:
        pytest.skip("Stockfish not installed")
    with Engine(depth=10, multipv=5, workers=2) as e:
        yield e


@pytest.fixture(scope="module")
def sf(engine):
    """Stockfish's view of MATE_IN_1 plus legal moves outside its top 5."""
    a = engine.analyse(MATE_IN_1)
    others = sorted({m.uci() for m in chess.Board(MATE_IN_1).legal_moves} - set(a.moves))
    return a, list(a.moves), engine.eval_after_moves(MATE_IN_1, a.moves), others


@needs_stockfish
def test_p_stockfish_perfect_answer(engine, sf):
    a, moves, truth, _ = sf
    b = check_invariant(score_p(MATE_IN_1, completion(moves, truth, moves[0]), engine))
    assert moves[0] == "a1a8" and truth[0] == 1000.0
    assert b.components == {"best": 1.0, "candidates": 1.0, "eval": 1.0} and b.total == 1.0  # 1.2 → 1
    assert b.details["best_matches_sf1"] and b.details["sf_rank"] == 0 and b.details["mae"] == 0


@needs_stockfish
def test_p_stockfish_best_move_ranks(engine, sf):
    _, moves, truth, others = sf
    for rank in range(5):
        b = score_p(f"P: {MATE_IN_1}", completion(moves, truth, moves[rank]), engine)
        assert b.components["best"] == pytest.approx(1.0 - 0.2 * rank)
    assert score_p(MATE_IN_1, completion(moves, truth, others[0]), engine).components["best"] == 0.1
    illegal = score_p(MATE_IN_1, completion(moves, truth, "e2e4"), engine)
    assert illegal.components["best"] == -1.0 and "illegal_best" in illegal.flags
    assert score_p(MATE_IN_1, completion(moves, truth, "Ra8#"), engine).components["best"] == -0.5


@needs_stockfish
def test_p_stockfish_candidates_and_eval_hand_computed(engine, sf):
    _, moves, truth, others = sf
    pred = [moves[0], moves[1], *others[:3]]
    pred_truth = engine.eval_after_moves(MATE_IN_1, pred)
    b = check_invariant(score_p(MATE_IN_1, completion(pred, pred_truth, moves[0]), engine))
    assert b.details["jaccard"] == pytest.approx(2 / 8)
    assert b.components["candidates"] == pytest.approx(2 / 8 + 0.1 + 0.1 * 2 / 3)
    off = [t + 0.5 for t in pred_truth]                                  # MAE 0.5, signs unchanged
    assert score_p(MATE_IN_1, completion(pred, off, moves[0]), engine).components["eval"] == \
        pytest.approx(0.5)
    flipped = [-t for t in pred_truth]                                   # all |t| > 0.2 → 5 sign errors
    assert score_p(MATE_IN_1, completion(pred, flipped, moves[0]), engine).components["eval"] == -1.0
    all_illegal = score_p(MATE_IN_1, completion(["e2e4", "d2d4", "a7a8", "h1h8", "b1c3"],
                                                [0] * 5, "a1a8"), engine)
    assert all_illegal.components == pytest.approx({"best": 1.0, "candidates": -1.5, "eval": -0.5})
    assert all_illegal.total == pytest.approx(0.5 - 0.45 - 0.1)
    assert score_p(MATE_IN_1, completion(moves, truth[:4], "a1a8"), engine).components["eval"] == -0.4
    assert score_p(MATE_IN_1, "M: E: 0.1 B: a1a8", engine).components["candidates"] == -0.3
    assert score_p(MATE_IN_1, "M: a1a8 B: a1a8", engine).components["eval"] == -0.2


@needs_stockfish
def test_p_stockfish_label_quirk_is_visible(engine, p_lines):
    line = p_lines[0]                                       # black to move: B is the lowest eval
    label = parse_p(line)
    assert label.fen.split()[1] == "b" and float(label.evals[label.moves.index(label.best)]) == \
        min(map(float, label.evals))
    b = score_p(label.fen, split_p(line)[1], engine, label)
    assert b.details["best_matches_label"] is True and b.details["best_matches_sf1"] is False
    assert 0 < b.components["best"] < 1.0 or b.components["best"] == 0.1


@needs_stockfish
def test_p_batch_uses_one_engine_call_and_matches_single_scoring(engine, sf, monkeypatch):
    _, moves, truth, others = sf
    fens = [MATE_IN_1, MATE_IN_1, START, "bad fen", START]
    comps = [completion(moves, truth, moves[0]), completion(moves[:2], truth[:2], others[0]),
             "M: e2e4 d2d4 E: 0.3 0.3 B: e2e4", "M: e2e4 E: 1 B: e2e4", ""]
    singles = [score_p(f, c, engine) for f, c in zip(fens, comps)]
    calls = []
    real = engine.analyse_many
    monkeypatch.setattr(engine, "analyse_many", lambda *a, **k: calls.append(a) or real(*a, **k))
    batch = score_p_batch(fens, comps, engine)
    assert len(calls) == 1 and batch == singles
    assert [b.flags[:1] for b in batch[3:]] == [("bad_prompt",), ("no_tags",)]
    with pytest.raises(ValueError):
        score_p_batch(fens, comps[:2], engine)


@needs_stockfish
def test_p_fixture_completions_score_without_flags(engine, fixtures_dir):
    samples = json.loads((fixtures_dir / "model_completions_k8.json").read_text())["sample_results"]
    for s in samples:
        out = score_batch([s["prompt"]] * len(s["completions"]), s["completions"], engine)
        assert len({b.total for b in out}) == 1                     # identical completions, same reward
        check_invariant(out[0])
        if s["task_type"] == "P":
            assert out[0].kind == "p_stockfish" and out[0].flags == () and out[0].details["true_evals"]
        else:
            assert out[0].total == 1.0


@needs_stockfish
def test_p_stockfish_garbage_never_raises(engine):
    for g in GARBAGE:
        b = check_invariant(score_p(START, g, engine))
        assert b.total < 0 and b.flags, g
    for odd in ODD:
        assert check_invariant(score_p(START, odd, engine)).flags, odd
    assert score_p(START, "", engine).total == -1.0


def test_score_batch_without_engine_needs_labels():
    label = PSample(START, ("e2e4",), ("0.3",), "e2e4")
    out = score_batch([f"P: {START}", B3_PROMPT],
                      [completion(["e2e4"], [0.3], "e2e4"), f"{AFTER_B3}+0.001+0+0"], labels=[label, None])
    assert [b.kind for b in out] == ["p_dataset", "a"] and [b.total for b in out] == [1.0, 1.0]
    with pytest.raises(ValueError):
        score_batch([f"P: {START}"], ["x"])
    missing = score_batch([f"P: {START}"], ["x"], labels=[None])[0]
    assert missing.total == 0.0 and missing.flags == ("no_label",)
    assert set(P_WEIGHTS) == {"best", "candidates", "eval"} and len(A_WEIGHTS) == 10


@needs_stockfish
def test_trl_style_reward_function(engine, fixtures_dir):
    samples = json.loads((fixtures_dir / "model_completions_k8.json").read_text())["sample_results"]
    fn = default_p_reward_fn(engine=engine)
    prompts = [s["prompt"] for s in samples]
    totals = fn(prompts, [s["completions"][0] for s in samples], completion_ids=None)
    assert fn.__name__ == "rookworld" and totals == [b.total for b in score_batch(
        prompts, [s["completions"][0] for s in samples], engine)]
    fn.close()                                                       # not its engine: still usable
    assert engine.analyse(MATE_IN_1).moves[0] == "a1a8"


def test_format_ok_reflects_parser_problems():
    assert score_a(B3_PROMPT, f"{AFTER_B3}+0.001+0+0").format_ok
    assert not score_a(B3_PROMPT, "").format_ok and score_a("", "").format_ok   # bad prompt ≠ bad format
    label = PSample(START, ("e2e4",), ("0.3",), "e2e4")
    assert score_p_dataset(completion(["e2e4"], [0.3], "e2e4"), label).format_ok
    assert not score_p_dataset("", label).format_ok
