"""The mini's reward scorer against every golden reward record (exact equality, not a tolerance)."""
from __future__ import annotations

import pytest

from rookworld_debug.chess import rlvr_rewards as R
from tests.rlvr_golden import golden


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


def test_every_scorer_record_exactly():
    rs = golden()["reward_scorer"]
    cfgs = {k: R.RlvrScorerConfig(**v) for k, v in rs["scorer_configs"].items()}
    n = 0
    for case in rs["cases"]:
        i = case["inputs"]
        assert _parsed(i["prompt"], i["completion"]) == case["outputs"]["parsed_fields"], case["id"]
        for name, exp in case["outputs"]["by_config"].items():
            got = _result(R.score_single(i["prompt"], i["completion"], i["ground_truth"], cfgs[name]))
            assert got == exp, (case["id"], name)
            n += 1
    assert n == 949 and len(rs["cases"]) == 73


def test_engine_path_cases():
    for case in golden()["reward_scorer"]["stockfish_path_cases"]:
        i = case["inputs"]
        cfg = R.RlvrScorerConfig(engine_path=i["stockfish_path"], **i["scorer_config"])
        s = R.score_single(i["prompt"], i["completion"], i["ground_truth"], cfg)
        assert _result(s) == case["outputs"]["result"], case["id"]
        assert list(s.engine_errors) == case["outputs"]["caught_exception_texts"], case["id"]


def test_batch_group_helper_and_compute_grpo_rewards():
    by_id = {c["id"]: c for c in golden()["reward_scorer"]["batch_and_group_advantages"]}
    for cid in ("batch_graduated", "batch_linear"):
        i, o = by_id[cid]["inputs"], by_id[cid]["outputs"]
        cfg = R.RlvrScorerConfig(**i["scorer_config"])
        rewards = [s.shaped_reward for s in R.score_batch(i["prompts"], i["completions"], None, cfg)]
        assert rewards == o["rewards"]
        assert R.group_advantages(rewards, 4) == o["advantages_group4"]
        assert R.group_advantages(rewards, None) == o["advantages_group_none"]
    c = by_id["compute_grpo_rewards_linear"]
    i, o = c["inputs"], c["outputs"]
    prompts, completions = _pairs(i["pair_ids"])
    cfg = R.RlvrScorerConfig(reward_shaping=i["reward_shaping"])
    shaped = [s.shaped_reward for s in R.score_batch(prompts, completions, None, cfg)]
    assert shaped == o["shaped_rewards"]
    assert R.group_advantages(shaped, i["group_size"]) == o["advantages"]
    h = by_id["group_advantages_helper"]
    assert R.group_advantages(h["inputs"]["rewards"], h["inputs"]["group_size"]) == h["outputs"]["advantages"]


def _pairs(ids):
    cases = {c["id"]: c["inputs"] for c in golden()["reward_scorer"]["cases"]}
    return [cases[i]["prompt"] for i in ids], [cases[i]["completion"] for i in ids]


def test_shaping_scaling_and_levenshtein_tables():
    s = golden()["reward_scorer"]["shaping_and_scaling"]
    n = 0
    for row in s["shape_reward"]:
        cfg = R.RlvrScorerConfig(reward_shaping=row["reward_shaping"])
        got = [R.shape_reward(x, row["format_valid"], cfg, row["component_name"]) for x in row["raw"]]
        assert got == row["shaped"], (row["reward_shaping"], row["format_valid"], row["component_name"])
        n += len(got)
    assert n == 13 * 18
    sc = s["apply_scaling"]
    for name, values in sc["values"].items():
        assert [R.apply_scaling(x, name) for x in sc["x"]] == values, name
    for row in golden()["reward_scorer"]["levenshtein"]:
        assert R.levenshtein(row["expected"], row["generated"]) == row["levenshtein_distance"]
        assert R.fen_similarity(row["expected"], row["generated"]) == row["fen_similarity_score"]


@pytest.mark.parametrize("shaping", ["graduated", "linear", "binary"])
def test_a_wrong_board_scores_below_a_right_one(shaping):
    """Not a golden case: a property the scorer must keep (a wrong FEN loses reward under every shaping)."""
    prompt = "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
    good = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    bad = "rnbqkbnr/pppppppp/8/8/8/4P3/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    cfg = R.RlvrScorerConfig(reward_shaping=shaping)
    assert R.score_single(prompt, good, None, cfg).shaped_reward > R.score_single(prompt, bad, None, cfg).shaped_reward
