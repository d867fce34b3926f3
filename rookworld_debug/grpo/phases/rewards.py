"""Rewards phase: score every completion, keep every component.

Shape legend: B prompts, G generations, N = B·G completions, K reward functions.

- The built-in reward "rookworld" dispatches by task: P: → rookworld-trl's best/candidates/eval
  reward against Stockfish (reward_mode="engine", one pooled+cached `analyse_many` over the unique
  positions of the whole batch) or against the dataset label (reward_mode="dataset", no engine);
  A: → the arbiter's field-wise reward (python-chess only).
- reward_mode="rlvr" / "rlvr_gt": rookworld-rlvr's own scorer (chess/rlvr_rewards.py), without / with the
  dataset completion as ground truth; no engine.
- User reward functions follow TRL's signature `f(prompts, completions, **kw) -> list[float | None]`
  (kw: tasks, completion_ids, labels); None → NaN = unscorable, exactly as TRL treats it.
- The total is Σ_k w_k·r_k (nansum; NaN only when every function returned None), as TRL does.
- ±inf from any function (deliberate deviation from TRL, which would propagate it) makes the row's total
  NaN = unscorable (advantage 0), with a per-row flag and a record-level warning; the raw inf stays in
  `rewards_per_func`. A value that is not a number/None raises ValueError naming the function and row.
"""
from __future__ import annotations

import dataclasses

import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import torch

from rookworld_debug.chess import rewards as chess_rewards
from rookworld_debug.chess.formats import parse_p
from rookworld_debug.errors import DataError, FormatError

RewardFn = Callable[..., Sequence[Optional[float]]]


@dataclass(frozen=True)
class Rewards:
    rewards: torch.Tensor               # (N,) Σ_k w_k·r_k (nansum); NaN = every function returned None
    rewards_per_func: torch.Tensor      # (N, K) raw per-function rewards, NaN = None
    func_names: tuple                   # K names ("rookworld" first when the built-in reward is used)
    weights: tuple                      # K weights
    breakdowns: tuple                   # N chess.rewards.RewardBreakdown of the built-in reward (None if unused)
    components: dict                    # component name -> N floats (NaN where the component doesn't apply)
    flags: tuple                        # N tuples of problem flags ("no_B", "illegal_move", "bad_prompt"…)
    matches_label: tuple                # N bool|None: P: B: equals the dataset label's B:
    matches_sf1: tuple                  # N bool|None: P: B: equals Stockfish's #1 move (engine mode)
    format_valid: tuple                 # N bool: no format problem flagged
    metrics: dict                       # TRL keys: reward, reward_std, rewards/<name>/mean|std
    engine_stats: dict                  # calls, cache_hits, cache_misses, restarts, seconds (this phase)
    reward_mode: str
    seconds: float
    warnings: tuple = ()                # record-level problems (e.g. a function returned ±inf → rows unscorable)


# the project's reward under the names it goes by (the built-in, TRL's P:/A: reward functions), and the reward
# modes scored from the dataset label alone (no engine search: deterministic, so a replay can recompute them)
BUILTIN_REWARDS = ("rookworld", "rookworld_p", "rookworld_a")
LABEL_REWARD_MODES = ("dataset", "rlvr", "rlvr_gt")


def _label(prompt: str, completion: str):
    try:
        return parse_p(prompt + completion)
    except FormatError:
        return None


def builtin_breakdowns(prompts: Sequence[str], completions: Sequence[str], labels: Sequence[str], *,
                       reward_mode: str, engine=None) -> list:
    """The built-in RookWorld reward for N rows (labels = the dataset completion of each row's prompt).
    All P: rows are scored with ONE batched engine call (engine mode) or against their label."""
    if reward_mode in ("rlvr", "rlvr_gt"):            # rookworld-rlvr's scorer (no engine)
        from rookworld_debug.chess.rlvr_rewards import score_breakdowns
        if reward_mode == "rlvr_gt" and len(labels or ()) != len(prompts):
            raise DataError(f"reward_mode='rlvr_gt' scores against one ground-truth label per row: got "
                            f"{len(labels or ())} labels for {len(prompts)} rows")
        return score_breakdowns(prompts, completions, labels if reward_mode == "rlvr_gt" else None)
    label_samples = [_label(p, c) if p.lstrip().startswith("P:") else None
                     for p, c in zip(prompts, labels)] if labels else None
    return chess_rewards.score_batch(prompts, completions, engine if reward_mode == "engine" else None,
                                     labels=label_samples)


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def _value(name: str, row: int, x) -> float:
    """A reward function's value as float (None → NaN); anything else is a clear error, not a crash deep in torch."""
    try:
        return _nan(x)
    except (TypeError, ValueError):
        raise ValueError(f"reward function {name!r} returned {x!r} for row {row}: expected a number or None") \
            from None


def compute_rewards(prompts: Sequence[str], completions: Sequence[str], tasks: Sequence[str], *,
                    labels: Sequence[str] = (), reward_mode: str = "engine", engine=None,
                    reward_funcs: Optional[Mapping[str, RewardFn]] = None,
                    reward_weights: Optional[Mapping[str, float]] = None, use_builtin: bool = True,
                    completion_ids=None) -> Rewards:
    """Score N completions (prompts/tasks/labels given per row, i.e. already repeated G times)."""
    t0 = time.perf_counter()
    n = len(completions)
    stats0 = engine.stats if engine is not None else None
    names, columns = [], []
    breakdowns = builtin_breakdowns(prompts, completions, labels, reward_mode=reward_mode, engine=engine) \
        if use_builtin else [None] * n
    if use_builtin:
        names.append("rookworld")
        columns.append([b.total if b is not None else None for b in breakdowns])
    for name, fn in (reward_funcs or {}).items():
        values = list(fn(prompts=list(prompts), completions=list(completions), tasks=list(tasks),
                         labels=list(labels), completion_ids=completion_ids))
        if len(values) != n:
            raise ValueError(f"reward function {name!r} returned {len(values)} values for {n} completions")
        names.append(name)
        columns.append([_value(name, i, v) for i, v in enumerate(values)])
    weights = tuple(float((reward_weights or {}).get(k, 1.0)) for k in names)
    per_func = torch.tensor([[_nan(c[i]) for c in columns] for i in range(n)], dtype=torch.float64)  # (N, K)
    is_inf = torch.isinf(per_func)                                                                   # (N, K)
    finite_or_nan = per_func.masked_fill(is_inf, float("nan"))                                       # (N, K)
    weighted = finite_or_nan * torch.tensor(weights, dtype=torch.float64)                            # (N, K)
    unscorable = torch.isnan(finite_or_nan).all(dim=1) | is_inf.any(dim=1)                           # (N,)
    total = torch.nansum(weighted, dim=1).masked_fill(unscorable, float("nan"))                       # (N,)
    inf_rows = [int(i) for i in torch.nonzero(is_inf.any(dim=1)).flatten()]
    warnings = ()
    if inf_rows:
        bad_funcs = [names[k] for k in range(len(names)) if bool(is_inf[:, k].any())]
        warnings = (f"{len(inf_rows)} completion(s) got an infinite reward from {bad_funcs} (rows {inf_rows}): "
                    "treated as unscorable (reward NaN, advantage 0)",)

    comp_names = list(dict.fromkeys(k for b in breakdowns if b is not None for k in b.components))
    components = {k: tuple(_nan(b.components.get(k)) if b is not None else math.nan for b in breakdowns)
                  for k in comp_names}
    flags = tuple((tuple(b.flags) if b is not None else ())
                  + tuple(f"reward_fn:{names[k]} returned {float(per_func[i, k])}" for k in range(len(names))
                          if bool(is_inf[i, k]))
                  for i, b in enumerate(breakdowns))
    details = [b.details if b is not None else {} for b in breakdowns]
    metrics = _reward_metrics(total, finite_or_nan, names)
    est = {}
    if engine is not None:
        d = engine.stats - stats0
        est = {k: getattr(d, k) for k in ("calls", "cache_hits", "cache_misses", "restarts", "seconds")}
    return Rewards(
        rewards=total, rewards_per_func=per_func, func_names=tuple(names), weights=weights,
        breakdowns=tuple(breakdowns), components=components, flags=flags,
        matches_label=tuple(d.get("best_matches_label") for d in details),
        matches_sf1=tuple(d.get("best_matches_sf1") for d in details),
        format_valid=tuple(b is not None and b.format_ok for b in breakdowns),
        metrics=metrics, engine_stats=est, reward_mode=reward_mode, seconds=time.perf_counter() - t0,
        warnings=warnings)


def with_breakdowns(rw: Rewards, per_row) -> Rewards:
    """`rw` with the components, flags and format checks of the project's reward breakdowns of its rows (None: a
    row another function scored); the reward values stay the ones given."""
    if not any(b is not None for b in per_row):
        return rw
    comp_names = list(dict.fromkeys(k for b in per_row if b is not None for k in b.components))
    details = [b.details if b is not None else {} for b in per_row]
    return dataclasses.replace(
        rw, breakdowns=tuple(per_row),
        components={k: tuple(float(b.components.get(k, math.nan)) if b is not None else math.nan for b in per_row)
                    for k in comp_names},
        flags=tuple(tuple(b.flags) if b is not None else () for b in per_row),
        matches_label=tuple(d.get("best_matches_label") for d in details),
        matches_sf1=tuple(d.get("best_matches_sf1") for d in details),
        format_valid=tuple(b is not None and b.format_ok for b in per_row))


def _reward_metrics(total: torch.Tensor, per_func: torch.Tensor, names) -> dict:
    """TRL's reward metrics: mean/std of the total (N,) and of each function's column of (N, K) (NaN-skipping)."""
    n = total.shape[0]
    metrics = {"reward": float(torch.nanmean(total)) if n else math.nan, "reward_std": _nanstd(total)}
    for k, name in enumerate(names):
        metrics[f"rewards/{name}/mean"] = float(torch.nanmean(per_func[:, k])) if n else math.nan
        metrics[f"rewards/{name}/std"] = _nanstd(per_func[:, k])
    return metrics


def _nanstd(x: torch.Tensor) -> float:
    v = x[~torch.isnan(x)]
    return float(v.std()) if v.numel() > 1 else math.nan
