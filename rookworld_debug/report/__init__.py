"""Papermill sweeps: notebook × parameter grid → one HTML report per run + a comparing index.

Layout of a sweep (everything a run produces is finalized atomically; ``summary.json`` last)::

    reports/<sweep-name>/
        index.html  index.json            # table of runs + metric-vs-parameter plots (plotly.js inline)
        <run-id>/
            params.json                   # written when the run starts
            report.ipynb                  # the executed notebook (also on failure: up to the failing cell)
            report.html                   # code hidden, plotly.js inline, no network needed (ok runs)
            error.html                    # the failing cell, its source and traceback (failed runs)
            summary.json                  # the notebook's own summary + the runner's record; see below
            runner.log                    # the run's worker process stdout/stderr

Contract with the notebook
    The notebook has a cell tagged ``parameters``; the runner injects the grid's values plus ``run_dir``
    (absolute path of the run folder). The notebook writes ``run_dir/summary.json`` with
    :func:`atomic_write_json`, headline numbers under ``"metrics"`` (a flat mapping name → number;
    nested mappings are flattened with ``/``). Anything else it writes (config, provenance, timings,
    trace path) is kept. For plots to survive the HTML export the notebook sets
    ``plotly.io.renderers.default = "plotly_mimetype+notebook"``; figures that only carry the plotly
    JSON mimetype are converted at export time anyway (and the summary notes it).

summary.json (finalized by the runner)
    The notebook's own keys, plus: ``schema``, ``status`` ("ok" | "failed"), ``run_id``, ``sweep``,
    ``params``, ``params_hash``, ``notebook``, ``notebook_sha256``, ``files`` (names of the run's
    files), ``runner`` (started_at, finished_at, papermill_s, nbconvert_s, total_s, html_bytes,
    html_check, host, pid, warnings...) and, for failed runs, ``error`` (ename, evalue, traceback,
    traceback_text, cell_index, exec_count, cell_source). A notebook value under one of these names is
    moved to ``notebook_fields``. ``metrics`` is always present (``{}`` if the notebook gave none).

Completeness (what "resume" trusts)
    A run is complete only when ``summary.json`` parses, carries ``"schema": SUMMARY_SCHEMA``,
    ``"status": "ok"`` and the ``params_hash`` of the requested parameters, and its ``report.html``
    exists. The runner writes that summary after everything else, with write-to-temp + fsync +
    ``os.replace``, so an interrupted run (SIGINT, SIGKILL, power loss) leaves either no summary or the
    notebook's raw one (no schema) — both read as incomplete and the run is redone on resume.
    :func:`read_summary` refuses anything else with :class:`IncompleteSummaryError`.

Execution
    Every run executes in its own worker process (``python -m rookworld_debug.report --worker
    TASK``; papermill then starts the run's own kernel). Locally, ``workers`` threads each drive one
    such process. The worker holds an ``flock`` on ``<run-id>/.lock`` while it runs, so a resumed sweep
    never races a run that is still finishing; it asks the kernel to die with it (``PR_SET_PDEATHSIG``
    on Linux), so killing the sweep does not leave orphans that keep writing.

Why Dask (``distributed``) rather than Ray for ``cluster=``
    A run is "execute a notebook, write files": a plain function with no large objects to move. Dask's
    ``distributed`` is pure Python and pip-light (no compiled core, no object store, no daemon to set up),
    ``LocalCluster`` starts in seconds inside a test, ``Client(address)`` attaches to an existing
    ``dask scheduler``/``dask worker`` deployment (also on SLURM/Kubernetes via dask-jobqueue /
    dask-kubernetes), and a task may itself start subprocesses. Ray would work too but is heavier to
    install (large wheels, a raylet/GCS daemon and plasma store) and slow to start on a 2-core box, and
    its object store buys nothing here. With ``cluster=`` each run is one Dask task; the task runs the
    same worker process as the local path and writes its files to the *shared* filesystem path of the
    sweep (workers must see ``out_root`` and the notebook at the same absolute paths, and have
    ``rookworld_debug`` installed). The cluster bounds concurrency; ``workers`` is then ignored.

Code layout (one module per seam; this package re-exports the public names)
    ``store``  atomic writes, summary.json read/complete, JSON coercion, params hash, schemas, errors
    ``grid``   ``name=v1,v2`` specs / YAML grid files → runs, run ids
    ``export`` executed notebook → offline report.html (math rendered to MathML); the error page
    ``runner`` one run in a worker process (papermill → HTML → summary), local threads or Dask, resume
    ``index``  index.json + index.html of a sweep
    ``__main__`` ``python -m rookworld_debug.report --worker TASK`` (the worker entry point)
"""
from __future__ import annotations

from rookworld_debug.report.export import HtmlCheck, error_page, export_html
from rookworld_debug.report.grid import (
    Grid, expand_grid, load_grid_file, make_grid, parse_param_spec, parse_param_specs, parse_value, run_id,
)
from rookworld_debug.report.index import build_index, write_index
from rookworld_debug.report.runner import RunOutcome, SweepResult, execute_run, run_sweep
from rookworld_debug.report.store import (
    DEFAULT_NOTEBOOK, INDEX_SCHEMA, RESERVED_PARAMS, SUMMARY_SCHEMA, IncompleteSummaryError, SweepError,
    atomic_write_bytes, atomic_write_json, atomic_write_text, is_complete, params_hash, read_summary,
    to_jsonable,
)

__all__ = [
    "SUMMARY_SCHEMA", "INDEX_SCHEMA", "DEFAULT_NOTEBOOK", "RESERVED_PARAMS",
    "IncompleteSummaryError", "SweepError",
    "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "read_summary", "is_complete",
    "to_jsonable", "params_hash",
    "parse_value", "parse_param_spec", "parse_param_specs", "load_grid_file", "Grid", "make_grid",
    "expand_grid", "run_id",
    "export_html", "HtmlCheck", "error_page",
    "execute_run", "RunOutcome", "SweepResult", "run_sweep", "build_index", "write_index",
]
