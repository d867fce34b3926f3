"""Running a sweep: one run in its own worker process (report/worker.py: papermill → HTML → summary.json),
driven by local threads or Dask tasks, resumable. See the package docstring for the on-disk contract."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rookworld_debug.errors import ConfigError
from rookworld_debug.report.export import error_page
from rookworld_debug.report.grid import Grid, _check_name, _sweep_dir_name, run_id
from rookworld_debug.report.index import write_index
from rookworld_debug.report.store import (
    _EXIT_SKIPPED, SUMMARY_SCHEMA, IncompleteSummaryError, SweepError,
    _flatten_metrics, _now, atomic_write_json, atomic_write_text, is_complete,
    params_hash, read_summary, to_jsonable,
)
# one run in its worker process lives in report/worker.py; these names stay importable from here
from rookworld_debug.report.worker import _worker_main, execute_run  # noqa: F401


# ----------------------------------------------------------------------------------------------------
# driving runs: worker process per run, local threads or Dask tasks
# ----------------------------------------------------------------------------------------------------

_PROCS: dict[str, subprocess.Popen] = {}
_PROCS_LOCK = threading.Lock()
_CANCEL = threading.Event()


def run_task_subprocess(task: Mapping[str, Any]) -> dict:
    """Run one task in a fresh worker process and return its outcome (also the Dask task function).
    Writes ``<run_dir>/.task.json`` (re-run a single run by hand with
    ``python -m rookworld_debug.report --worker <run_dir>/.task.json``)."""
    run_dir = Path(task["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    task_path = atomic_write_json(run_dir / ".task.json", dict(task))
    env = dict(os.environ)
    env["ROOKWORLD_REPORT_PARENT_PID"] = str(os.getpid())
    env.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for var, value in (task.get("env") or {}).items():
        env.setdefault(var, str(value))
    t0 = time.perf_counter()
    with open(run_dir / "runner.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rookworld_debug.report", "--worker", str(task_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        with _PROCS_LOCK:
            _PROCS[task["run_id"]] = proc
        try:
            rc = proc.wait()
        finally:
            with _PROCS_LOCK:
                _PROCS.pop(task["run_id"], None)
    wall = time.perf_counter() - t0
    out = {"run_id": task["run_id"], "rc": rc, "wall_s": round(wall, 3)}
    if rc == _EXIT_SKIPPED:
        return {**out, "status": "skipped"}
    try:
        summary = read_summary(run_dir, params_hash=task["params_hash"], require_ok=False)
    except IncompleteSummaryError as exc:
        if _CANCEL.is_set() or rc in (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM):
            return {**out, "status": "interrupted"}
        # the worker died without finalizing (OOM kill, segfault...): record it as a failed run
        log_tail = ""
        with contextlib.suppress(OSError):
            log_tail = (run_dir / "runner.log").read_text(errors="replace")[-6000:]
        error = {"ename": "WorkerDied", "evalue": f"worker process exited with {rc} ({exc.reason})",
                 "traceback": [log_tail], "traceback_text": log_tail, "cell_index": None,
                 "exec_count": None, "cell_source": None}
        summary = {"schema": SUMMARY_SCHEMA, "status": "failed", "run_id": task["run_id"],
                   "sweep": task.get("sweep"), "params": task["params"], "params_hash": task["params_hash"],
                   "notebook": task["notebook"], "metrics": {}, "error": error,
                   "files": {"params": "params.json", "error_html": "error.html", "runner_log": "runner.log"},
                   "runner": {"finished_at": _now(), "total_s": round(wall, 3), "rc": rc}}
        atomic_write_text(run_dir / "error.html", error_page(
            run_id=task["run_id"], params=task["params"], error=error, sweep=task.get("sweep"),
            notebook=task["notebook"], links={"runner.log": "runner.log", "index": "../index.html"}))
        atomic_write_json(run_dir / "summary.json", summary)
    return {**out, "status": summary["status"], "summary": summary}


def _terminate_all(grace_s: float = 10.0) -> None:
    with _PROCS_LOCK:
        procs = list(_PROCS.values())
    for p in procs:
        with contextlib.suppress(OSError):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()


@dataclass(frozen=True)
class RunOutcome:
    """One run of a sweep. ``status``: ok (executed now), skipped (complete from before), failed,
    interrupted (stopped by the user), not_run (never started because the sweep was interrupted)."""

    run_id: str
    params: dict
    params_hash: str
    status: str
    run_dir: Path
    wall_s: float | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)

    @property
    def report_html(self) -> Path | None:
        p = self.run_dir / "report.html"
        return p if self.status in ("ok", "skipped") and p.exists() else None

    @property
    def error_html(self) -> Path | None:
        p = self.run_dir / "error.html"
        return p if self.status == "failed" and p.exists() else None


@dataclass(frozen=True)
class SweepResult:
    """What :func:`run_sweep` did. ``exit_code``: 0 every run ok or skipped, 1 some run failed (or was
    stopped by something other than the user), 130 the sweep was interrupted."""

    sweep_name: str
    sweep_dir: Path
    index_html: Path
    index_json: Path
    runs: tuple
    interrupted: bool = False
    wall_s: float = 0.0

    def _count(self, status: str) -> int:
        return sum(r.status == status for r in self.runs)

    @property
    def n_ok(self) -> int:
        return self._count("ok")

    @property
    def n_skipped(self) -> int:
        return self._count("skipped")

    @property
    def n_failed(self) -> int:
        return self._count("failed")

    @property
    def executed(self) -> list[RunOutcome]:
        return [r for r in self.runs if r.status in ("ok", "failed")]

    @property
    def failed(self) -> list[RunOutcome]:
        return [r for r in self.runs if r.status == "failed"]

    @property
    def n_incomplete(self) -> int:
        """Runs stopped (interrupted) or never started (not_run)."""
        return self._count("interrupted") + self._count("not_run")

    @property
    def ok(self) -> bool:
        return not self.interrupted and self.n_failed == 0 and self.n_incomplete == 0

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if (self.n_failed or self.n_incomplete) else 0


def _resolve_grid(grid) -> tuple[list[dict], list[str], dict]:
    """Grid | mapping name → values | list of param dicts → (param sets, swept names, grid record)."""
    if isinstance(grid, Grid):
        return grid.expand(), grid.swept, grid.to_dict()
    if isinstance(grid, Mapping):
        g = Grid(axes={k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in grid.items()})
        return g.expand(), g.swept, g.to_dict()
    runs = [dict(p) for p in grid]
    if not runs:
        raise ConfigError("grid", "no parameter sets")
    for p in runs:
        for k in p:
            _check_name(k, "grid")
    keys: list[str] = []
    for p in runs:
        keys.extend(k for k in p if k not in keys)
    if len(runs) == 1:
        swept = keys
    else:
        swept = [k for k in keys if len({json.dumps(to_jsonable(p.get(k)), sort_keys=True) for p in runs}) > 1]
    return runs, swept, {"name": None, "runs": to_jsonable(runs)}


def _check_notebook_params(notebook: Path, names: Iterable[str]) -> None:
    import papermill as pm
    declared = pm.inspect_notebook(str(notebook))
    if not declared:           # no parameters cell: papermill injects at the top, nothing to check
        return
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise ConfigError(unknown[0], f"not a parameter of {notebook.name} (its parameters cell declares "
                                      f"{', '.join(sorted(declared))}); pass strict_params=False / "
                                      "--allow-unknown-params to inject it anyway")


def _outcome_from_disk(run: dict, status: str, wall_s: float | None, returned: dict | None) -> RunOutcome:
    summary = None
    with contextlib.suppress(IncompleteSummaryError):
        summary = read_summary(run["run_dir"], params_hash=run["params_hash"], require_ok=False)
    if summary is None and returned:
        summary = returned.get("summary")
    err = None
    if summary and summary.get("status") == "failed":
        e = summary.get("error") or {}
        err = f"{e.get('ename', 'Error')}: {e.get('evalue', '')}"
    return RunOutcome(run_id=run["run_id"], params=run["params"], params_hash=run["params_hash"], status=status,
                      run_dir=Path(run["run_dir"]), wall_s=wall_s, error=err,
                      metrics=dict((summary or {}).get("metrics") or {}))


def plan_sweep(notebook, grid, *, sweep_name: str | None = None, out_root="reports", workers: int = 1,
               strict_params: bool = True) -> tuple[Path, Path, list[dict], dict]:
    """Every check a sweep makes before it runs anything → (notebook, sweep_dir, runs, grid record).

    ``rookworld-debug report --dry-run`` calls this too, so a dry run rejects exactly what a real run
    rejects (an unknown parameter name, a missing notebook, colliding run ids, workers < 1)."""
    notebook = Path(notebook).expanduser().resolve()
    if not notebook.is_file():
        raise SweepError(f"notebook not found: {notebook}")
    param_sets, swept, grid_record = _resolve_grid(grid)
    if sweep_name is None:
        sweep_name = (grid.name if isinstance(grid, Grid) and grid.name else
                      notebook.stem + ("__" + "-".join(swept) if swept else ""))
    sweep_dir = Path(out_root).expanduser().resolve() / _sweep_dir_name(sweep_name)
    if strict_params:
        _check_notebook_params(notebook, {k for p in param_sets for k in p})
    if workers < 1:
        raise ConfigError("workers", "must be >= 1")

    runs: list[dict] = []
    seen: dict[str, dict] = {}
    for params in param_sets:
        rid = run_id(params, swept)
        h = params_hash(params)
        if rid in seen:
            raise SweepError(f"two parameter sets map to run id {rid!r}: {seen[rid]} and {params}")
        seen[rid] = params
        runs.append({"run_id": rid, "params": to_jsonable(params), "params_hash": h,
                     "run_dir": str(sweep_dir / rid)})
    return notebook, sweep_dir, runs, grid_record


def run_sweep(notebook, grid, *, sweep_name: str | None = None, out_root="reports", workers: int = 1,
              cluster=None, resume: bool = True, timeout_per_cell: float | None = 1800,
              kernel_name: str = "python3", progress: bool = True, start_timeout: float = 120,
              strict_params: bool = True, require_summary: bool = True, title=None) -> SweepResult:
    """Execute ``notebook`` once per parameter set of ``grid`` (a :class:`Grid`, a mapping name → list
    of values, or a list of parameter dicts) into ``out_root/<sweep_name>/<run-id>/`` and write the
    sweep's ``index.html``/``index.json``. See the module docstring for the layout and guarantees.

    ``workers`` bounds concurrent local runs (each is a process with its own kernel); ``cluster`` (a
    Dask scheduler address like ``"tcp://host:8786"``, a ``distributed.Client`` or a cluster object)
    sends each run to Dask instead. ``resume`` skips complete runs. ``timeout_per_cell`` (seconds, None
    = no limit) is papermill's per-cell execution timeout. ``strict_params`` refuses grid names the
    notebook's parameters cell does not declare. A KeyboardInterrupt stops the sweep cleanly (finished
    runs are kept, running ones are stopped) and returns ``interrupted=True``. ``title`` (a string, or a function
    of a run's parameters) heads each report instead of the sweep, run id and parameters: for pages a reader opens
    without knowing they were made by a sweep (the triage page, its step reports)."""
    t_start = time.perf_counter()
    notebook, sweep_dir, runs, grid_record = plan_sweep(notebook, grid, sweep_name=sweep_name, out_root=out_root,
                                                        workers=workers, strict_params=strict_params)
    sweep_dir.mkdir(parents=True, exist_ok=True)

    threads = max(1, (os.cpu_count() or 1) // workers) if cluster is None else None
    thread_env = {} if threads is None else {v: threads for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                                   "OPENBLAS_NUM_THREADS")}
    tasks = {r["run_id"]: {**r, "notebook": str(notebook), "sweep": sweep_dir.name, "kernel_name": kernel_name,
                           "timeout_per_cell": timeout_per_cell, "start_timeout": start_timeout,
                           "resume": resume, "require_summary": require_summary, "env": thread_env,
                           "title": title(r["params"]) if callable(title) else title}
             for r in runs}

    outcomes: dict[str, RunOutcome] = {}
    todo = []
    for r in runs:
        if resume and is_complete(r["run_dir"], r["params_hash"]):
            outcomes[r["run_id"]] = _outcome_from_disk(r, "skipped", None, None)
        else:
            todo.append(r)

    def _index():
        write_index(sweep_dir, current=runs, grid=grid_record, notebook=notebook)

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(runs), initial=len(outcomes), desc=sweep_dir.name, unit="run", file=sys.stderr,
                   dynamic_ncols=True)
        bar.set_postfix(ok=0, failed=0, skipped=len(outcomes))

    def _done(run: dict, returned: dict):
        status = returned.get("status", "failed")
        if status == "skipped":
            outcome = _outcome_from_disk(run, "skipped", returned.get("wall_s"), returned)
        else:
            outcome = _outcome_from_disk(run, status, returned.get("wall_s"), returned)
        outcomes[run["run_id"]] = outcome
        if status in ("ok", "failed", "skipped"):
            _index()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(ok=sum(o.status == "ok" for o in outcomes.values()),
                            failed=sum(o.status == "failed" for o in outcomes.values()),
                            skipped=sum(o.status == "skipped" for o in outcomes.values()))
            if status == "failed":
                bar.write(f"FAILED {run['run_id']}: {outcome.error}  -> {Path(run['run_dir']) / 'error.html'}",
                          file=sys.stderr)

    interrupted = False
    _index()
    try:
        if todo:
            if cluster is None:
                interrupted = _run_local(todo, tasks, workers, _done)
            else:
                interrupted = _run_dask(todo, tasks, cluster, _done)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    for r in runs:
        if r["run_id"] not in outcomes:
            outcomes[r["run_id"]] = _outcome_from_disk(r, "not_run", None, None)
    _index()
    return SweepResult(sweep_name=sweep_dir.name, sweep_dir=sweep_dir, index_html=sweep_dir / "index.html",
                       index_json=sweep_dir / "index.json", runs=tuple(outcomes[r["run_id"]] for r in runs),
                       interrupted=interrupted, wall_s=round(time.perf_counter() - t_start, 3))


def _run_local(todo: list[dict], tasks: dict, workers: int, done) -> bool:
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    _CANCEL.clear()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rookworld-report")
    futures = {pool.submit(run_task_subprocess, tasks[r["run_id"]]): r for r in todo}
    pending = set(futures)
    try:
        while pending:
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in finished:
                run = futures[fut]
                try:
                    returned = fut.result()
                except Exception as exc:  # noqa: BLE001 - a driver bug must not sink the other runs
                    returned = {"status": "failed", "error": repr(exc)}
                done(run, returned)
        return False
    except KeyboardInterrupt:
        _CANCEL.set()
        for fut in pending:
            fut.cancel()
        _terminate_all()
        return True
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _CANCEL.clear()


def _run_dask(todo: list[dict], tasks: dict, cluster, done) -> bool:
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover
        raise SweepError("cluster= needs dask[distributed] (pip install 'rookworld-debug[cluster]')") from exc
    own_client = False
    if isinstance(cluster, distributed.Client):
        client = cluster
    else:
        try:
            client = distributed.Client(cluster if isinstance(cluster, str) else cluster, timeout="30s")
        except Exception as exc:  # noqa: BLE001
            raise SweepError(f"cannot reach the Dask scheduler at {cluster!r}: {exc}") from exc
        own_client = True
    import uuid
    token = uuid.uuid4().hex[:8]
    futures = {}
    try:
        for r in todo:
            fut = client.submit(run_task_subprocess, tasks[r["run_id"]], pure=False,
                                key=f"rookworld-report-{r['run_id']}-{token}")
            futures[fut] = r
        try:
            for fut in distributed.as_completed(list(futures)):
                run = futures[fut]
                try:
                    returned = fut.result()
                except Exception as exc:  # noqa: BLE001 - task errored on the worker
                    returned = {"status": "failed", "error": repr(exc)}
                done(run, returned)
        except KeyboardInterrupt:
            client.cancel(list(futures))
            return True
        return False
    finally:
        if own_client:
            client.close()
