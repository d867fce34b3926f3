"""The project's rewards as TRL reward functions: `GRPOTrainer(reward_funcs=[p_reward, a_reward])`.

TRL calls each function as `f(prompts=[...], completions=[...], completion_ids=[...], **dataset_columns,
trainer_state=..., log_extra=..., log_metric=...)` and expects one float (or None = "does not apply")
per completion. Here:

- `PReward` scores P: rows (None for A: rows) with Stockfish (`reward_mode="engine"`, the cached engine
  pool shared by every function with the same settings: one batched `analyse_many` per call) or against
  the dataset label (`reward_mode="dataset"`, the `label_column` dataset column holds the dataset
  completion); `AReward` scores A: rows with the python-chess arbiter (None for P: rows). TRL's
  `nansum` over functions then gives every row exactly the project's built-in reward.
- Per-component values: every call keeps its `RewardBreakdown`s in `last_call` (prompts, completions,
  breakdowns), so a capture reads the components of the batch TRL just scored without scoring again.

Names: TRL logs `rewards/<__name__>/mean`; the functions are named `rookworld_p` and `rookworld_a`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional, Sequence

from rookworld_debug.chess import rewards as chess_rewards
from rookworld_debug.chess.engine import Engine
from rookworld_debug.chess.formats import parse_p
from rookworld_debug.errors import ConfigError, DataError, FormatError

__all__ = ["RewardCall", "PReward", "AReward", "rookworld_reward_funcs", "shared_engine"]

_ENGINES: dict[tuple, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(depth: int = 10, multipv: int = 5, workers: int = 2) -> Engine:
    """One Engine (process pool + position cache) per (depth, multipv, workers) for the whole process:
    every reward function and every trainer step reuses its cache. Closed by the engine module's exit hook."""
    key = (int(depth), int(multipv), int(workers))
    with _ENGINES_LOCK:
        eng = _ENGINES.get(key)
        if eng is None or getattr(eng, "_closed", False):
            eng = _ENGINES[key] = Engine(depth=depth, multipv=multipv, workers=workers)
        return eng


@dataclass(frozen=True)
class RewardCall:
    """One call of a reward function: what it scored and every component behind each value."""
    prompts: tuple                  # N prompt strings as TRL passed them
    completions: tuple              # N completion strings
    breakdowns: tuple               # N RewardBreakdown, None where the function does not apply (other task)
    values: tuple                   # N floats / None, exactly what the function returned to TRL


def _is_a(prompt: str) -> bool:
    return str(prompt).lstrip().startswith("A:")


def _check(prompts, completions) -> None:
    for name, xs in (("prompts", prompts), ("completions", completions)):
        if xs is None or isinstance(xs, (str, bytes)) or not hasattr(xs, "__len__"):
            raise DataError(f"RookWorld rewards take {name} as a list of strings, got {type(xs).__name__}")
    if len(prompts) != len(completions):
        raise DataError(f"{len(prompts)} prompts but {len(completions)} completions: each prompt needs one "
                        "completion (TRL passes them row for row)")
    bad = next((p for p in list(prompts) + list(completions) if not isinstance(p, str)), None)
    if bad is not None:
        raise FormatError(f"RookWorld rewards take plain-text prompts/completions (not chat messages), got "
                          f"{type(bad).__name__}: {bad!r:.80}")


class _Reward:
    __name__ = "rookworld"

    def __init__(self):
        self.last_call: Optional[RewardCall] = None

    def _finish(self, prompts, completions, breakdowns) -> list:
        values = [None if b is None else float(b.total) for b in breakdowns]
        self.last_call = RewardCall(tuple(prompts), tuple(completions), tuple(breakdowns), tuple(values))
        return values


class PReward(_Reward):
    """P: reward (best move / candidates / eval, weights 0.5/0.3/0.2), None for A: rows."""
    __name__ = "rookworld_p"

    def __init__(self, reward_mode: str = "engine", *, depth: int = 10, multipv: int = 5, workers: int = 2,
                 engine: Optional[Engine] = None, label_column: str = "label"):
        super().__init__()
        if reward_mode not in ("engine", "dataset"):
            raise ConfigError("reward_mode", f"unknown {reward_mode!r}; expected 'engine' or 'dataset'")
        self.reward_mode, self.label_column = reward_mode, label_column
        self.depth, self.multipv, self.workers, self._engine = depth, multipv, workers, engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = shared_engine(self.depth, self.multipv, self.workers)
        return self._engine

    def _labels(self, prompts, kwargs) -> list:
        labels = kwargs.get(self.label_column)
        if labels is None:
            raise ConfigError("reward_mode", f"'dataset' needs a {self.label_column!r} dataset column holding "
                              "each prompt's dataset completion (TRL passes dataset columns to reward functions)")
        if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__") or len(labels) != len(prompts):
            n = len(labels) if hasattr(labels, "__len__") else type(labels).__name__
            raise DataError(f"dataset column {self.label_column!r} has {n} entries for {len(prompts)} prompts: "
                            "every row needs its label (None is allowed and scores neutral, flagged no_label)")
        out = []
        for p, c in zip(prompts, labels):
            try:
                out.append(parse_p(p + c) if not _is_a(p) and isinstance(c, str) else None)
            except FormatError:
                out.append(None)         # → a neutral breakdown flagged "no_label"
        return out

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs) -> list:
        _check(prompts, completions)
        idx = [i for i, p in enumerate(prompts) if not _is_a(p)]
        breakdowns: list = [None] * len(prompts)
        if idx:
            ps, cs = [prompts[i] for i in idx], [completions[i] for i in idx]
            if self.reward_mode == "engine":
                scored = chess_rewards.score_batch(ps, cs, self.engine)
            else:
                labels = self._labels(prompts, kwargs)
                scored = chess_rewards.score_batch(ps, cs, None, labels=[labels[i] for i in idx])
            for i, b in zip(idx, scored):
                breakdowns[i] = b
        return self._finish(prompts, completions, breakdowns)


class AReward(_Reward):
    """A: reward (field-wise agreement with the python-chess arbiter), None for P: rows."""
    __name__ = "rookworld_a"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs) -> list:
        _check(prompts, completions)
        breakdowns = [chess_rewards.score_a(p, c) if _is_a(p) else None for p, c in zip(prompts, completions)]
        return self._finish(prompts, completions, breakdowns)


def rookworld_reward_funcs(reward_mode: str = "engine", *, depth: int = 10, multipv: int = 5, workers: int = 2,
                           engine: Optional[Engine] = None, label_column: str = "label") -> list:
    """[PReward, AReward]: together (TRL sums them, each is None on the other task) the project's reward."""
    return [PReward(reward_mode, depth=depth, multipv=multipv, workers=workers, engine=engine,
                    label_column=label_column), AReward()]
