"""One run of a sweep in its own worker process: papermill executes the notebook, nbconvert exports the HTML,
and the run folder is finalized with summary.json LAST (what makes the run count). `report.runner` drives the
workers (local threads or Dask tasks); the on-disk contract is in the package docstring."""
from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import os
import signal
import sys
import time
import traceback as _traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rookworld_debug.report.export import _strip_ansi, error_page, export_html
from rookworld_debug.report.grid import _fmt_value
from rookworld_debug.report.store import (
    _EXIT_SKIPPED, _RUNNER_KEYS, _STALE_FILES, SUMMARY_SCHEMA, IncompleteSummaryError, _load_json, _now,
    _sha256_file, atomic_write_json, atomic_write_text, is_complete,
)


@contextlib.contextmanager
def _run_lock(run_dir: Path):
    """Exclusive flock on ``run_dir/.lock`` for the duration of a run (released if the process dies)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = open(run_dir / ".lock", "a+")  # noqa: SIM115
    try:
        try:
            import fcntl
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX
            pass
        yield
    finally:
        fh.close()


def _run_banner(task: Mapping[str, Any]) -> str:
    """The report's header: which notebook, which sweep and run, with which parameters, and links."""
    esc = html.escape
    params = " ".join(f"<code>{esc(k)}={esc(_fmt_value(v))}</code>" for k, v in task["params"].items())
    nb = Path(str(task.get("notebook") or "")).stem
    if task.get("title"):                       # a page of its own (triage): what it shows, not how it was made
        return ("<header class='rookworld-run-banner' style='font:13px system-ui,sans-serif;color:#57606a;"
                "border-bottom:1px solid #d0d7de;padding:.4rem 0 .5rem;margin-bottom:.5rem'>"
                f"<div style='font-size:15px;color:#1f2328'><b>rookworld_debug</b> · {esc(str(task['title']))}</div>"
                "</header>")                    # no links: the page is copied away from its run folder
    return ("<header class='rookworld-run-banner' style='font:13px system-ui,sans-serif;color:#57606a;"
            "border-bottom:1px solid #d0d7de;padding:.4rem 0 .5rem;margin-bottom:.5rem'>"
            f"<div style='font-size:15px;color:#1f2328'><b>rookworld_debug report</b>"
            f"{f' · notebook <code>{esc(nb)}</code>' if nb else ''}</div>"
            f"<div>sweep <b>{esc(str(task.get('sweep') or '—'))}</b> · run <b>{esc(task['run_id'])}</b> · "
            f"parameters: {params or 'the notebook defaults'}</div>"
            f"<div><a href='../index.html'>← sweep index</a> · <a href='summary.json'>summary.json</a> · "
            f"<a href='report.ipynb'>executed notebook</a></div></header>")


def _error_from_exception(exc: BaseException, output_nb: Path | None) -> dict:
    """ename/evalue/traceback and, where known, the failing cell's index and source."""
    err: dict[str, Any] = {}
    if all(hasattr(exc, a) for a in ("ename", "evalue", "traceback", "cell_index")):  # PapermillExecutionError
        err.update(ename=exc.ename, evalue=exc.evalue, traceback=list(exc.traceback or []),
                   cell_index=exc.cell_index, exec_count=getattr(exc, "exec_count", None),
                   cell_source=getattr(exc, "source", None))
    else:
        err.update(ename=type(exc).__name__, evalue=str(exc),
                   traceback=_traceback.format_exception(type(exc), exc, exc.__traceback__),
                   cell_index=None, exec_count=None, cell_source=None)
        if output_nb is not None and output_nb.exists():     # e.g. a cell timeout or a dead kernel
            with contextlib.suppress(Exception):
                import nbformat
                nb = nbformat.read(str(output_nb), as_version=4)
                code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
                meta = [c.get("metadata", {}).get("papermill", {}) for _, c in code]
                hit = next((k for k, m in enumerate(meta) if m.get("status") == "running" or m.get("exception")),
                           None)
                if hit is None:    # papermill marks a timed-out cell "completed": take the last one started
                    started = [k for k, m in enumerate(meta) if m.get("start_time")]
                    if started and started[-1] + 1 < len(meta):
                        hit = started[-1]
                if hit is not None:
                    i, cell = code[hit]
                    err.update(cell_index=i, exec_count=cell.get("execution_count"), cell_source=cell.source)
    err["traceback_text"] = _strip_ansi("\n".join(err["traceback"]) if isinstance(err["traceback"], list)
                                        else str(err["traceback"]))
    return err


def execute_run(task: Mapping[str, Any]) -> dict:
    """Execute one run described by ``task`` (keys: notebook, run_dir, run_id, params, params_hash,
    sweep, kernel_name, timeout_per_cell, start_timeout, resume, require_summary) and finalize its
    folder. Returns the final summary (``status`` ok/failed) or ``{"status": "skipped"}`` when, under
    the lock, the run turned out complete already. Never raises for a notebook failure."""
    import papermill as pm

    run_dir = Path(task["run_dir"])
    notebook = Path(task["notebook"])
    with _run_lock(run_dir):
        if task.get("resume", True) and is_complete(run_dir, task["params_hash"]):
            return {"status": "skipped", "run_id": task["run_id"]}
        started = _start_run(run_dir, task, notebook)
        partial = run_dir / ".report.partial.ipynb"
        final_nb = run_dir / "report.ipynb"
        t0 = time.perf_counter()
        error: dict | None = None
        try:
            pm.execute_notebook(
                str(notebook), str(partial),
                parameters={**task["params"], "run_dir": str(run_dir)},
                kernel_name=task.get("kernel_name", "python3"), progress_bar=False, log_output=False,
                start_timeout=task.get("start_timeout", 120), cwd=str(notebook.parent),
                execution_timeout=task.get("timeout_per_cell"))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a failed-run record
            error = _error_from_exception(exc, partial)
        papermill_s = time.perf_counter() - t0
        if partial.exists():
            os.replace(partial, final_nb)

        nb_summary, runner_warnings = {}, []
        if error is None:
            nb_summary, error, runner_warnings = _notebook_summary(run_dir, task)
        nbconvert_s, check = 0.0, None
        if error is None:
            nbconvert_s, check, error = _export(run_dir, final_nb, task)
            if check is not None:
                runner_warnings.extend(check.warnings())
        timing = {"started_at": started, "finished_at": _now(), "papermill_s": round(papermill_s, 3),
                  "nbconvert_s": round(nbconvert_s, 3), "total_s": round(time.perf_counter() - t0, 3)}
        summary = _final_summary(task, notebook, nb_summary, error, final_nb.exists(), timing, check,
                                 runner_warnings, pm.__version__)
        if error is not None:
            links = {"report.ipynb (executed up to the failure)": "report.ipynb", "runner.log": "runner.log",
                     "index": "../index.html"}
            atomic_write_text(run_dir / "error.html", error_page(
                run_id=task["run_id"], params=task["params"], error=error, sweep=task.get("sweep"),
                notebook=str(notebook), links=links))
        atomic_write_json(run_dir / "summary.json", summary)   # LAST: this is what makes the run count
        return summary


def _start_run(run_dir: Path, task: Mapping[str, Any], notebook: Path) -> str:
    """Clear a previous attempt's files (summary.json first: never an ok summary without its files) and write
    params.json; returns the start time."""
    for name in _STALE_FILES:
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    for tmp in run_dir.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()
    started = _now()
    atomic_write_json(run_dir / "params.json", {
        "run_id": task["run_id"], "sweep": task.get("sweep"), "params": task["params"],
        "params_hash": task["params_hash"], "notebook": str(notebook), "started_at": started})
    return started


def _notebook_summary(run_dir: Path, task: Mapping[str, Any]) -> tuple[dict, dict | None, list]:
    """(the summary.json the notebook wrote, an error record or None, runner warnings)."""
    raw = run_dir / "summary.json"
    if raw.exists():
        try:
            loaded = _load_json(raw)
            if not isinstance(loaded, dict):
                raise IncompleteSummaryError(raw, "the notebook's summary is not a JSON object")
            return loaded, None, []
        except IncompleteSummaryError as exc:
            return {}, _error_from_exception(exc, None), []
    if task.get("require_summary", True):
        return {}, {"ename": "MissingSummary",
                    "evalue": "the notebook finished but wrote no summary.json to run_dir (use "
                              "rookworld_debug.report.atomic_write_json(Path(run_dir) / 'summary.json', {...}))",
                    "traceback": [], "cell_index": None, "exec_count": None, "cell_source": None,
                    "traceback_text": ""}, []
    return {}, None, ["the notebook wrote no summary.json"]


def _export(run_dir: Path, final_nb: Path, task: Mapping[str, Any]) -> tuple:
    """report.html from the executed notebook: (seconds, the HTML check or None, an error record or None)."""
    t1 = time.perf_counter()
    check, error = None, None
    try:
        body, check = export_html(final_nb, banner=_run_banner(task))
        atomic_write_text(run_dir / "report.html", body)
    except Exception as exc:  # noqa: BLE001
        error = _error_from_exception(exc, None)
        error["ename"] = f"HTMLExportError: {error['ename']}"
    return time.perf_counter() - t1, check, error


def _final_summary(task, notebook: Path, nb_summary: dict, error, has_ipynb: bool, timing: dict, check,
                   runner_warnings: list, papermill_version: str) -> dict:
    """The run's summary.json: the notebook's fields (runner-owned keys moved aside) plus the runner's."""
    for key in _RUNNER_KEYS:                      # the runner owns these; keep the notebook's aside
        if key in nb_summary:
            nb_summary.setdefault("notebook_fields", {})[key] = nb_summary.pop(key)
    summary = dict(nb_summary)
    summary.setdefault("metrics", {})
    files = {"params": "params.json", "report_ipynb": "report.ipynb" if has_ipynb else None,
             "runner_log": "runner.log"}
    if error is None:
        files["report_html"] = "report.html"
    else:
        files["error_html"] = "error.html"
    summary.update({
        "schema": SUMMARY_SCHEMA,
        "status": "ok" if error is None else "failed",
        "run_id": task["run_id"], "sweep": task.get("sweep"),
        "params": task["params"], "params_hash": task["params_hash"],
        "notebook": str(notebook), "notebook_sha256": _sha256_file(notebook),
        "files": files,
        "runner": {
            **timing,
            "html_bytes": None if check is None else check.bytes,
            "html_check": None if check is None else {**dataclasses.asdict(check), "offline_ok": check.offline_ok},
            "kernel_name": task.get("kernel_name", "python3"),
            "host": os.uname().nodename, "pid": os.getpid(), "parent_pid": os.getppid(),
            "python": sys.version.split()[0],
            "papermill": papermill_version, "warnings": runner_warnings,
        },
    })
    if error is not None:
        summary["error"] = error
    return summary


def _set_parent_death_signal(expected_parent: int | None) -> None:
    """Linux: get SIGTERM when the process (thread) that started us dies, so a SIGKILLed sweep leaves no
    orphan worker behind; exit at once if it is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(143)


def _worker_main(task_path: str) -> int:
    """Entry point of the per-run worker process."""
    task = json.loads(Path(task_path).read_text(encoding="utf-8"))
    parent = os.environ.get("ROOKWORLD_REPORT_PARENT_PID")
    _set_parent_death_signal(int(parent) if parent else None)

    def _terminate(signum, frame):  # turn SIGTERM into an exception so papermill shuts its kernel down
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the sweep process decides what Ctrl-C means
    sys.stdout.write(f"=== {_now()} run {task['run_id']} pid {os.getpid()} host {os.uname().nodename}\n")
    sys.stdout.flush()
    summary = execute_run(task)
    if summary.get("status") == "skipped":
        return _EXIT_SKIPPED
    return 0 if summary.get("status") == "ok" else 1
