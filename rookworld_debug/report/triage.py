"""Run triage: from a run's trend to its steps (issue 27). Pure functions over what a run folder holds.

A run folder is any of (read as it is now, so a run in progress works):

* a TRL ``output_dir``: the log history in ``trainer_state.json`` (top level, else the newest
  ``checkpoint-N/``), flight-recorder captures in any sub-folder holding ``captures.json``;
* a captures folder alone (``captures.json`` + ``step-NNNNNN/``): the log is what the captured steps logged;
* the output of ``rookworld-debug run`` (``table.csv``; its names are mapped onto TRL's).

:func:`flag_steps` replays the flight recorder's triggers (``trl.triggers``) over the log, so a step is
flagged the same way the recorder would have fired on it; :func:`trend_stats` computes what the seeds
computed by hand (moving average, up/down steps, net change with a 95 % interval, KL-dominated steps).
"""
from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rookworld_debug.errors import DataError

# `rookworld-debug run` table column → TRL's logged name
RUN_TABLE_NAMES = {"rollout_reward": "reward", "grad_norm_pre_clip": "grad_norm", "lr": "learning_rate",
                   "reward_std": "reward_std", "kl": "kl", "entropy": "entropy", "loss": "loss",
                   "frac_reward_zero_std": "frac_reward_zero_std", "kl_grad_share": "kl_grad_share"}
CURVES = ("reward", "kl", "entropy", "clip_ratio/region_mean", "grad_norm", "frac_reward_zero_std",
          "completions/mean_length", "completions/clipped_ratio", "learning_rate", "loss")


@dataclass(frozen=True)
class RunLog:
    """One run's per-step metrics and its captured steps."""
    source: str                      # where the log came from (file path and kind)
    rows: tuple                      # one dict per logged step: {"step": int, metric: float, ...}, step order
    captures: dict = field(default_factory=dict)   # step -> {"path": Path, "reasons": [...]}
    notes: tuple = ()


def _num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} is not readable JSON ({err})") from None


def _trainer_state(run: Path) -> Path | None:
    if (run / "trainer_state.json").is_file():
        return run / "trainer_state.json"
    ckpts = sorted((p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    return ckpts[-1] / "trainer_state.json" if ckpts else None


def _rows_from_history(history) -> list[dict]:
    by_step: dict[int, dict] = {}
    for d in history if isinstance(history, list) else []:
        if isinstance(d, dict) and isinstance(d.get("step"), int) and "loss" in d:
            row = by_step.setdefault(d["step"], {"step": d["step"]})
            row.update({k: _num(v) for k, v in d.items() if k != "step" and _num(v) is not None})
    return [by_step[k] for k in sorted(by_step)]


def _rows_from_table(path: Path) -> list[dict]:
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            step = _num(r.get("step"))
            if step is None:
                continue
            row = {"step": int(step) + 1}            # run's 0-based k → TRL's 1-based step
            row.update({new: _num(r.get(old)) for old, new in RUN_TABLE_NAMES.items() if _num(r.get(old)) is not None})
            rows.append(row)
    return rows


def _captures(run: Path) -> dict:
    out = {}
    for index in sorted(run.rglob("captures.json")):
        data = _json(index)
        for e in data.get("captures", []) if isinstance(data, dict) else []:
            if isinstance(e, dict) and isinstance(e.get("step"), int) and isinstance(e.get("path"), str):
                path = (index.parent / e["path"]).resolve()
                if path.is_relative_to(index.parent.resolve()) and (path / "trace.json").is_file():
                    out[e["step"]] = {"path": path, "reasons": e.get("reasons") or []}
    return out


def read_run(run_dir) -> RunLog:
    """The run's log and captures (see module doc); DataError when the folder holds neither."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"{run} is not a folder")
    captures, notes = _captures(run), []
    state = _trainer_state(run)
    if state is not None:
        rows, source = _rows_from_history(_json(state).get("log_history")), f"{state} (TRL log_history)"
    elif (run / "table.csv").is_file():
        rows, source = _rows_from_table(run / "table.csv"), f"{run / 'table.csv'} (rookworld-debug run)"
    elif captures:
        rows, source = [], "captured steps only"
        notes.append("no trainer_state.json: the curves hold only the captured steps' own logs")
    else:
        raise DataError(f"{run} is not a run: no trainer_state.json (TRL output_dir or checkpoint-N/), no "
                        "table.csv (rookworld-debug run) and no captures.json (flight recorder)")
    if not rows and captures:
        rows = _rows_from_captures(captures)
    if not captures:
        notes.append("no captured steps: flagged steps cannot be opened. Next time attach the flight recorder: "
                     "capture_steps(trainer, out_dir=..., keep_last=4, triggers='default')")
    return RunLog(source=source, rows=tuple(rows), captures=captures, notes=tuple(notes))


def _rows_from_captures(captures: dict) -> list[dict]:
    rows = []
    for step, c in sorted(captures.items()):
        payload = _json(Path(c["path"]) / "trace.json")
        cap = (payload.get("fields", {}).get("capture") or {}).get("fields", {}) if isinstance(payload, dict) else {}
        logged = _plain(cap.get("logged_metrics"), c["path"])
        rows.append({"step": step, **{k: _num(v) for k, v in logged.items() if _num(v) is not None}})
    return rows


def _plain(encoded, path) -> dict:
    """A trace.json sub-value decoded by the trace format's own (allowlisted) decoder; {} if it is not a dict."""
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.serialize import decode
    try:
        value = decode(encoded, {}, str(path))
    except TraceError:
        return {}
    return value if isinstance(value, dict) else {}


def flag_steps(rows, triggers=None) -> list[dict]:
    """One entry per firing: step, trigger, value, threshold, kind, detail (the recorder's triggers, replayed)."""
    from rookworld_debug.trl.triggers import default_triggers, run_triggers
    triggers = default_triggers() if triggers is None else triggers
    out = []
    for row in rows:
        for f in run_triggers(triggers, row["step"], row, None):
            out.append({"step": row["step"], **f.to_dict()})
    return out


def moving_average(xs: list, window: int) -> list:
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-window:]
        vals = [v for v in acc if v is not None and math.isfinite(v)]
        out.append(statistics.fmean(vals) if vals else math.nan)
    return out


def trend_stats(rows, metric: str = "reward", window: int = 10) -> dict:
    """Up/down steps of ``metric``, its net change (last − first) and the OLS slope × (n − 1) with a 95 %
    interval (normal approximation), and the share of steps where the KL term dominates the gradient."""
    pts = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None and math.isfinite(r[metric])]
    res = {"metric": metric, "n": len(pts), "window": window}
    if len(pts) < 3:
        return {**res, "note": f"fewer than 3 logged values of {metric}"}
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    diffs = [b - a for a, b in zip(ys, ys[1:])]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys)]
    se = math.sqrt(sum(e * e for e in resid) / (len(pts) - 2) / sxx) if sxx > 0 else math.nan
    span = xs[-1] - xs[0]
    kl_share = [r["kl_grad_share"] for r in rows if r.get("kl_grad_share") is not None]
    return {**res, "up_steps": sum(d > 0 for d in diffs), "down_steps": sum(d < 0 for d in diffs),
            "flat_steps": sum(d == 0 for d in diffs), "first": ys[0], "last": ys[-1], "net_change": ys[-1] - ys[0],
            "trend_change": slope * span, "trend_change_ci95": (slope * span - 1.96 * se * span,
                                                                slope * span + 1.96 * se * span),
            "trend_definition": "OLS slope of the metric on the step × (last step − first step), 95 % interval "
                                "from the slope's standard error (normal approximation; steps are not independent)",
            "moving_average": moving_average(ys, window), "steps": xs,
            "kl_dominated_share": (sum(s > 0.5 for s in kl_share) / len(kl_share)) if kl_share else None,
            "kl_dominated_definition": ("share of steps whose kl_grad_share (‖∇ β·KL‖ share of the gradient) > 0.5"
                                        if kl_share else "n/a: the log has no gradient split (TRL does not log it)")}
