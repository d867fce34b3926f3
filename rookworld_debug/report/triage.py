"""Run triage: from a run's trend to its steps. Pure functions over what a run folder holds.

A run folder is any of (read as it is now, so a run in progress works):

* a TRL ``output_dir``: the log history in ``trainer_state.json`` (top level, else the newest
  ``checkpoint-N/``), flight-recorder captures in any sub-folder holding ``captures.json``;
* a captures folder alone (``captures.json`` + ``step-NNNNNN/``): the log is what the captured steps logged;
* the output of ``rookworld-debug run`` (``table.csv``; its names are mapped onto TRL's).

:func:`flag_steps` replays the flight recorder's triggers (``trl.triggers``) over the log, so a step is
flagged the same way the recorder would have fired on it; :func:`trend_stats` computes what RookWorld debuggers
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


MAX_STEP = 2 ** 31 - 1        # steps past this are not a training run's (and would overflow the plot's int32 axis)


@dataclass(frozen=True)
class RunLog:
    """One run's per-step metrics and its captured steps."""
    source: str                      # where the log came from (file path and kind)
    rows: tuple                      # one dict per logged step: {"step": int, metric: float, ...}, step order
    captures: dict = field(default_factory=dict)   # step -> {"path": Path, "reasons": [...]}
    notes: tuple = ()
    broken: dict = field(default_factory=dict)     # step -> why its capture cannot be opened


def _num(v):
    """A logged value as a float (NaN/±inf kept: they are what a diverged run logs), None if not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        return float(v)
    except (ValueError, OverflowError):
        return None


def _step(v):
    """A step number: a whole number in [0, MAX_STEP], else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEP else None


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:          # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DataError(f"{path} is not readable JSON ({err})") from None
    except RecursionError:
        raise DataError(f"{path} is nested too deeply to be a run's JSON") from None


def _trainer_state(run: Path) -> Path | None:
    if (run / "trainer_state.json").is_file():
        return run / "trainer_state.json"
    ckpts = sorted((p for p in run.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    return ckpts[-1] / "trainer_state.json" if ckpts else None


def _rows_from_history(history, notes: list) -> list[dict]:
    """TRL's log_history entries that hold a training step's loss, one row per step (step order)."""
    if not isinstance(history, list):
        notes.append(f"log_history is a {type(history).__name__}, not a list of logged steps: no curves")
        return []
    by_step: dict[int, dict] = {}
    skipped, repeated = 0, set()
    for d in history:
        if not (isinstance(d, dict) and "loss" in d):
            continue                                  # an evaluation or the final summary, not a training step
        step = _step(d.get("step"))
        if step is None:
            skipped += 1
            continue
        if step in by_step:
            repeated.add(step)
        row = by_step.setdefault(step, {"step": step})
        row.update({k: _num(v) for k, v in d.items() if k != "step" and _num(v) is not None})
    if skipped:
        notes.append(f"{skipped} log entr{'y' if skipped == 1 else 'ies'} without a step number in [0, {MAX_STEP}] "
                     "left out of the curves")
    if repeated:
        notes.append(f"step(s) {_few(sorted(repeated))} logged more than once: the curves show the last values")
    return [by_step[k] for k in sorted(by_step)]


def _few(xs: list, n: int = 8) -> str:
    return ", ".join(map(str, xs[:n])) + (f" … ({len(xs)} in all)" if len(xs) > n else "")


def _rows_from_table(path: Path) -> list[dict]:
    rows = []
    try:
        with open(path, newline="") as fh:
            for r in csv.DictReader(fh):
                step = _num(r.get("step"))
                if step is None or not math.isfinite(step) or step != int(step) or _step(int(step) + 1) is None:
                    continue
                row = {"step": int(step) + 1}            # run's 0-based k → TRL's 1-based step
                row.update({new: _num(r.get(old)) for old, new in RUN_TABLE_NAMES.items()
                            if _num(r.get(old)) is not None})
                rows.append(row)
    except (OSError, csv.Error, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not a readable table ({type(err).__name__}: {err})") from None
    return rows


def _capture_problem(path: Path) -> str | None:
    """Why the captured step folder cannot be opened (cheap: its JSON and the safetensors header), or None."""
    from safetensors import safe_open
    try:
        payload = json.loads((path / "trace.json").read_text())
    except FileNotFoundError:
        return "no trace.json"
    except (OSError, ValueError, RecursionError) as err:
        return f"trace.json is unreadable ({type(err).__name__})"
    if not (isinstance(payload, dict) and isinstance(payload.get("__record__"), str)
            and isinstance(payload.get("fields"), dict)):
        return "trace.json is not a step trace"
    try:
        with safe_open(str(path / "trace.safetensors"), framework="pt") as f:
            f.keys()
    except Exception as err:  # noqa: BLE001 - safetensors raises its own and OS errors: all mean "cannot open"
        return f"trace.safetensors cannot be opened ({type(err).__name__})"
    return None


def _index_entries(index: Path, notes: list) -> list:
    data = _json(index)
    entries = data.get("captures") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        notes.append(f"{index} is not a flight-recorder index (no list of captures): its steps are left out")
        return []
    return entries


def _captures(run: Path, notes: list) -> tuple[dict, dict]:
    """({step: {"path", "reasons"}} of the captures that open, {step: why} of those that do not)."""
    out, broken = {}, {}
    for index in sorted(run.rglob("captures.json")):
        try:
            entries = _index_entries(index, notes)
        except DataError as err:
            notes.append(f"{err}: its captured steps are left out")
            continue
        home = index.parent.resolve()
        for e in entries:
            step = _step(e.get("step")) if isinstance(e, dict) else None
            if step is None:
                continue
            rel = e.get("path")
            if not isinstance(rel, str):
                err = e.get("error")
                broken[step] = f"the capture failed: {err}" if isinstance(err, str) else "the index names no folder"
                continue
            try:
                path = (index.parent / rel).resolve()
                inside = path.is_relative_to(home) and path != home
                problem = _capture_problem(path) if inside else "its folder lies outside the captures folder"
            except (OSError, ValueError, RuntimeError) as err:   # a NUL byte, a name too long, a symlink loop
                problem = f"its folder name cannot be opened ({type(err).__name__})"
            if problem:
                broken[step] = problem
                out.pop(step, None)
            else:
                reasons = e.get("reasons")
                out[step] = {"path": path, "reasons": reasons if isinstance(reasons, list) else []}
                broken.pop(step, None)
    return out, broken


def read_run(run_dir) -> RunLog:
    """The run's log and captures (see module doc); DataError when the folder holds neither."""
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"{run} is not a folder")
    notes: list = []
    captures, broken = _captures(run, notes)
    state = _trainer_state(run)
    if state is not None:
        data = _json(state)
        if not isinstance(data, dict):
            notes.append(f"{state} holds a {type(data).__name__}, not TRL's trainer state: no curves")
        rows = _rows_from_history(data.get("log_history") if isinstance(data, dict) else [], notes)
        source = f"{state} (TRL log_history)"
    elif (run / "table.csv").is_file():
        rows, source = _rows_from_table(run / "table.csv"), f"{run / 'table.csv'} (rookworld-debug run)"
    elif captures or broken:
        rows, source = [], "captured steps only"
        notes.append("no trainer_state.json: the curves hold only the captured steps' own logs")
    else:
        raise DataError(f"{run} is not a run: no trainer_state.json (TRL output_dir or checkpoint-N/), no "
                        "table.csv (rookworld-debug run) and no captures.json (flight recorder)")
    if not rows and captures:
        rows = _rows_from_captures(captures)
    if not rows:
        notes.append("the log holds no training step yet: no curves")
    if broken:
        notes.append(f"{len(broken)} captured step(s) cannot be opened ({_few(sorted(broken))}): the flagged-steps "
                     "table says why")
    if not captures and not broken:
        notes.append("no captured steps: flagged steps cannot be opened. Next time attach the flight recorder: "
                     "capture_steps(trainer, out_dir=..., keep_last=4, triggers='default')")
    return RunLog(source=source, rows=tuple(rows), captures=captures, notes=tuple(notes), broken=broken)


def _rows_from_captures(captures: dict) -> list[dict]:
    rows = []
    for step, c in sorted(captures.items()):
        payload = _json(Path(c["path"]) / "trace.json")
        cap = _get(_get(_get(payload, "fields"), "capture"), "fields")
        logged = _plain(cap.get("logged_metrics"), c["path"])
        rows.append({"step": step, **{k: _num(v) for k, v in logged.items() if _num(v) is not None}})
    return rows


def _get(d, key) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def _plain(encoded, path) -> dict:
    """A trace.json sub-value decoded by the trace format's own (allowlisted) decoder; {} if it is not a dict."""
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.trace.serialize import decode
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
        fired = run_triggers(triggers, row["step"], row, None)
        out += [{"step": row["step"], **f.to_dict()} for f in fired]
        said = {f.detail.split(" is ")[0] for f in fired if f.kind == "non-finite"}
        bad = [k for k, v in row.items() if k != "step" and not math.isfinite(v) and k not in said]
        if bad:                                   # a diverged run: every non-finite metric, not only loss/grad norm
            out.append({"step": row["step"], "trigger": "non_finite", "value": repr(row[bad[0]]),
                        "threshold": "inf", "kind": "non-finite",
                        "detail": "non-finite: " + ", ".join(f"{k} is {row[k]}" for k in bad[:6])
                                  + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else "") + " (a gap in its curve)"})
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
