"""rookworld-rlvr's reward scorer ("the mini"'s `RewardScorer`), re-implemented as pure functions over strings.

The numbers match the mini's own scorer record for record (tests/test_rlvr_rewards.py runs every golden case
of ../shared/fixtures/rlvr_mini_golden.json). In words:

P: (policy task, weights best_move 4, format 2, candidates 1.5, evaluations 1; Σ 8.5)
    format      1 iff `M:` (UCI run), `E:` (numbers, each a float) and `B:` (one UCI move) are all found
    best_move   with a ground truth: 1/0 exact match with its B; without: 0.2 if B is legal, else 0
    candidates  with: (#predicted moves found in the truth's M) / #predicted; without: 0.3·legal fraction
    evaluations with: max(0, 1 − mean_i (e_i − g_i)²/100) when the counts match, else 0; without: 0.1
    (the fallback is per field: a ground truth without E: still compares best_move and candidates)
A: (environment task, weights format 4, fen_match 3, game_state 2, reward_value 1; Σ 10)
    format      ≥ 4 `+` sections: FEN with '/', a float, two flags in {true, false, 0, 1}
    fen_match   1 − Levenshtein/max(len) against the truth's FEN, or python-chess's FEN after the move
                (the prompt's FEN when the move is illegal); weighted after the scaling (exponential)
    game_state  with: 1 iff both flags equal the truth's, else 0; without: matches with python-chess / 2
    reward_value with: 1 iff |r − r_gt| < 0.01, else 0; without: error to python-chess's value
                (1 mate, 0.5 draw, 0.001 other, 0.0 illegal) → 1 / 0.7 / 0.4 / 0.1 (< 0.01, < 0.1, < 0.3)
raw = Σ weight·score / Σ weights (format only when the format is invalid: raw = 0)
shaped: min + (max − min)·raw when the task's continuous component was scored (the default for every
    format-valid answer), else by `reward_shaping` (graduated bands / linear / binary / raw); then
    + format_bonus when the format is valid and the shaped value is < 0.

With an engine path the mini's engine branch fails inside and scores 0.0 for every field that reaches it
(it reads python-chess's analysis dicts as attributes); `engine_path` reproduces that outcome, the error
texts are in the record.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import chess

from rookworld_debug.errors import ConfigError, DataError

P_WEIGHTS = {"best_move": 4.0, "format": 2.0, "candidates": 1.5, "evaluations": 1.0}
A_WEIGHTS = {"format": 4.0, "fen_match": 3.0, "game_state": 2.0, "reward_value": 1.0}
DEFAULT_COMPONENTS = {"fen_similarity": "exponential", "evaluations": "linear"}
SHAPINGS = ("graduated", "linear", "binary", "continuous")   # any other name: the raw score
_MOVES = re.compile(r"M:\s*((?:[a-h][1-8][a-h][1-8]\w*\s*)+)")
_EVALS = re.compile(r"E:\s*((?:[-\d.]+\s*)+)")
_BEST = re.compile(r"B:\s*([a-h][1-8][a-h][1-8]\w*)")
_FLAGS = {"true": True, "1": True, "false": False, "0": False}


@dataclass(frozen=True)
class RlvrScorerConfig:
    """The mini's `RewardScorer(...)` arguments (its defaults)."""
    reward_shaping: str = "graduated"
    min_reward: float = -0.3
    max_reward: float = 1.0
    format_bonus: float = 0.1
    continuous_components: Optional[Mapping[str, str]] = None   # None or {} = DEFAULT_COMPONENTS
    engine_path: Optional[str] = None                           # reproduces the engine branch's 0.0 scores

    @property
    def components(self) -> Mapping[str, str]:
        return dict(self.continuous_components) if self.continuous_components else dict(DEFAULT_COMPONENTS)


@dataclass(frozen=True)
class RlvrScore:
    """One completion scored as the mini does (its result dict, field by field)."""
    task_type: str                      # "P", "A" or "unknown"
    format_valid: bool
    format_score: float
    field_scores: dict                  # raw per-field scores (A: fen_match = the unscaled similarity)
    weighted_scores: dict               # weight × (scaled) score
    total_raw_reward: float             # Σ weighted / Σ weights
    shaped_reward: float                # the training reward
    parsed: dict = field(default_factory=dict)          # the fields the format check extracted
    engine_errors: tuple = ()           # what the engine branch raised (and the mini caught)


# ------------------------------------------------------------------------------ helpers
def levenshtein(a: str, b: str) -> int:
    """Edit distance (the mini's pure-Python DP)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def fen_similarity(expected: str, generated: str) -> float:
    """1 − Levenshtein/max(len); 0 if either is empty, 1 if equal."""
    if not expected or not generated:
        return 0.0
    if expected == generated:
        return 1.0
    return 1.0 - levenshtein(expected, generated) / max(len(expected), len(generated))


def apply_scaling(x: float, scaling: str) -> float:
    """exponential (e^{3x} − 1)/(e^3 − 1) · sigmoid 1/(1 + e^{−10(x − 0.5)}) · quadratic x² · else identity."""
    if scaling == "exponential":
        return (math.exp(3 * x) - 1) / (math.exp(3) - 1)
    if scaling == "sigmoid":
        return 1 / (1 + math.exp(-10 * (x - 0.5)))
    if scaling == "quadratic":
        return x ** 2
    return x


def shape_reward(raw: float, format_valid: bool, cfg: RlvrScorerConfig,
                 component_name: Optional[str] = None) -> float:
    """The mini's shaping step (see the module docstring); `component_name` 'mixed_continuous' is what the
    scorer passes when the task's continuous component was scored."""
    lo, hi = cfg.min_reward, cfg.max_reward
    if component_name == "mixed_continuous":
        shaped = lo + (hi - lo) * raw
    elif component_name is not None and component_name in cfg.components:
        shaped = lo + (hi - lo) * apply_scaling(raw, cfg.components[component_name])
    elif cfg.reward_shaping == "graduated":
        shaped = _graduated(raw, format_valid, lo)
    elif cfg.reward_shaping in ("linear", "continuous"):
        shaped = lo + (hi - lo) * raw
    elif cfg.reward_shaping == "binary":
        shaped = hi if raw > 0.5 else lo
    else:
        shaped = raw
    if format_valid and shaped < 0:
        shaped += cfg.format_bonus
    return shaped


def _graduated(raw: float, format_valid: bool, lo: float) -> float:
    if raw < 0.2:
        return 0.2 if format_valid else lo
    for edge, level in ((0.4, 0.2), (0.6, 0.4), (0.8, 0.6), (0.95, 0.8)):
        if raw < edge:
            return level
    return 1.0


def _float(s: str) -> Optional[float]:
    try:
        return float(s)
    except ValueError:
        return None


def _board(fen: str) -> Optional[chess.Board]:
    try:
        return chess.Board(fen)
    except ValueError:
        return None


def _legal(board: Optional[chess.Board], uci: str) -> bool:
    if board is None:
        return False
    try:
        return chess.Move.from_uci(uci) in board.legal_moves
    except ValueError:
        return False


# ------------------------------------------------------------------------------ P:
def parse_p_fields(completion: str) -> dict:
    """The P: format check's extraction (the golden record's `parsed_fields`)."""
    out = {}
    m, e, b = _MOVES.search(completion), _EVALS.search(completion), _BEST.search(completion)
    evals = None
    if e:
        values = [_float(t) for t in e.group(1).split()]
        evals = None if any(v is None for v in values) else values
    out["has_moves"], out["has_evals"], out["has_best"] = m is not None, evals is not None, b is not None
    if m:
        out["moves"] = m.group(1).split()
    if evals is not None:
        out["evals"] = evals
    if b:
        out["best_move"] = b.group(1)
    return out


def _p_fields(prompt: str, parsed: dict, ground_truth: Optional[str], engine: bool, errors: list) -> dict:
    fen = prompt.strip()[2:].strip()
    gt = parse_p_fields(ground_truth) if ground_truth is not None else {}
    moves, best, evals = parsed["moves"], parsed["best_move"], parsed["evals"]
    board = _board(fen)
    if "best_move" in gt:
        best_s = 1.0 if best == gt["best_move"] else 0.0
    elif engine and _legal(board, best):
        best_s = _engine_zero(errors, "move")
    else:
        best_s = 0.2 if _legal(board, best) else 0.0
    if "moves" in gt:
        cand_s = sum(1 for mv in moves if mv in gt["moves"]) / len(moves)
    elif engine:
        cand_s = _engine_zero(errors, "move")
    else:
        legal = sum(1 for mv in moves if _legal(board, mv))
        cand_s = 0.3 * legal / len(moves) if legal else 0.0
    if "evals" in gt:
        truth = gt["evals"]
        cand_e = (sum((p - t) ** 2 for p, t in zip(evals, truth)) / len(evals)) if len(evals) == len(truth) else None
        eval_s = max(0.0, 1.0 - cand_e / 100) if cand_e is not None else 0.0
    elif engine:
        eval_s = _engine_zero(errors, "score")
    else:
        eval_s = 0.1
    return {"best_move": best_s, "candidates": cand_s, "evaluations": eval_s}


def _engine_zero(errors: list, attr: str) -> float:
    """The mini's engine branch: the analysis is read as `.move`/`.score` of a dict, raises, is caught → 0.0."""
    errors.append(f"'dict' object has no attribute '{attr}'")
    return 0.0


# ------------------------------------------------------------------------------ A:
def parse_a_fields(completion: str) -> dict:
    """The A: format check's extraction (the golden record's `parsed_fields`)."""
    parts = [s.strip() for s in completion.split("+")] if completion else []
    out = {"num_sections": len(parts), "has_fen": False, "has_reward": False, "has_terminated": False,
           "has_truncated": False}
    if len(parts) < 4:
        return out
    reward = _float(parts[1])
    out.update(has_fen="/" in parts[0], has_reward=reward is not None,
               has_terminated=parts[2].lower() in _FLAGS, has_truncated=parts[3].lower() in _FLAGS)
    for key, ok, value in (("new_fen", "has_fen", parts[0]), ("reward", "has_reward", reward),
                           ("terminated", "has_terminated", _FLAGS.get(parts[2].lower())),
                           ("truncated", "has_truncated", _FLAGS.get(parts[3].lower()))):
        if out[ok]:
            out[key] = value
    return out


def _a_truth(prompt: str) -> dict:
    """python-chess's answer to an A: prompt: expected FEN, flags and reward (None when the FEN is unusable)."""
    body = prompt.strip()
    body = body[2:].strip() if body.startswith("A:") else body
    parts = body.split("+")
    fen, move = parts[0].strip(), (parts[1].strip() if len(parts) > 1 else "")
    board = _board(fen)
    if board is None:
        return {"fen": fen, "board_ok": False}
    if not _legal(board, move):
        return {"fen": fen, "board_ok": True, "terminated": False, "truncated": True, "reward": 0.0}
    board.push(chess.Move.from_uci(move))
    if board.is_checkmate():
        reward = 1.0
    elif board.is_stalemate() or board.is_insufficient_material():
        reward = 0.5
    else:
        reward = 0.001
    return {"fen": board.fen(), "board_ok": True, "terminated": board.is_game_over(), "truncated": False,
            "reward": reward}


def _a_fields(prompt: str, parsed: dict, ground_truth: Optional[str]) -> dict:
    gt = None
    if ground_truth is not None:
        g = [s.strip() for s in ground_truth.split("+")]
        if len(g) >= 4 and _float(g[1]) is not None:
            gt = g
    truth = _a_truth(prompt)
    if gt is not None:
        fen_s = fen_similarity(gt[0], parsed["new_fen"])
        same = (parsed["terminated"] == _FLAGS.get(gt[2].lower())) and (parsed["truncated"] == _FLAGS.get(gt[3].lower()))
        state_s = 1.0 if same else 0.0
        reward_s = 1.0 if abs(parsed["reward"] - float(gt[1])) < 0.01 else 0.0
        return {"fen_match": fen_s, "game_state": state_s, "reward_value": reward_s}
    fen_s = fen_similarity(truth["fen"], parsed["new_fen"])
    if not truth["board_ok"]:
        return {"fen_match": fen_s, "game_state": 0.0, "reward_value": 0.0}
    state_s = ((parsed["terminated"] == truth["terminated"]) + (parsed["truncated"] == truth["truncated"])) / 2
    err = abs(parsed["reward"] - truth["reward"])
    reward_s = 1.0 if err < 0.01 else 0.7 if err < 0.1 else 0.4 if err < 0.3 else 0.1
    return {"fen_match": fen_s, "game_state": state_s, "reward_value": reward_s}


# ------------------------------------------------------------------------------ the scorer
def score_single(prompt: str, completion: str, ground_truth: Optional[str] = None,
                 cfg: RlvrScorerConfig = RlvrScorerConfig()) -> RlvrScore:
    """One completion, exactly as the mini's `RewardScorer.score_single`."""
    head = prompt.strip()
    task = "P" if head.startswith("P:") else "A" if head.startswith("A:") else "unknown"
    if task == "unknown":
        return RlvrScore("unknown", False, 0.0, {}, {}, 0.0, cfg.min_reward)
    parsed = parse_p_fields(completion) if task == "P" else parse_a_fields(completion)
    valid = all(parsed[k] for k in (("has_moves", "has_evals", "has_best") if task == "P" else
                                    ("has_fen", "has_reward", "has_terminated", "has_truncated")))
    weights = P_WEIGHTS if task == "P" else A_WEIGHTS
    if not valid:
        shaped = shape_reward(0.0, False, cfg)
        return RlvrScore(task, False, 0.0, {"format": 0.0}, {"format": 0.0}, 0.0, shaped, parsed)
    errors: list = []
    if task == "P":
        fields = _p_fields(prompt, parsed, ground_truth, cfg.engine_path is not None, errors)
        if cfg.engine_path is not None and not os.path.exists(cfg.engine_path):
            errors = [f"[Errno 2] No such file or directory: '{cfg.engine_path}'"] * len(errors)
        scaled = {**fields, "evaluations": apply_scaling(fields["evaluations"], cfg.components.get("evaluations", ""))}
        continuous = "evaluations" in cfg.components
    else:
        fields = _a_fields(prompt, parsed, ground_truth)
        scaled = {**fields, "fen_match": apply_scaling(fields["fen_match"], cfg.components.get("fen_similarity", ""))}
        continuous = "fen_similarity" in cfg.components
    fields["format"] = scaled["format"] = 1.0
    weighted = {k: weights[k] * scaled[k] for k in fields}          # content fields first, format last
    raw = sum(weighted.values()) / sum(weights.values())
    shaped = shape_reward(raw, True, cfg, "mixed_continuous" if continuous else None)
    return RlvrScore(task, True, 1.0, fields, weighted, raw, shaped, parsed, tuple(errors))


def score_batch(prompts: Sequence[str], completions: Sequence[str], ground_truths: Optional[Sequence] = None,
                cfg: RlvrScorerConfig = RlvrScorerConfig()) -> list[RlvrScore]:
    """Every row (the mini's `score_batch` passes no ground truth: `ground_truths=None`); DataError when the
    completions or ground truths are not one per prompt (a row is never dropped)."""
    _check_lengths(prompts, completions, ground_truths)
    gts = ground_truths if ground_truths is not None else [None] * len(prompts)
    return [score_single(p, c, g, cfg) for p, c, g in zip(prompts, completions, gts)]


def _check_lengths(prompts, completions, ground_truths) -> None:
    n = len(prompts)
    if len(completions) != n or (ground_truths is not None and len(ground_truths) != n):
        gt = "" if ground_truths is None else f", {len(ground_truths)} ground truths"
        raise DataError(f"the rlvr scorer needs one completion{'' if ground_truths is None else ' and one ground truth'}"
                        f" per prompt: got {n} prompts, {len(completions)} completions{gt}")


def group_advantages(rewards: Sequence[float], group_size: Optional[int]) -> list[float]:
    """The scorer's own group helper: r − mean, divided by (population std + 1e-8) only if that std > 0.01.
    group_size None: the whole batch is one group (a last group shorter than group_size is its own group, as in
    the mini). No rewards, or a group size that is not a whole number ≥ 1: ConfigError/DataError by name."""
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise ConfigError("group_size", f"must be a whole number ≥ 1 or None, got {group_size!r}")
    if len(rewards) == 0:
        raise DataError("group_advantages: no rewards (an empty group has no mean)")
    k = group_size or len(rewards)
    out = []
    for s in range(0, len(rewards), k):
        g = list(rewards[s:s + k])
        mean = sum(g) / len(g)
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / len(g))
        out += [(x - mean) / (std + 1e-8) if std > 0.01 else x - mean for x in g]
    return out


def score_breakdowns(prompts: Sequence[str], completions: Sequence[str], ground_truths: Optional[Sequence] = None,
                     cfg: RlvrScorerConfig = RlvrScorerConfig()) -> list:
    """The scorer's results as this package's RewardBreakdown (total = the shaped reward; components = the
    (scaled) field scores, weights = weight/Σ weights, so Σ weights·components = the raw score)."""
    from rookworld_debug.chess.rewards import RewardBreakdown
    out = []
    for s in score_batch(prompts, completions, ground_truths, cfg):
        weights = P_WEIGHTS if s.task_type == "P" else A_WEIGHTS if s.task_type == "A" else {}
        total_w = sum(weights.values()) or 1.0
        comps = {k: s.weighted_scores[k] / weights[k] for k in s.weighted_scores}
        flags = () if s.format_valid else (("format_invalid",) if s.task_type != "unknown" else ("unknown_task",))
        details = {"raw": s.total_raw_reward, "field_scores": dict(s.field_scores), "shaping": cfg.reward_shaping,
                   "problems": [] if s.format_valid else [flags[0]], "engine_errors": list(s.engine_errors),
                   "ground_truth": ground_truths is not None}
        out.append(RewardBreakdown(total=s.shaped_reward, components=comps,
                                   weights={k: weights[k] / total_w for k in comps}, flags=flags, details=details,
                                   kind=f"rlvr_{s.task_type.lower()}"))
    return out
