"""Property-based fuzzing of the parsers, the arbiter and every reward function.

Each hypothesis example carries a BATCH of completions (scored in one call, so the engine-backed reward
stays fast): hypothesis-drawn random text plus near-misses made from real fixture lines by a seeded
mutator (character deletions/insertions/swaps, truncation, field swaps, whitespace changes, unicode,
NaN/inf/huge-number strings). ≥ 10,000 completions per task type (P: Stockfish, P: dataset, A:);
the counts are printed in pytest's terminal summary ("reliability fuzz cases").

Properties, for every completion:
- nothing raises (lenient parsers and rewards never; strict parsers only ``FormatError``);
- every reward total and component is finite, the total is within ``BOUNDS[kind]`` and each component
  within its documented range;
- the component table is consistent with the total: ``total == clamp(Σ w·c)`` exactly, same keys.
"""
from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rookworld_debug.chess import rewards as R
from rookworld_debug.chess.arbiter import expected_a_completion, transition
from rookworld_debug.chess.formats import (A_FLAGS, A_REWARDS, check_fen, fen_diff, parse_a, parse_a_completion,
                                           parse_a_prompt, parse_p, parse_p_completion, split_p)
from rookworld_debug.errors import FormatError

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------------------------- mutation kit
NASTY_NUMBERS = ("nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999", "9" * 400, "1" + "0" * 5000,
                 "1e-400", "1_0", "0x10", "１２", "٣", "+.5", "-.", ".", "--1", "1e", "e5", "1.2.3", "∞", "NaN%")
NASTY_TOKENS = ("M:", "E:", "B:", "P:", "A:", "+", "++", "e2e4", "e7e8q", "e7e8k", "a9a1", "0000", "e1h1", "Z9",
                "\x00", "\u200b", "\ufeff", "é", "♞", "日本", "\U0001f600", "\r\n", "\t", " " * 40, "<|endoftext|>",
                "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR", "w", "b", "KQkq", "-", "0", "1", "0.001", "1.0",
                "-1.0", "0.5", "true", "None")
UNICODE = "éßΩж中文♔♚\u0301\u200b\ufeff\U0001f600\x00\x7f\u2028"
CHARS = "abcdefgh12345678qrbnkpKQRBNP/ -+.:eEMBPA0" + UNICODE


def _rand_char(rng: random.Random) -> str:
    return rng.choice(CHARS)


def mutate(text: str, rng: random.Random) -> str:
    """One to four random corruptions of a real line."""
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(14)
        n = len(text)
        i = rng.randrange(n + 1)
        if op == 0 and n:                                   # delete a char
            text = text[:i] + text[i + 1:]
        elif op == 1:                                       # insert a char
            text = text[:i] + _rand_char(rng) + text[i:]
        elif op == 2 and n > 1:                             # swap two neighbours
            i = min(i, n - 2)
            text = text[:i] + text[i + 1] + text[i] + text[i + 2:]
        elif op == 3:                                       # truncate
            text = text[:i]
        elif op == 4:                                       # swap two fields (split at tags or '+')
            sep = "+" if "+" in text else None
            parts = text.split(sep) if sep else _split_tags(text)
            if len(parts) > 1:
                a, b = rng.sample(range(len(parts)), 2)
                parts[a], parts[b] = parts[b], parts[a]
            text = (sep or "").join(parts)
        elif op == 5:                                       # whitespace change
            text = rng.choice([text.replace(" ", "\t"), text.replace(" ", ""), " ".join(text.split()),
                               "   " + text, text + "\n\n", text.replace(" ", "\u00a0"), text.replace(" ", "  ")])
        elif op == 6:                                       # replace a token by a nasty number
            text = _replace_token(text, rng, rng.choice(NASTY_NUMBERS))
        elif op == 7:                                       # replace a token by a nasty token
            text = _replace_token(text, rng, rng.choice(NASTY_TOKENS))
        elif op == 8:                                       # duplicate a token
            toks = text.split(" ")
            j = rng.randrange(len(toks))
            toks.insert(j, toks[j])
            text = " ".join(toks)
        elif op == 9:                                       # huge padding / repetition
            text = text[:i] + rng.choice([" ", "+", "M: ", "E: ", "B: ", "/"]) * rng.randint(2, 300) + text[i:]
        elif op == 10:                                      # change a digit
            digits = [k for k, c in enumerate(text) if c.isdigit()]
            if digits:
                k = rng.choice(digits)
                text = text[:k] + str(rng.randrange(10)) + text[k + 1:]
        elif op == 11:                                      # case flip
            text = text.swapcase() if rng.random() < 0.3 else text[:i] + text[i:i + 3].swapcase() + text[i + 3:]
        elif op == 12:                                      # drop a whole field
            sep = "+" if "+" in text else " "
            parts = text.split(sep)
            if len(parts) > 1:
                del parts[rng.randrange(len(parts))]
            text = sep.join(parts)
        else:                                               # splice a random unicode chunk
            text = text[:i] + "".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 6))) + text[i:]
    return text


def _split_tags(text: str) -> list[str]:
    out, cur = [], ""
    for k in range(len(text)):
        if text[k:k + 2] in ("M:", "E:", "B:") and cur:
            out.append(cur)
            cur = ""
        cur += text[k]
    return out + [cur]


def _replace_token(text: str, rng: random.Random, new: str) -> str:
    toks = text.split(" ")
    nonempty = [k for k, t in enumerate(toks) if t]
    if nonempty:
        toks[rng.choice(nonempty)] = new
    return " ".join(toks)


random_text = st.text(alphabet=st.one_of(st.sampled_from(CHARS), st.characters()), max_size=120)


def near_misses(bases: list[str], seed: int, k: int) -> list[str]:
    rng = random.Random(seed)
    return [mutate(rng.choice(bases), rng) for _ in range(k)]


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def p_lines(fixtures_dir) -> list[str]:
    return [line.rstrip("\n") for line in (fixtures_dir / "rook_p_lines.txt").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def a_items(fixtures_dir) -> list[dict]:
    return json.loads((fixtures_dir / "a_task_openings.json").read_text())


@pytest.fixture(scope="module")
def p_split(p_lines):
    """(prompt, completion, label PSample) of the first 8 fixture lines: a SMALL fixed set of positions, so
    the engine cache keeps the Stockfish fuzz fast."""
    return [(*split_p(line), parse_p(line)) for line in p_lines[:8]]


# ---------------------------------------------------------------------------------- invariants
COMPONENT_RANGES = {
    "p_stockfish": {"best": (-1.0, 1.0), "candidates": (-1.5, 1.0), "eval": (-1.0, 1.0)},
    "p_dataset": {"best": (-1.0, 1.0), "candidates": (-1.5, 1.0), "eval": (-1.0, 1.0)},
    "a": {k: (-1.0, 1.0) for k in R.A_WEIGHTS},
}


def check_breakdown(b: R.RewardBreakdown, kind: str, where: str) -> None:
    assert b.kind == kind, where
    lo, hi = R.BOUNDS[kind]
    assert isinstance(b.total, float) and math.isfinite(b.total) and lo <= b.total <= hi, (where, b)
    assert set(b.components) == set(b.weights), (where, b)
    for k, v in b.components.items():
        assert math.isfinite(v), (where, k, b)
        clo, chi = COMPONENT_RANGES[kind][k]
        assert clo <= v <= chi, (where, k, v, b)
    raw = sum(b.weights[k] * b.components[k] for k in b.weights)
    assert b.total == min(hi, max(lo, raw)), (where, b.total, raw, b)
    assert sum(b.weighted().values()) == pytest.approx(raw, abs=1e-12), where
    assert all(isinstance(f, str) for f in b.flags), where
    json.dumps(b.details, default=str)              # details stay serialisable (traces store them)


def check_p_parse(text: str) -> None:
    pc = parse_p_completion(text)
    assert pc.ok == (not pc.problems)
    assert len(pc.moves) <= 5 and all(len(m) in (4, 5) for m in pc.moves)
    assert all(e is None or math.isfinite(e) for e in pc.evals), (text, pc.evals)
    assert pc.best is None or 4 <= len(pc.best) <= 5


def check_a_parse(text: str) -> None:
    ac = parse_a_completion(text)
    assert ac.ok == (not ac.problems)
    assert ac.reward_value is None or math.isfinite(ac.reward_value)
    if ac.ok:
        assert ac.reward in A_REWARDS and ac.terminated in A_FLAGS and ac.truncated in A_FLAGS


def strict_only_format_error(fn, text: str) -> None:
    try:
        fn(text)
    except FormatError:
        pass


# ---------------------------------------------------------------------------------- P: dataset reward
@settings(max_examples=60, **FUZZ)
@given(seed=st.integers(0, 2**32 - 1), randoms=st.lists(random_text, max_size=20))
def _p_dataset_cases(p_split, counts, seed, randoms):
    bases = [c for _, c, _ in p_split]
    rng = random.Random(seed)
    texts = near_misses(bases, seed, 190) + randoms + [""]
    for text in texts:
        _, _, label = p_split[rng.randrange(len(p_split))]
        check_p_parse(text)
        check_breakdown(R.score_p_dataset(text, label), "p_dataset", repr(text))
        strict_only_format_error(parse_p, "P: " + label.fen + text)
    counts["P: dataset reward (score_p_dataset) + parsers"] += len(texts)


def test_fuzz_p_dataset_reward_and_parsers(p_split, fuzz_counts):
    fuzz_counts["P: dataset reward (score_p_dataset) + parsers"] = 0
    _p_dataset_cases(p_split, fuzz_counts)
    assert fuzz_counts["P: dataset reward (score_p_dataset) + parsers"] >= 10_000


# ---------------------------------------------------------------------------------- P: Stockfish reward
@pytest.fixture(scope="module")
def engine():
    from rookworld_debug.chess.engine import Engine
    try:
        e = Engine(depth=2, multipv=5, workers=1)
    except Exception as exc:  # pragma: no cover - no Stockfish on this machine
        pytest.skip(f"no Stockfish: {exc}")
    with e:
        yield e


@settings(max_examples=45, **FUZZ)
@given(seed=st.integers(0, 2**32 - 1), randoms=st.lists(random_text, max_size=20),
       bad_prompts=st.lists(st.sampled_from(["", "P:", "P: 8/8/8/8/8/8/8/8 w - - 0 1", "P: K7/8/8/8/8/8/8/k7 w",
                                             "A: garbage", "P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR x KQkq - 0 1"]),
                            max_size=3))
def _p_engine_cases(p_split, engine, counts, seed, randoms, bad_prompts):
    bases = [c for _, c, _ in p_split]
    rng = random.Random(seed)
    texts = near_misses(bases, seed, 250) + randoms + [""]
    rows = [p_split[rng.randrange(len(p_split))] for _ in texts]
    prompts = [p for p, _, _ in rows]
    labels = [lab for _, _, lab in rows]
    # a few mutated/garbage PROMPTS too: they must give neutral 'bad_prompt' rows, never an engine crash
    for bad in bad_prompts + [mutate(prompts[0], rng) for _ in range(2)]:
        prompts.append(bad)
        texts.append(bases[0])
        labels.append(None)
    out = R.score_p_batch(prompts, texts, engine, labels)
    assert len(out) == len(texts)
    for prompt, text, b in zip(prompts, texts, out):
        check_breakdown(b, "p_stockfish", repr((prompt, text)))
        if "bad_prompt" in b.flags:
            assert b.total == 0.0
    counts["P: Stockfish reward (score_p_batch, depth 2)"] += len(texts)


def test_fuzz_p_stockfish_reward(p_split, engine, fuzz_counts):
    fuzz_counts["P: Stockfish reward (score_p_batch, depth 2)"] = 0
    _p_engine_cases(p_split, engine, fuzz_counts)
    assert fuzz_counts["P: Stockfish reward (score_p_batch, depth 2)"] >= 10_000
    # the real completions of the fixed prompts still score exactly as before (the cache is not poisoned)
    again = R.score_p_batch([p for p, _, _ in p_split], [c for _, c, _ in p_split], engine,
                            [lab for _, _, lab in p_split])
    assert all(b.format_ok and "illegal_best" not in b.flags for b in again)


# ---------------------------------------------------------------------------------- A: reward + arbiter
@settings(max_examples=50, **FUZZ)
@given(seed=st.integers(0, 2**32 - 1), randoms=st.lists(random_text, max_size=20))
def _a_cases(a_items, counts, seed, randoms):
    rng = random.Random(seed)
    items = [a_items[rng.randrange(len(a_items))] for _ in range(12)]
    truths = [(it["prompt"], expected_a_completion(it["prompt"])) for it in items]
    texts = near_misses([t for _, t in truths], seed, 230) + randoms + [""]
    for text in texts:
        prompt, _ = truths[rng.randrange(len(truths))]
        check_a_parse(text)
        check_breakdown(R.score_a(prompt, text), "a", repr(text))
        strict_only_format_error(parse_a, prompt + text)
    # mutated PROMPTS: the strict prompt parser and the arbiter raise FormatError or answer; the reward is
    # neutral (0.0, 'bad_prompt') exactly when the prompt cannot be read
    bad_prompts = near_misses([p for p, _ in truths], seed + 1, 40)
    for prompt in bad_prompts:
        strict_only_format_error(parse_a_prompt, prompt)
        try:
            expected = expected_a_completion(prompt)
        except FormatError:
            expected = None
        b = R.score_a(prompt, truths[0][1])
        check_breakdown(b, "a", repr(prompt))
        assert ("bad_prompt" in b.flags) == (expected is None), (prompt, b.flags)
        if expected is not None:
            check_breakdown(R.score_a(prompt, expected), "a", repr(prompt))
            assert R.score_a(prompt, expected).total == 1.0, (prompt, expected)
    counts["A: reward (score_a) + parsers"] += len(texts)
    counts["A: mutated prompts (parse_a_prompt, arbiter, score_a)"] += len(bad_prompts)


def test_fuzz_a_reward_parsers_and_arbiter(a_items, fuzz_counts):
    for k in ("A: reward (score_a) + parsers", "A: mutated prompts (parse_a_prompt, arbiter, score_a)"):
        fuzz_counts[k] = 0
    _a_cases(a_items, fuzz_counts)
    assert fuzz_counts["A: reward (score_a) + parsers"] >= 10_000


@settings(max_examples=40, **FUZZ)
@given(seed=st.integers(0, 2**32 - 1), moves=st.lists(st.text(max_size=8), max_size=10))
def _arbiter_cases(a_items, counts, seed, moves):
    """Any move string on a real position: a well-formed transition whose completion the A: parser
    accepts and the A: reward scores 1.0; the new state is a valid FEN."""
    rng = random.Random(seed)
    fen = a_items[rng.randrange(len(a_items))]["prompt"][3:].split("+")[0]
    board = check_fen(fen)
    legal = [m.uci() for m in board.legal_moves]
    cands = moves + rng.sample(legal, min(5, len(legal))) + [mutate(rng.choice(legal), rng) for _ in range(20)]
    for move in cands:
        t = transition(fen, move)
        assert t.reward in A_REWARDS and t.terminated in (0, 1) and t.truncated in (0, 1)
        assert t.legal == (move in legal) and (t.truncated == 1) == (not t.legal)
        check_fen(t.new_fen)
        assert parse_a_completion(t.completion).ok
        assert fen_diff(t.new_fen, t.new_fen).exact
        if "+" not in move and " " not in move and move.strip() == move and move:
            prompt = f"A: {fen}+{move}++"
            try:
                parse_a_prompt(prompt)
            except FormatError:
                continue
            assert R.score_a(prompt, t.completion).total == 1.0
    counts["A: arbiter transitions (random + near-miss moves)"] += len(cands)


def test_fuzz_arbiter(a_items, fuzz_counts):
    fuzz_counts["A: arbiter transitions (random + near-miss moves)"] = 0
    _arbiter_cases(a_items, fuzz_counts)
    assert fuzz_counts["A: arbiter transitions (random + near-miss moves)"] >= 1_000


@settings(max_examples=300, **FUZZ)
@given(expected=st.sampled_from(["rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
                                 "8/8/8/8/8/8/8/K6k w - - 0 1"]),
       predicted=st.one_of(st.none(), random_text, st.integers().map(str), st.lists(random_text).map(" ".join)))
def _fen_diff_cases(counts, expected, predicted):
    d = fen_diff(expected, predicted)
    assert 0 <= d.n_fields_match <= 6 and d.n_fields_match == sum(d.fields().values())
    assert not d.exact or d.n_fields_match == 6
    counts["fen_diff (random predictions)"] += 1


def test_fuzz_fen_diff(fuzz_counts):
    fuzz_counts["fen_diff (random predictions)"] = 0
    _fen_diff_cases(fuzz_counts)


def test_pathological_long_inputs_parse_fast():
    """Regex backtracking guard: long padded/garbage inputs parse in well under a second each."""
    import time
    nasty = ["P: " + " " * 20_000 + "M:" + " " * 20_000 + "E:" + " " * 20_000, "M: E: B: " * 5000,
             "P: " + "M: " * 3000 + "E: " * 3000 + "B:" + " x" * 3000, "+" * 50_000, "a" * 100_000]
    for text in nasty:
        t0 = time.perf_counter()
        parse_p_completion(text)
        parse_a_completion(text)
        strict_only_format_error(parse_p, text)
        strict_only_format_error(parse_a, text)
        strict_only_format_error(parse_a_prompt, text)
        assert time.perf_counter() - t0 < 1.0, text[:40]
