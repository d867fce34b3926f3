"""A `run_steps` checkpoint's state.json read through a closed schema: only the keys `save_checkpoint` writes, each
of its type, so an altered or foreign file is one CheckpointError naming the key (never a traceback from deep in a
resume or a branch). The weights beside it are read by `safeio.load_torch` (tensors and plain values only)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rookworld_debug.errors import CheckpointError

MODES = ("overfit_single_batch", "fresh")     # run_steps' batch modes (multistep documents them)
MAX_INT = 2 ** 63              # an integer a tensor, a seed or a float can hold
MAX_STEP = 2 ** 31 - 1


def _plain(v) -> bool:
    """A table cell: None, a bool, a string, a float, or an integer a float can hold."""
    return v is None or isinstance(v, (bool, str, float)) or (isinstance(v, int) and -MAX_INT <= v < MAX_INT)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP


def _number(v) -> bool:
    return (isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and -MAX_INT <= v < MAX_INT))


def _table(v) -> bool:
    return isinstance(v, list) and all(isinstance(r, dict) and all(isinstance(k, str) and _plain(x)
                                                                   for k, x in r.items()) for r in v)


def _beta_state(v) -> bool:
    return (isinstance(v, dict) and set(v) <= {"value", "history"} and _number(v.get("value"))
            and isinstance(v.get("history", []), list)
            and all(isinstance(h, dict) and all(isinstance(k, str) and _plain(x) for k, x in h.items())
                    for h in v.get("history", [])))


def _schedule(cls):
    """A schedule's fields exactly (every key, no other), each a plain value; its own checks run when it is built."""
    names = {f.name for f in dataclasses.fields(cls)}
    return lambda v: isinstance(v, dict) and set(v) == names and all(_plain(x) for x in v.values())


def _fields() -> dict:
    from rookworld_debug.grpo.multistep.schedules import BetaSchedule, LRSchedule
    return {
        "version": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "next_step": _count, "completed_steps": _count, "steps": _count,
        "mode": lambda v: v in MODES,
        "config": lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
        "beta_schedule": _schedule(BetaSchedule), "lr_schedule": _schedule(LRSchedule),
        "beta_state": _beta_state,
        "cursor_order": lambda v: isinstance(v, list) and all(_count(i) for i in v),
        "cursor_next": lambda v: isinstance(v, list) and all(_count(i) for i in v),
        "rows": _table, "per_prompt": _table,
        "saved_at": lambda v: isinstance(v, str),
    }


REQUIRED = ("version", "next_step", "steps", "mode", "config", "beta_schedule", "lr_schedule", "beta_state",
            "cursor_order", "rows", "per_prompt")


def check_state(state, where) -> dict:
    """`state` (a parsed state.json) if it fits the schema, else CheckpointError naming `where` and the key."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: state.json holds a {type(state).__name__}, not a checkpoint's object")
    fields = _fields()
    unknown = sorted(str(k)[:60] for k in state if k not in fields)
    if unknown:
        raise CheckpointError(f"{where}: state.json has unknown key(s) {unknown[:5]}")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{where}: state.json lacks {missing}")
    for key, ok in fields.items():
        if key in state and not ok(state[key]):
            raise CheckpointError(f"{where}: state.json's {key!r} is not what a checkpoint holds "
                                  f"({_short(state[key])})")
    return state


def read_state(path) -> dict:
    """`path/state.json` parsed and checked; CheckpointError when it is missing, unreadable or does not fit."""
    f = Path(path) / "state.json"
    try:
        state = json.loads(f.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a complete checkpoint (no state.json)") from None
    except (OSError, ValueError) as err:        # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{f}: not readable JSON ({type(err).__name__}: {str(err)[:160]})") from None
    except RecursionError:
        raise CheckpointError(f"{f}: nested too deeply to be a checkpoint") from None
    return check_state(state, path)


def _short(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and not -MAX_INT <= v < MAX_INT:
        return f"an integer of {v.bit_length()} bits"
    text = repr(v) if not isinstance(v, (list, dict)) else f"a {type(v).__name__} of {len(v)}"
    return text[:80]


def built(state: dict, where) -> tuple:
    """(StepConfig, BetaSchedule, LRSchedule) of a checked state; CheckpointError naming the part whose values
    the classes' own rules refuse."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.multistep.schedules import BetaSchedule, LRSchedule
    out = []
    for key, make in (("config", StepConfig.from_dict), ("beta_schedule", lambda d: BetaSchedule(**d)),
                      ("lr_schedule", lambda d: LRSchedule(**d))):
        try:
            out.append(make(state[key]))
        except (ValueError, TypeError, OverflowError) as err:     # ConfigError is a ValueError
            raise CheckpointError(f"{where}: state.json's {key!r} is refused ({type(err).__name__}: "
                                  f"{str(err)[:200]})") from None
    return tuple(out)
