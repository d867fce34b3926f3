"""Run triage at scale: `rookworld-debug triage` on a run folder with a 10,000-step log history and 50 captured steps.

    .venv/bin/python benchmarks/triage_scale.py --out /tmp/triage-scale [--json docs/bench/triage-scale.json]

The folder: a TRL `output_dir` layout — `trainer_state.json` whose `log_history` has one entry per optimizer step
(every metric the triage page draws, as TRL names them: a slow drift plus noise, with KL and grad-norm jumps at
known steps so the triggers fire), and `captures/` with `captures.json` and 50 `step-NNNNNN/` folders. Each capture
folder is a copy of ONE real capture of a tiny-model TRL step (taken first, ~20 s): triage reads the index and links
the folders; the page never opens them. Timed, each as a user runs it (subprocess, stdin closed): the page with
every step report on demand (`--max-step-reports 0`: the links and the commands), then the default (the first 8
flagged captured steps' reports rendered now, by papermill, `--workers 2`). Reported: seconds, the page's bytes, the
copies of plotly.js in it, the flagged steps, and the reports rendered.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rookworld_debug.lab.synthetic_log import JUMPS, log_history   # the log, built from a seed

N_STEPS, N_CAPTURES = 10_000, 50


def build_run(root: Path, capture_src: Path) -> Path:
    run = root / "run"
    if run.exists():
        shutil.rmtree(run)
    (run / "captures").mkdir(parents=True)
    hist = log_history()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": N_STEPS, "max_steps": N_STEPS,
                                                        "log_history": hist}))
    # the captured steps: each jump and its lead-up, then evenly spread named steps up to 50
    steps = sorted({s - k for s in JUMPS for k in range(4)})
    steps += [s for s in range(100, N_STEPS, 250) if s not in steps][:N_CAPTURES - len(steps)]
    entries = []
    for s in sorted(steps):
        name = f"step-{s:06d}"
        shutil.copytree(capture_src, run / "captures" / name)
        entries.append({"step": s, "path": name, "reasons": [], "error": None, "written_at": "2026-11-25T00:00:00"})
    (run / "captures" / "captures.json").write_text(json.dumps({"format": 1, "keep_last": 3, "every": 250,
                                                                "steps": [], "triggers": [], "captures": entries}))
    return run


def real_capture(root: Path) -> Path:
    from rookworld_debug.trl.example import run
    _, cap = run(root / "src", steps=1, capture=(1,))
    return Path(cap.paths[1])


def timed_triage(run: Path, out: Path, *extra: str) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rookworld_debug.cli", "triage", str(run), "--out", str(out),
                        "--no-progress", *extra], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=3600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"triage failed ({r.returncode}): {r.stderr[-2000:]}")
    page = (out / "triage.html").read_bytes()
    t = json.loads((out / "triage.json").read_text())
    return {"args": list(extra), "seconds": seconds, "page_bytes": len(page),
            "plotly_js_copies": len(re.findall(rb"plotly\.js v\d", page)),
            "flagged": len(t["flagged"]), "flagged_captured": sum(f["captured"] for f in t["flagged"]),
            "reports_rendered": sum(bool(f.get("report_rendered")) for f in t["flagged"]),
            "reports_on_demand": sum(bool(f.get("report_command")) for f in t["flagged"]), "rows": len(t["rows"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/triage-scale")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-default", action="store_true", help="time only the on-demand page")
    a = ap.parse_args(argv)
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    for old in ("triage-on-demand", "triage-default", "src"):
        shutil.rmtree(root / old, ignore_errors=True)       # a fresh page each time (triage skips what exists)
    t0 = time.perf_counter()
    run = build_run(root, real_capture(root))
    res = {"n_steps": N_STEPS, "n_captures": N_CAPTURES, "build_seconds": time.perf_counter() - t0,
           "cpu_count": os.cpu_count(), "loadavg_1m_before": os.getloadavg()[0],
           "on_demand": timed_triage(run, root / "triage-on-demand", "--max-step-reports", "0")}
    res["on_demand_again"] = timed_triage(run, root / "triage-on-demand", "--max-step-reports", "0")   # idempotent
    if not a.skip_default:
        res["default"] = timed_triage(run, root / "triage-default", "--workers", "2")
    res["loadavg_1m_after"] = os.getloadavg()[0]
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
