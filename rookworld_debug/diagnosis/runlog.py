"""A run's log as rows of TRL-named metrics, read from what a run folder holds (closed schema, plain JSON/CSV):
TRL's `trainer_state.json` log_history (top level or the newest checkpoint-N/), `rookworld-debug run`'s
table.csv, or the captured steps' own logged metrics."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from rookworld_debug.errors import DataError

RUN_TABLE_NAMES = {"rollout_reward": "reward", "grad_norm_pre_clip": "grad_norm", "lr": "learning_rate",
                   "reward_std": "reward_std", "kl": "kl", "entropy": "entropy", "loss": "loss",
                   "frac_reward_zero_std": "frac_reward_zero_std", "kl_grad_share": "kl_grad_share",
                   "format_valid": "format_valid"}


def _num(v):
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def rows_from_history(history) -> list[dict]:
    """TRL log_history (a list of dicts) → one row per optimizer step that logged a loss, step order."""
    by_step: dict[int, dict] = {}
    for d in history if isinstance(history, list) else []:
        if isinstance(d, dict) and isinstance(d.get("step"), int) and "loss" in d:
            row = by_step.setdefault(d["step"], {"step": d["step"]})
            row.update({k: _num(v) for k, v in d.items() if k != "step" and _num(v) is not None})
    return [by_step[k] for k in sorted(by_step)]


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is not readable JSON ({err})") from None


def trainer_state(run: Path):
    if (run / "trainer_state.json").is_file():
        return run / "trainer_state.json"
    ckpts = sorted((p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    return ckpts[-1] / "trainer_state.json" if ckpts else None


def rows_from_table(path: Path) -> list[dict]:
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            step = _num(r.get("step"))
            if step is None or not math.isfinite(step):
                continue
            row = {"step": int(step) + 1}
            row.update({new: _num(r.get(old)) for old, new in RUN_TABLE_NAMES.items() if _num(r.get(old)) is not None})
            rows.append(row)
    return rows


def read_rows(path) -> list[dict]:
    """Rows of a run folder, a trainer_state.json, or a table.csv; DataError when it holds no log."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".csv":
            return rows_from_table(p)
        data = _json(p)
        return rows_from_history(data.get("log_history") if isinstance(data, dict) else data)
    state = trainer_state(p)
    if state is not None:
        data = _json(state)
        return rows_from_history(data.get("log_history") if isinstance(data, dict) else None)
    if (p / "table.csv").is_file():
        return rows_from_table(p / "table.csv")
    return []
