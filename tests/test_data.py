"""rookworld_debug.data: generator (real Stockfish, low depth), loaders, explicit batch selection."""
from __future__ import annotations

import json
import random
import sys
import time

import chess
import pytest

from rookworld_debug.chess.arbiter import expected_a_completion
from rookworld_debug.chess.engine import Engine
from rookworld_debug.chess.formats import format_a, format_p, parse_a, parse_p
from rookworld_debug.lab import generate as gen
from rookworld_debug.data import loaders
from rookworld_debug.errors import ConfigError, DataError


def _have_stockfish():
    try:
        gen._stockfish(None)
        return True
    except Exception:
        return False


needs_sf = pytest.mark.skipif(not _have_stockfish(), reason="Stockfish not installed")


@pytest.fixture(scope="module")
def small():
    return gen.generate_records(n_p=12, n_a=12, depth=2, seed=7, workers=1, ply_range=(6, 30))


@needs_sf
def test_generated_records_round_trip(small):
    ps = [r for r in small if r["task"] == "P"]
    as_ = [r for r in small if r["task"] == "A"]
    assert len(ps) == 12 and len(as_) == 12
    for r in small:
        assert r["text"] == r["prompt"] + r["completion"]
        assert r["split"] in ("train", "heldout")
    for r in ps:
        s = parse_p(r["text"])
        assert format_p(s) == r["text"]
        assert s.fen == r["fen"] and r["prompt"] == f"P: {r['fen']}"
        assert sorted(s.moves) == sorted(r["ranked_moves"])
        # moves and evals were shuffled jointly: each pair is a (move, eval) of the ranking
        assert set(zip(s.moves, s.evals)) == set(zip(r["ranked_moves"], r["ranked_evals"]))
        board = chess.Board(s.fen)
        assert all(board.is_legal(chess.Move.from_uci(m)) for m in s.moves)
        # the RookWorld label quirk: black to move -> the 5th-ranked (last) move
        want = r["ranked_moves"][-1] if board.turn == chess.BLACK else r["ranked_moves"][0]
        assert s.best == want
        assert len(r["text"].split("M: ")[0]) == 3 + 90  # FEN field 90 wide
    for r in as_:
        a = parse_a(r["text"])
        assert format_a(a) == r["text"]
        assert expected_a_completion(r["prompt"]) == r["completion"]
        assert a.history[-1] == a.move and len(a.history) <= 10


@needs_sf
def test_generation_is_deterministic(small):
    again = gen.generate_records(n_p=12, n_a=12, depth=2, seed=7, workers=1, ply_range=(6, 30))
    assert again == small
    other = gen.generate_records(n_p=12, n_a=12, depth=2, seed=8, workers=1, ply_range=(6, 30))
    assert other != small


@needs_sf
def test_stockfish_best_label_and_illegal_moves():
    recs = gen.generate_records(n_p=6, n_a=40, depth=2, seed=3, workers=1, b_label="stockfish_best",
                                p_illegal=0.5, ply_range=(6, 20))
    for r in recs:
        if r["task"] == "P":
            assert r["best"] == r["ranked_moves"][0]
    illegal = [r for r in recs if r["task"] == "A" and r["reward"] == "-1.0"]
    assert illegal and all(r["truncated"] == 1 and r["completion"].endswith("+1") for r in illegal)


@needs_sf
def test_labels_are_the_reward_engines_search_of_the_fen_alone(small):
    # the P: reward's engine (rewards.py: Engine(depth, multipv)) searching each FEN alone on a fresh hash
    # must give every generated label: ranking, evals and B (RookWorld convention for black)
    with Engine(depth=2, multipv=5, workers=1) as eng:
        assert gen.label_mismatches(small, eng) == []
        wrong = [dict(r, best=r["ranked_moves"][1]) if i == 0 else r
                 for i, r in enumerate(r for r in small if r["task"] == "P")]
        bad = gen.label_mismatches(wrong, eng)       # the check itself can fail
    assert [b["fen"] for b in bad] == [wrong[0]["fen"]] and set(bad[0]) >= {"best"}


@needs_sf
def test_pool_workers_label_like_the_sequential_run(small):
    # `small` left a label engine in this process: forked workers must start their own (an inherited
    # one has no event-loop thread in the child and would stall to the search deadline)
    t0 = time.perf_counter()
    pooled = gen.generate_records(n_p=12, n_a=12, depth=2, seed=7, workers=2, ply_range=(6, 30))
    assert pooled == small and time.perf_counter() - t0 < 25


def _bundled_p_records():
    recs = [json.loads(line) for line in loaders.bundled_path().read_text().splitlines()]
    return [r for r in recs if r["task"] == "P"]


def _label_engine():
    lab = loaders.bundled_meta()["labels"]
    assert "FEN alone" in lab["search"] and "fresh hash" in lab["search"]
    eng = Engine(depth=lab["depth"], multipv=lab["multipv"], threads=lab["threads"], hash_mb=lab["hash_mb"],
                 workers=2, cache=False)
    assert eng.version == lab["engine"], (f"labels were searched with {lab['engine']}, this engine is "
                                          f"{eng.version}: regenerate with the meta.json command")
    return eng


@pytest.mark.slow        # ~55 s of depth-4 searches over the whole bundled set (a data-integrity check)
@needs_sf
def test_every_bundled_white_to_move_B_is_the_reward_engines_first():
    # each white-to-move B == #1 of the reward's search (FEN alone, fresh hash, meta settings)
    white = [r for r in _bundled_p_records() if chess.Board(r["fen"]).turn == chess.WHITE]
    assert len(white) > 500
    with _label_engine() as eng:
        first = [a.moves[0] for a in eng.analyse_many([r["fen"] for r in white])]
    not_first = [r["fen"] for r, m in zip(white, first) if r["best"] != m]
    assert not not_first, f"{len(not_first)}/{len(white)} white-to-move B labels are not the engine's #1: {not_first[:3]}"


def _check_bundled_labels(records):
    """Every field of every record's label (ranking, evals, B incl. black's convention) == the reward's search."""
    with _label_engine() as eng:
        bad = gen.label_mismatches(records, eng)
    assert not bad, f"{len(bad)}/{len(records)} P: labels differ from the reward engine's search: {bad[:3]}"


@needs_sf
def test_bundled_labels_match_the_reward_engine_sample():
    # a seeded sample of every label field (quick); the slow test below checks every bundled P: record
    recs = _bundled_p_records()
    white = [r for r in recs if " w " in r["fen"]]
    black = [r for r in recs if " b " in r["fen"]]
    rng = random.Random(0)
    _check_bundled_labels(rng.sample(white, 40) + rng.sample(black, 10))


@needs_sf
@pytest.mark.slow
def test_bundled_labels_match_the_reward_engine_all():
    _check_bundled_labels(_bundled_p_records())


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="b_label"):
        gen.generate_records(n_p=1, n_a=1, depth=2, b_label="nope")
    with pytest.raises(ConfigError, match="p_game_end"):
        gen.generate_records(n_p=1, n_a=1, depth=2, p_game_end=1.5)


@needs_sf
def test_pure_random_play_with_game_ends():
    # the round-3 recipe's data: measure's positions (uniformly random play from the start, no search for the
    # moves) and games played on to their end, whose last ply is a game-end A: record
    kw = dict(n_games=6, depth=1, seed=11, workers=1, eps_range=(1.0, 1.0), random_opening_max=0, ply_range=(2, 12),
              keep=0.5, p_game_end=1.0, heldout_frac=0)
    recs = gen.generate_records(**kw)
    ends = [r for r in recs if r["task"] == "A" and r["terminated"] == 1]
    assert len(ends) == 6  # one per game (none of these short games ended on its own)
    for r in ends:
        assert r["reward"] in ("1.0", "0.5") and r["truncated"] == 0
        assert expected_a_completion(r["prompt"]) == r["completion"]
        board = chess.Board(r["fen"])
        board.push_uci(r["move"])
        assert board.is_game_over()
    plain = [r for r in recs if r not in ends]
    assert plain and all(r["ply"] < 12 for r in plain)
    assert gen.generate_records(**kw) == recs


@needs_sf
def test_cli_writes_jsonl_and_meta(tmp_path):
    out = tmp_path / "d.jsonl"
    assert gen.main(["--out", str(out), "--n-p", "3", "--n-a", "3", "--depth", "2", "--workers", "1",
                     "--max-plies", "12", "--quiet"]) == 0
    recs = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(recs) == 6
    meta = json.loads((tmp_path / "d.jsonl.meta.json").read_text())
    assert meta["depth"] == 2 and meta["b_label"] == "rookworld"
    samples = loaders.load_file(out)
    assert [s.text for s in samples] == [r["text"] for r in recs]


# ---------------------------------------------------------------------------------------- loaders
def test_bundled_sample():
    samples, rep = loaders.load_bundled(with_report=True)
    assert rep.n_p >= 1000 and rep.n_a >= 500 and rep.skipped == 0
    held = loaders.load_heldout("P")
    assert held and all(s.split == "heldout" and s.task == "P" for s in held)
    train_fens = {s.prompt for s in loaders.load_bundled(split="train")}
    assert not train_fens & {s.prompt for s in loaders.load_heldout()}
    meta = loaders.bundled_meta()
    assert meta["depth"] == 10 and meta["b_label"] == "rookworld"
    lab = meta["labels"]   # how P: labels were searched: the reward's search at the same settings
    assert (lab["depth"], lab["multipv"], lab["threads"]) == (meta["depth"], meta["multipv"], 1)
    for s in samples[:50]:
        assert s.text == s.prompt + s.completion


def test_load_text_file_adds_missing_a_prefix(tmp_path):
    a = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    p = ("P: " + f"{'8/8/8/8/8/8/8/K6k w - - 0 1':90}" + f"{'M: a1a2 a1b1 a1b2':33}" + f"{'E: 0.0 0.0 0.0':43}" + "B: a1a2")
    f = tmp_path / "lines.txt"
    f.write_text(f"{a}\n{p}\nnot a sample\n")
    with pytest.raises(DataError, match=r"lines.txt:3: malformed"):       # the default: bad lines are errors
        loaders.load_file(f)
    samples, rep = loaders.load_file(f, with_report=True, on_bad_sample="skip")
    assert [s.task for s in samples] == ["A", "P"]
    assert samples[0].text.startswith("A: ") and rep.added_a_prefix == 1 and rep.skipped == 1
    assert rep.notes[0].startswith(f"skipped {f}:3: ")
    assert samples[0].prompt.endswith("+e2e4+") and samples[0].completion.endswith("+0.001+0+0")
    assert samples[1].completion.lstrip().startswith("M: ")


def test_load_file_errors(tmp_path):
    with pytest.raises(DataError):
        loaders.load_file(tmp_path / "missing.jsonl")
    (tmp_path / "e.txt").write_text("\n")
    with pytest.raises(DataError):
        loaders.load_file(tmp_path / "e.txt")
    (tmp_path / "j.jsonl").write_text('{"foo": 1}\n')
    with pytest.raises(DataError, match="text"):
        loaders.load_file(tmp_path / "j.jsonl")


def test_select_batch_explicit_and_deterministic():
    samples = loaders.load_bundled()
    b1 = loaders.select_batch(samples, task="P", batch_size=4, seed=3)
    b2 = loaders.select_batch(samples, task="P", batch_size=4, seed=3)
    assert b1 == b2 and b1.batch_hash == b2.batch_hash and len(b1) == 4
    assert all(t == "P" for t in b1.tasks)
    assert loaders.select_batch(samples, task="P", batch_size=4, seed=4).batch_hash != b1.batch_hash
    b3 = loaders.select_batch(samples, task="P", indices=b1.indices)
    assert b3.prompts == b1.prompts and b3.seed is None
    mixed = loaders.select_batch(samples, task="mixed", batch_size=32, seed=0)
    assert set(mixed.tasks) == {"P", "A"}
    assert str(b1.indices[0]) in b1.describe()
    a_idx = next(i for i, s in enumerate(samples) if s.task == "A")
    with pytest.raises(DataError):
        loaders.select_batch(samples, task="P", indices=[a_idx])
    with pytest.raises(ConfigError, match="prompt_indices"):
        loaders.select_batch(samples, task="P", indices=[len(samples)])
    with pytest.raises(DataError):
        loaders.select_batch(samples[:3], task="P", batch_size=10, seed=0)
    with pytest.raises(DataError):
        loaders.select_batch(samples, task="Q", batch_size=1)


def test_load_hf_offline_is_fast_and_clear(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.time()
    with pytest.raises(DataError, match="offline|datasets"):
        loaders.load_hf("jrahn/rookworld_7m", split="test")
    assert time.time() - t < 3


def test_load_hf_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match="datasets"):
        loaders.load_hf()
