"""`rookworld-debug main`: the README's main job. Executes ``notebooks/01_grpo_step.ipynb`` ONCE with
papermill (through the sweep runner, `rookworld_debug.report.run_sweep`) on the embedded default (tiny
model, bundled data) and writes a self-contained report of one GRPO step::

    reports/main/index.html            # the (one-run) index
    reports/main/run/report.html       # the step, phase by phase (code hidden, plotly inline, offline)
    reports/main/run/summary.json      # config, provenance, per-phase timings, headline metrics
    reports/main/run/trace/            # the StepTrace (StepTrace.load)

Exit status: 0 ok, 1 the run failed (its error page is printed), 2 bad arguments / no notebook,
130 interrupted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

NOTEBOOK = "01_grpo_step.ipynb"


def find_notebook(explicit: str | None = None) -> Path:
    """The step notebook: ``explicit`` if given, else ``notebooks/01_grpo_step.ipynb`` next to the
    package (a source checkout / editable install), else under the current directory."""
    from rookworld_debug.notebook import notebook_path
    if explicit:
        return Path(explicit).expanduser().resolve()
    for cand in (notebook_path(NOTEBOOK), Path.cwd() / "notebooks" / NOTEBOOK):
        if cand.is_file():
            return cand.resolve()
    return notebook_path(NOTEBOOK)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rookworld-debug main", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME=VALUE",
                   help="override one notebook parameter (e.g. -p beta=0.05 -p max_new_tokens=64); repeatable")
    p.add_argument("--out", dest="out_root", default="reports", metavar="DIR", help="reports root (default: reports)")
    p.add_argument("--name", default="main", help="sweep folder under --out (default: main)")
    p.add_argument("--notebook", default=None, help=f"notebook to execute (default: notebooks/{NOTEBOOK})")
    p.add_argument("--resume", action="store_true", help="keep an existing complete report instead of re-running")
    p.add_argument("--timeout-per-cell", type=float, default=1800, metavar="SECONDS",
                   help="papermill per-cell timeout; 0 = none (default: 1800)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rookworld_debug.errors import ConfigError, RookWorldError
    from rookworld_debug.report import parse_param_spec, run_sweep

    notebook = find_notebook(args.notebook)
    if not notebook.is_file():
        print(f"rookworld-debug main: notebook not found: {notebook} (run from a checkout of the repository, "
              "or pass --notebook PATH)", file=sys.stderr)
        return 2
    params: dict = {}
    try:
        for spec in args.params:
            name, values = parse_param_spec(spec)
            if len(values) != 1:
                raise ConfigError(name, "the main job runs once: give one value (use `rookworld-debug report` to sweep)")
            params[name] = values[0]
        result = run_sweep(notebook, [params], sweep_name=args.name, out_root=args.out_root, workers=1,
                           resume=args.resume, timeout_per_cell=args.timeout_per_cell or None,
                           progress=args.progress)
    except RookWorldError as exc:
        print(f"rookworld-debug main: error: {exc}", file=sys.stderr)
        return 2
    for run in result.runs:
        if run.status in ("ok", "skipped") and run.report_html is not None:
            m = run.metrics
            keys = ("reward_before", "reward_after", "loss", "kl_share", "grad_norm_pre_clip", "frac_reward_zero_std")
            print("one GRPO step on the embedded default: " + ", ".join(
                f"{k}={m[k]:.4g}" if isinstance(m.get(k), (int, float)) else f"{k}={m.get(k)}" for k in keys))
            print(f"report: {run.report_html}")
            print(f"summary: {run.run_dir / 'summary.json'}")
        else:
            print(f"FAILED {run.run_id}: {run.error}", file=sys.stderr)
            if run.error_html is not None:
                print(f"error page: {run.error_html}", file=sys.stderr)
    print(f"index: {result.index_html}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
