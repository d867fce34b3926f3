"""A run's log as rows of TRL-named metrics, read from what a run folder holds (closed schema, plain JSON/CSV):
TRL's `trainer_state.json` log_history (top level or the newest checkpoint-N/), `rookworld-debug run`'s
table.csv, or the captured steps' own logged metrics."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from rookworld_debug.errors import DataError

MAX_STEP = 2 ** 31 - 1        # a step past this is not a training run's (and its arithmetic would overflow a float)

RUN_TABLE_NAMES = {"rollout_reward": "reward", "grad_norm_pre_clip": "grad_norm", "lr": "learning_rate",
                   "reward_std": "reward_std", "kl": "kl", "entropy": "entropy", "loss": "loss",
                   "frac_reward_zero_std": "frac_reward_zero_std", "kl_grad_share": "kl_grad_share",
                   "format_valid": "format_valid", "param_delta_norm": "param_delta_norm", "beta": "beta",
                   "heldout_reward_after": "heldout_reward", "builtin_reward_after": "task_score",
                   "corr_adv_delta_logp": "corr_adv_delta_logp"}


def _num(v):
    """A logged value as a float (NaN/±inf kept), None if it is not a number (a bool, a string of words, a
    container, an integer too large for a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        return float(v)
    except (ValueError, OverflowError):
        return None


def step_of(v):
    """A step number: a whole number in [0, MAX_STEP], else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP else None


def clean_rows(rows) -> list[dict]:
    """Rows given by a caller through the same closed schema as a file's: {"step": int, str: float}; a row without
    a valid step is left out, a value that is not a number is dropped from its row."""
    out = []
    for r in rows if isinstance(rows, (list, tuple)) else ():
        step = step_of(r.get("step")) if isinstance(r, dict) else None
        if step is not None:
            out.append({"step": step, **{k: x for k, v in r.items() if isinstance(k, str) and k != "step"
                                         and (x := _num(v)) is not None}})
    return out


def rows_from_history(history) -> list[dict]:
    """TRL log_history (a list of dicts) → one row per optimizer step that logged a loss, step order."""
    by_step: dict[int, dict] = {}
    for d in history if isinstance(history, list) else []:
        if isinstance(d, dict) and step_of(d.get("step")) is not None and "loss" in d:
            row = by_step.setdefault(d["step"], {"step": d["step"]})
            row.update({k: x for k, v in d.items() if isinstance(k, str) and k != "step"
                        and (x := _num(v)) is not None})
    return [by_step[k] for k in sorted(by_step)]


def read_json(path: Path):
    """A JSON file someone handed us; DataError when it cannot be read, decoded or is nested too deeply."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError) as err:          # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DataError(f"{path} is not readable JSON ({type(err).__name__}: {str(err)[:200]})") from None
    except RecursionError:
        raise DataError(f"{path} is nested too deeply to be a run's JSON") from None



def trainer_state(run: Path):
    if (run / "trainer_state.json").is_file():
        return run / "trainer_state.json"
    ckpts = sorted((p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    return ckpts[-1] / "trainer_state.json" if ckpts else None


def rows_from_table(path: Path) -> list[dict]:
    """`rookworld-debug run`'s table.csv → rows (its 0-based step k becomes TRL's 1-based step); DataError when
    the file is not a readable UTF-8 table (a field past csv's size limit included)."""
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                step = _num(r.get("step"))
                if step is None or not math.isfinite(step) or step != int(step) or step_of(int(step) + 1) is None:
                    continue
                row = {"step": int(step) + 1}
                row.update({new: x for old, new in RUN_TABLE_NAMES.items() if (x := _num(r.get(old))) is not None})
                rows.append(row)
    except (OSError, csv.Error, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not a readable table ({type(err).__name__}: {str(err)[:200]})") from None
    return rows


def read_rows(path) -> list[dict]:
    """Rows of a run folder, a trainer_state.json, or a table.csv; DataError when it holds no log."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".csv":
            return rows_from_table(p)
        data = read_json(p)
        return rows_from_history(data.get("log_history") if isinstance(data, dict) else data)
    state = trainer_state(p)
    if state is not None:
        data = read_json(state)
        return rows_from_history(data.get("log_history") if isinstance(data, dict) else None)
    if (p / "table.csv").is_file():
        return rows_from_table(p / "table.csv")
    return []
