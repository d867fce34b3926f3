"""`rookworld-debug triage RUN_DIR`: triage.json + triage.html (notebook 04 under papermill) in RUN_DIR/triage/.

Idempotent: step reports (notebook 01 on each flagged, captured step) are rendered only when missing, and the
page only when triage.json changed (both through the sweep runner's resume, keyed by their parameters).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from rookworld_debug.report.triage import CURVES, flag_steps, read_run, trend_stats


def build_triage(run_dir, *, window: int = 10) -> dict:
    """Everything the page shows, as plain JSON (no step reports rendered: `report` is None)."""
    run_dir = Path(run_dir).resolve()             # the page's kernel runs in another folder
    log = read_run(run_dir)
    flagged = flag_steps(log.rows)
    for f in flagged:
        f.update(captured=f["step"] in log.captures, report=None, broken=log.broken.get(f["step"]))
    findings, step_top = run_findings(log)
    for f in flagged:
        f["top_finding"] = step_top.get(f["step"])
    return {"format": 1, "run_dir": str(Path(run_dir).resolve()), "source": log.source, "notes": list(log.notes),
            "findings": findings, "rows": list(log.rows), "curves": list(CURVES), "window": window, "flagged": flagged,
            "captured_steps": sorted(log.captures), "captures_present": bool(log.captures or log.broken),
            "capture_paths": {str(k): str(v["path"]) for k, v in log.captures.items()},
            "broken_captures": {str(k): v for k, v in sorted(log.broken.items())},
            "trend": trend_stats(log.rows, "reward", window)}


def run_findings(log) -> tuple[list, dict]:
    """(the run's findings — its log's run-level checks and every captured step's checks, one per cause, most
    likely first — as JSON; {step: that step's top finding}, from its capture when it has one, else the log)."""
    from rookworld_debug.diagnosis.registry import diagnose_rows, diagnose_step, merge, rank, rank_run, replace_step
    from rookworld_debug.errors import RookWorldError
    from rookworld_debug.grpo.step import StepTrace
    from_log = diagnose_rows(log.rows)
    found, step_top = list(from_log), {}
    for f in from_log:                                 # a run-level finding names the step where it first holds
        if f.step is not None:
            step_top.setdefault(f.step, f.to_dict())
    for step, c in sorted(log.captures.items()):
        try:
            mine = [replace_step(f, step) for f in diagnose_step(StepTrace.load(c["path"]), c["path"])[0]]
        except RookWorldError:                         # an unreadable capture is the capture's own note on the page
            continue
        here = rank(merge(mine + [f for f in from_log if f.step == step]))
        if here:
            step_top[step] = here[0].to_dict()
        found += mine
    return [f.to_dict() for f in rank_run(merge(found))], step_top


MAX_STEP_REPORTS = 8   # rendered by `triage` itself (~15 s each on 2 CPU cores); the rest on demand


def _lazy_report(t: dict, step: int, out: Path) -> tuple[str, str]:
    """(where the step's report will be, relative to the page; the command that renders it there)."""
    name = f"step-{int(step):06d}"
    rel = f"step-reports/{name}/run/report.html"
    cmd = shlex.join(["rookworld-debug", "report", "--trace", t["capture_paths"][str(step)],
                      "--out", str(out / "step-reports"), "--sweep-name", name])
    return rel, cmd


def _render_step_reports(t: dict, out: Path, progress: bool, limit: int = MAX_STEP_REPORTS,
                         workers: int = 1) -> tuple[dict, dict]:
    """({step: report.html}, {step: why its report failed}) for the first `limit` flagged captured steps
    (rendered only when missing)."""
    from rookworld_debug.notebook import notebook_path
    from rookworld_debug.report import run_sweep
    steps = sorted({f["step"] for f in t["flagged"] if f["captured"]})[:max(limit, 0)]
    if not steps:
        return {}, {}
    grid = [{"trace_path": t["capture_paths"][str(s)]} for s in steps]
    step_of = {t["capture_paths"][str(s)]: s for s in steps}
    res = run_sweep(notebook_path("01_grpo_step.ipynb"), grid, sweep_name="steps", out_root=out, workers=workers,
                    resume=True, progress=progress,
                    title=lambda p: f"step {step_of[p['trace_path']]} of the run {t['run_dir']}, as it was captured")
    by_trace = {r.params["trace_path"]: r for r in res.runs}
    done, failed = {}, {}
    for s in steps:
        run = by_trace[t["capture_paths"][str(s)]]
        html = Path(run.run_dir) / "report.html"
        if html.is_file() and run.status in ("ok", "skipped"):
            done[s] = html
        else:
            failed[s] = f"its step report failed: {str(run.error or run.status)[:300]}"
    return done, failed


def _render_page(json_path: Path, out: Path, progress: bool, run_dir: str) -> Path:
    from rookworld_debug.notebook import notebook_path
    from rookworld_debug.report import run_sweep
    digest = hashlib.sha256(json_path.read_bytes()).hexdigest()[:16]
    res = run_sweep(notebook_path("04_run_triage.ipynb"), [{"triage_json": str(json_path), "content": digest}],
                    sweep_name="page", out_root=out, workers=1, resume=True, progress=progress,
                    strict_params=False, require_summary=False, title=f"triage of the run {run_dir}")
    run = res.runs[0]
    html = Path(run.run_dir) / "report.html"
    if not html.is_file():
        from rookworld_debug.errors import DataError
        raise DataError(f"the triage page did not render: {run.error or run.status} ({run.run_dir})")
    return html


def triage(run_dir, out=None, *, progress: bool = True, render_steps: bool = True,
           max_step_reports: int = MAX_STEP_REPORTS, workers: int = 1) -> Path:
    """Write triage.json and triage.html into `out` (default RUN_DIR/triage); return the HTML's path.

    The reports of the first `max_step_reports` flagged captured steps are rendered now (`workers` at once);
    every other flagged captured step gets `report_command`: the command that renders its report where the
    page's link (`report`, with `report_rendered` false) points — a run with 50 captures triages in seconds."""
    from rookworld_debug.safeio import atomic_write_json, check_output_dir
    run = Path(run_dir).resolve()
    out = check_output_dir(Path(out).resolve() if out else run / "triage", "--out")
    t = build_triage(run)
    out.mkdir(parents=True, exist_ok=True)
    reports, failed = _render_step_reports(t, out, progress, max_step_reports, workers) if render_steps else ({}, {})
    for f in t["flagged"]:
        r = reports.get(f["step"])
        f["report"], f["report_rendered"], f["report_command"] = (os.path.relpath(r, out) if r else None), bool(r), None
        if f["step"] in failed:                    # the capture's files are there but do not open as a step
            f["broken"], f["captured"] = failed[f["step"]], False
        elif f["captured"] and not r:
            rel, cmd = _lazy_report(t, f["step"], out)
            f["report_rendered"] = (out / rel).is_file()
            f["report"], f["report_command"] = rel, (None if f["report_rendered"] else cmd)
    json_path = atomic_write_json(out / "triage.json", t)
    page = _render_page(json_path, out, progress, str(t["run_dir"]))
    dest = out / "triage.html"
    if not dest.is_file() or dest.read_bytes() != page.read_bytes():
        shutil.copyfile(page, dest)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug triage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a TRL output_dir, a captures folder, or a `rookworld-debug run` folder")
    ap.add_argument("--out", default=None, help="output folder (default RUN_DIR/triage)")
    ap.add_argument("--no-step-reports", action="store_true", help="render no step report now (the page gives "
                                                                   "each captured step's command instead)")
    ap.add_argument("--max-step-reports", type=int, default=MAX_STEP_REPORTS,
                    help=f"render at most this many step reports now (default {MAX_STEP_REPORTS}); the page gives the "
                         "command for the rest")
    ap.add_argument("--workers", type=int, default=1, help="step reports rendered in parallel")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if a.max_step_reports < 0 or a.workers < 1:
        from rookworld_debug.errors import ConfigError
        raise ConfigError("--max-step-reports/--workers", f"need ≥ 0 reports and ≥ 1 worker, got "
                                                          f"{a.max_step_reports} and {a.workers}")
    page = triage(a.run_dir, a.out, progress=a.progress, render_steps=not a.no_step_reports,
                  max_step_reports=a.max_step_reports, workers=a.workers)
    t = json.loads((page.parent / "triage.json").read_text())
    print(f"{len(t['rows'])} logged steps, {len(t['flagged'])} firings "
          f"({sum(f['captured'] for f in t['flagged'])} on captured steps)")
    for n in t["notes"]:
        print(f"note: {n}")
    print(f"triage: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
