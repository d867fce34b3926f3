"""How long the diagnosis commands take as a user runs them: `rookworld-debug diagnose STEP --json` (with its replay,
and with --no-replay) on the recorded step of examples/manual_loop.py (the embedded model), each a fresh process with
stdin closed, start-up and imports included; beside them the floor every such process pays, importing torch, and
what importing transformers' GPT-2 as well costs (the replay does without it); with --fix, `rookworld-debug whatif
STEP --fix` on a recorded step of the hand-written loop with a known bug (the corrected one-step comparison). Writes
one JSON file (median and max of each, the machine, its load before and after).

    .venv/bin/python scripts/bench_commands.py --out docs/bench/commands-$(date +%Y%m%d).json
    .venv/bin/python scripts/bench_commands.py --runs 1 --out /tmp/commands.json     # a quick look

A benchmark, not a test: it measures and writes, whatever the numbers are.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv/bin/python")
CLI = str(ROOT / ".venv/bin/rookworld-debug")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}
IMPORTS = "import torch; from transformers import GPT2LMHeadModel"
FAULTY = ("from rookworld_debug.lab.handloop import LoopConfig, run; "
          "run(LoopConfig(), out={out!r}, fault='loss_adv_sign')")    # the hand-written loop, its step 2 recorded


def timed(argv: list[str], timeout: float) -> dict:
    """One run of `argv`: wall seconds and exit code (stdout discarded; stdin closed; TimeoutExpired past timeout)."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       env=ENV, cwd=ROOT, timeout=timeout)
    return {"seconds": round(time.perf_counter() - t0, 3), "rc": r.returncode,
            **({"stderr": r.stderr.decode(errors="replace")[-500:]} if r.returncode not in (0, 1) else {})}


def series(name: str, argv: list[str], runs: int, timeout: float) -> dict:
    """`runs` runs of one command after one unmeasured warm-up (the file cache), with their median and max."""
    timed(argv, timeout)
    each = [timed(argv, timeout) for _ in range(runs)]
    secs = [e["seconds"] for e in each]
    print(f"{name}: median {statistics.median(secs):.2f} s, max {max(secs):.2f} s over {runs}", file=sys.stderr)
    return {"name": name, "command": " ".join(Path(a).name if a in (PY, CLI) else a for a in argv),
            "runs": runs, "median_s": statistics.median(secs), "max_s": max(secs), "each": each}


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "load_1min": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--runs", type=int, default=5, help="measured runs per command (after one warm-up)")
    ap.add_argument("--step", help="a recorded step folder (default: record one with examples/manual_loop.py)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one command may take")
    ap.add_argument("--fix", action="store_true", help="also `whatif STEP --fix` on a step of the hand-written loop "
                    "with its advantages negated (the corrected one-step comparison)")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be ≥ 1")
    with tempfile.TemporaryDirectory() as tmp:
        step = a.step or str(Path(tmp) / "step-2")
        if not a.step:
            rec = timed([PY, "examples/manual_loop.py", "--out", step], a.timeout)
            if rec["rc"] != 0:
                raise SystemExit(f"examples/manual_loop.py failed: {rec.get('stderr', '')}")
        before = machine()
        results = [series("import torch (the floor of every command that computes)", [PY, "-c", "import torch"],
                          a.runs, a.timeout),
                   series("imports: torch + transformers' GPT2LMHeadModel (what the replay paid before it "
                          "stopped importing transformers)", [PY, "-c", IMPORTS], a.runs, a.timeout),
                   series("diagnose STEP --json", [CLI, "diagnose", step, "--json"], a.runs, a.timeout),
                   series("diagnose STEP --json --no-replay", [CLI, "diagnose", step, "--json", "--no-replay"],
                          a.runs, a.timeout),
                   series("diagnose MISSING (bad input)", [CLI, "diagnose", str(Path(tmp) / "missing")], a.runs,
                          a.timeout)]
        if a.fix:               # the corrected one-step comparison on a step with a known bug (its advantages × −1)
            faulty = str(Path(tmp) / "faulty" / "step-2")
            rec = timed([PY, "-c", FAULTY.format(out=faulty)], a.timeout)
            if rec["rc"] != 0:
                raise SystemExit(f"the faulty loop failed: {rec.get('stderr', '')}")
            results.append(series("whatif FAULTY --fix --json (the corrected step, one step)",
                                  [CLI, "whatif", faulty, "--fix", "--json", "--out", str(Path(tmp) / "whatif")],
                                  a.runs, a.timeout))
    out = {"date": time.strftime("%Y-%m-%d"), "step": a.step or "examples/manual_loop.py --out STEP (its step 2)",
           "machine": before, "load_1min_after": os.getloadavg()[0], "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"written {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
