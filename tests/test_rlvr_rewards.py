"""The mini's reward scorer against every golden reward record: strings, booleans and integers exactly, floats to
a relative 1e-12 (the golden file was written by another Python and numpy: their last-digit rounding differs, as
0.919389788139529 vs 0.9193897881395292 — 2.4e-16 relative — while a real scoring change moves a reward by far
more than 1e-12)."""
from __future__ import annotations

import math

import pytest

from rookworld_debug.chess import rlvr_rewards as R
from tests.rlvr_golden import golden


REL = 1e-12


def same(got, exp) -> bool:
    """`got` equals the golden `exp`: containers element by element, floats to REL (NaN equals NaN)."""
    if isinstance(exp, dict):
        return isinstance(got, dict) and got.keys() == exp.keys() and all(same(got[k], exp[k]) for k in exp)
    if isinstance(exp, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(exp) and all(map(same, got, exp))
    if isinstance(exp, float) or isinstance(got, float):
        if isinstance(got, bool) or isinstance(exp, bool) or not isinstance(got, (int, float)):
            return False
        return (math.isnan(got) and math.isnan(exp)) or math.isclose(got, exp, rel_tol=REL, abs_tol=REL)
    return got == exp


def test_the_tolerance_separates_rounding_from_a_change():
    assert same({"r": [0.919389788139529]}, {"r": [0.9193897881395292]})
    assert not same({"r": [0.9193897]}, {"r": [0.9193898]}) and not same([1.0, 2.0], [1.0])
    assert not same({"ok": True}, {"ok": 1.0}) and same(float("nan"), float("nan"))


def _result(s: R.RlvrScore) -> dict:
    return {"task_type": s.task_type, "format_valid": s.format_valid, "format_score": s.format_score,
            "field_scores": s.field_scores, "weighted_scores": s.weighted_scores,
            "total_raw_reward": s.total_raw_reward, "shaped_reward": s.shaped_reward}


def _parsed(prompt: str, completion: str) -> dict:
    head = prompt.strip()
    if head.startswith("P:"):
        return R.parse_p_fields(completion)
    if head.startswith("A:"):
        return R.parse_a_fields(completion)
    return {"error": "<text omitted>"}


def test_every_scorer_record():
    rs = golden()["reward_scorer"]
    cfgs = {k: R.RlvrScorerConfig(**v) for k, v in rs["scorer_configs"].items()}
    n = 0
    for case in rs["cases"]:
        i = case["inputs"]
        assert same(_parsed(i["prompt"], i["completion"]), case["outputs"]["parsed_fields"]), case["id"]
        for name, exp in case["outputs"]["by_config"].items():
            got = _result(R.score_single(i["prompt"], i["completion"], i["ground_truth"], cfgs[name]))
            assert same(got, exp), (case["id"], name)
            n += 1
    assert n == 949 and len(rs["cases"]) == 73


def test_engine_path_cases():
    from rookworld_debug.chess.engine import find_stockfish
    for case in golden()["reward_scorer"]["stockfish_path_cases"]:
        i = case["inputs"]
        # the golden's machine had its engine at Debian's path; a machine with it elsewhere (ROOKWORLD_STOCKFISH)
        # stands its own engine in, and the missing-engine cases keep their path that exists nowhere
        path = find_stockfish() if i["stockfish_path"] == "/usr/games/stockfish" else i["stockfish_path"]
        cfg = R.RlvrScorerConfig(engine_path=path, **i["scorer_config"])
        s = R.score_single(i["prompt"], i["completion"], i["ground_truth"], cfg)
        assert same(_result(s), case["outputs"]["result"]), case["id"]
        assert list(s.engine_errors) == case["outputs"]["caught_exception_texts"], case["id"]


def test_batch_group_helper_and_compute_grpo_rewards():
    by_id = {c["id"]: c for c in golden()["reward_scorer"]["batch_and_group_advantages"]}
    for cid in ("batch_graduated", "batch_linear"):
        i, o = by_id[cid]["inputs"], by_id[cid]["outputs"]
        cfg = R.RlvrScorerConfig(**i["scorer_config"])
        rewards = [s.shaped_reward for s in R.score_batch(i["prompts"], i["completions"], None, cfg)]
        assert same(rewards, o["rewards"])
        assert same(R.group_advantages(rewards, 4), o["advantages_group4"])
        assert same(R.group_advantages(rewards, None), o["advantages_group_none"])
    c = by_id["compute_grpo_rewards_linear"]
    i, o = c["inputs"], c["outputs"]
    prompts, completions = _pairs(i["pair_ids"])
    cfg = R.RlvrScorerConfig(reward_shaping=i["reward_shaping"])
    shaped = [s.shaped_reward for s in R.score_batch(prompts, completions, None, cfg)]
    assert same(shaped, o["shaped_rewards"])
    assert same(R.group_advantages(shaped, i["group_size"]), o["advantages"])
    h = by_id["group_advantages_helper"]
    assert same(R.group_advantages(h["inputs"]["rewards"], h["inputs"]["group_size"]), h["outputs"]["advantages"])


def _pairs(ids):
    cases = {c["id"]: c["inputs"] for c in golden()["reward_scorer"]["cases"]}
    return [cases[i]["prompt"] for i in ids], [cases[i]["completion"] for i in ids]


def test_shaping_scaling_and_levenshtein_tables():
    s = golden()["reward_scorer"]["shaping_and_scaling"]
    n = 0
    for row in s["shape_reward"]:
        cfg = R.RlvrScorerConfig(reward_shaping=row["reward_shaping"])
        got = [R.shape_reward(x, row["format_valid"], cfg, row["component_name"]) for x in row["raw"]]
        assert same(got, row["shaped"]), (row["reward_shaping"], row["format_valid"], row["component_name"])
        n += len(got)
    assert n == 13 * 18
    sc = s["apply_scaling"]
    for name, values in sc["values"].items():
        assert same([R.apply_scaling(x, name) for x in sc["x"]], values), name
    for row in golden()["reward_scorer"]["levenshtein"]:
        assert R.levenshtein(row["expected"], row["generated"]) == row["levenshtein_distance"]
        assert same(R.fen_similarity(row["expected"], row["generated"]), row["fen_similarity_score"])


@pytest.mark.parametrize("shaping", ["graduated", "linear", "binary"])
def test_a_wrong_board_scores_below_a_right_one(shaping):
    """Not a golden case: a property the scorer must keep (a wrong FEN loses reward under every shaping)."""
    prompt = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
    good = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    bad = "rnbqkbnr/pppppppp/8/8/8/4P3/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    cfg = R.RlvrScorerConfig(reward_shaping=shaping)
    assert R.score_single(prompt, good, None, cfg).shaped_reward > R.score_single(prompt, bad, None, cfg).shaped_reward
