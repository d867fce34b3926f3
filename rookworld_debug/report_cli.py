"""`rookworld-debug report`: run a notebook over a parameter grid with papermill; one self-contained
HTML report per run plus a comparing index under ``reports/<sweep-name>/``.

Examples::

    rookworld-debug report -p beta=0,0.005,0.05 -p temperature=0.7,1.0 --sweep-name beta-temp --workers 2
    rookworld-debug report notebooks/01_grpo_step.ipynb -f sweeps/beta.yaml --cluster tcp://sched:8786

Exit status: 0 every run ok (or skipped as already complete), 1 some run failed, 2 bad arguments,
130 interrupted (finished runs are kept; run the same command again to resume).
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rookworld_debug.report import DEFAULT_NOTEBOOK


def _default_notebook(path: str) -> Path:
    """Relative paths resolve against the current directory, then the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    repo_root = Path(__file__).resolve().parent.parent
    if (repo_root / p).exists():
        return repo_root / p
    from rookworld_debug.notebook import notebook_path
    shipped = notebook_path(p.name)              # a wheel install: the package's own copy
    return shipped if shipped.is_file() else p


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the `report` arguments to ``parser`` (a sub-command parser or a fresh one)."""
    parser.add_argument("notebook", nargs="?", default=DEFAULT_NOTEBOOK,
                        help=f"parameterised notebook to execute (default: {DEFAULT_NOTEBOOK})")
    parser.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME=V1,V2,...",
                        help="a swept parameter and its comma-separated values (int/float/true/false/none/str; "
                             "quote a value to keep it a string); repeat for a cartesian grid")
    parser.add_argument("-f", "--grid-file", metavar="YAML",
                        help="YAML grid: name: [values] axes, optional fixed: {name: value} and name: SWEEP; "
                             "-p axes are added to / override it")
    parser.add_argument("--sweep-name", metavar="NAME",
                        help="folder under --out (default: the YAML name:, else NOTEBOOK-STEM__AXIS-NAMES)")
    parser.add_argument("--out", dest="out_root", default="reports", metavar="DIR",
                        help="root folder of sweeps (default: reports)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="concurrent local runs, each a process with its own kernel (default: 1)")
    parser.add_argument("--cluster", metavar="ADDRESS",
                        help="Dask scheduler address (tcp://host:8786): send each run to it as a task; workers "
                             "must see --out and the notebook at the same paths")
    parser.add_argument("--no-resume", dest="resume", action="store_false",
                        help="re-run every run, also those already complete")
    parser.add_argument("--timeout-per-cell", type=float, default=1800, metavar="SECONDS",
                        help="papermill per-cell execution timeout; 0 = none (default: 1800)")
    parser.add_argument("--kernel", dest="kernel_name", default="python3", help="Jupyter kernel name (python3)")
    parser.add_argument("--allow-unknown-params", action="store_true",
                        help="inject parameters the notebook's parameters cell does not declare")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.add_argument("--dry-run", action="store_true", help="print the run ids and parameters, run nothing")
    parser.add_argument("--trace", dest="traces", action="append", default=[], metavar="DIR",
                        help="render a saved step or a TRL capture folder (step-NNNNNN/) instead of running a step "
                             "(the notebook's trace_path parameter); repeat for one report per step plus an index")
    return parser


def _trace_grid(grid, traces, sweep_name):
    """Add trace_path (absolute) to the grid: fixed for one folder, an axis for several. Each folder is
    opened first, so a folder that is not a trace (TraceError) or a capture from an unsupported TRL
    version (IncompatibleTraceError) fails here with its named error, before any kernel starts."""
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.report.grid import Grid
    if "trace_path" in grid.axes or "trace_path" in grid.fixed:
        raise ConfigError("trace_path", "give trace folders with --trace only")
    paths = [str(Path(t).expanduser().resolve()) for t in traces]
    for p in paths:
        StepTrace.load(p)
    if len(paths) == 1:
        grid = Grid(axes=dict(grid.axes), fixed={**grid.fixed, "trace_path": paths[0]}, name=grid.name)
        default = f"trace-{Path(paths[0]).parent.name}-{Path(paths[0]).name}"
    else:
        grid = Grid(axes={**grid.axes, "trace_path": paths}, fixed=dict(grid.fixed), name=grid.name)
        default = f"trace-{Path(paths[0]).parent.name}"
    return grid, sweep_name or grid.name or default


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def report_main(args: argparse.Namespace) -> int:
    """Run the sweep described by parsed ``args``; print where the index is; return the exit status."""
    missing = [t for t in getattr(args, "traces", None) or () if not Path(t).expanduser().exists()]
    if missing:                         # named before the sweep's imports (torch and the notebook tools: seconds)
        from rookworld_debug.grpo.trace.folder import not_a_trace
        said = not_a_trace(Path(missing[0]).expanduser().resolve(), "no such folder")
        print(f"rookworld-debug report: error: {said}", file=sys.stderr)
        return 2
    from rookworld_debug.errors import RookWorldError
    from rookworld_debug.report import make_grid, run_sweep

    try:
        grid = make_grid(args.params, args.grid_file)
        if getattr(args, "traces", None):
            grid, args.sweep_name = _trace_grid(grid, args.traces, args.sweep_name)
    except RookWorldError as exc:
        print(f"rookworld-debug report: error: {exc}", file=sys.stderr)
        return 2
    notebook = _default_notebook(args.notebook)
    if args.dry_run:                  # the same checks as a real run, then the plan; nothing executes
        from rookworld_debug.report.runner import plan_sweep
        try:
            _, sweep_dir, runs, _ = plan_sweep(notebook, grid, sweep_name=args.sweep_name, out_root=args.out_root,
                                               workers=args.workers, strict_params=not args.allow_unknown_params)
        except RookWorldError as exc:
            print(f"rookworld-debug report: error: {exc}", file=sys.stderr)
            return 2
        for run in runs:
            print(run["run_id"], run["params"])
        print(f"(dry run: {len(runs)} runs into {sweep_dir}; nothing executed)")
        return 0
    old = None
    try:
        old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    except ValueError:  # not the main thread
        pass
    try:
        result = run_sweep(notebook, grid, sweep_name=args.sweep_name, out_root=args.out_root,
                           workers=args.workers, cluster=args.cluster, resume=args.resume,
                           timeout_per_cell=args.timeout_per_cell or None, kernel_name=args.kernel_name,
                           progress=args.progress, strict_params=not args.allow_unknown_params)
    except RookWorldError as exc:
        print(f"rookworld-debug report: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    print(f"sweep {result.sweep_name}: {result.n_ok} ok, {result.n_skipped} skipped (already complete), "
          f"{result.n_failed} failed, {len(result.runs)} runs in {result.wall_s:.1f} s")
    for r in result.failed:
        print(f"  FAILED {r.run_id}: {r.error}\n         {r.error_html or r.run_dir}")
    if result.interrupted:
        print("  interrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
    print(f"index: {result.index_html}")
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rookworld-debug report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_report_arguments(parser)
    return report_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
