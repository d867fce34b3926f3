"""Where the test suite's time goes: reads the log of `bash scripts/test.sh [--all] --durations=0` and writes one
JSON (each run's wall seconds, pytest's counts and seconds, worker-seconds by file, the slowest entries, the machine)
and, with --md, the table of the 50 slowest entries and the files by worker-seconds.

    bash scripts/test.sh --durations=0 2>&1 | tee /tmp/test.log
    .venv/bin/python scripts/test_timing.py /tmp/test.log --out docs/bench/test-timing-$(date +%Y%m%d).json \\
        --md docs/bench/test-durations-$(date +%Y%m%d).md

A benchmark, not a test: it reads what a run measured and writes it down, whatever the numbers are.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_LINE = re.compile(r"^scripts/test\.sh: the (.+) took (\d+) s \(exit (\d+)\)$")
SUMMARY = re.compile(r"^=+ (.*) in ([\d.]+)s(?: \([\d:]+\))? =+$")
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$")


def parse(log: str) -> list[dict]:
    """One dict per pytest run in the log, in order: name, wall seconds, exit, counts, pytest seconds, entries."""
    runs, entries, summary = [], [], None
    for line in log.splitlines():
        if m := DURATION.match(line):
            entries.append({"seconds": float(m[1]), "when": m[2], "test": m[3]})
        elif m := SUMMARY.match(line):
            counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed)",
                                                       m[1])}
            summary = {"counts": counts, "pytest_seconds": float(m[2])}
        elif m := RUN_LINE.match(line):
            runs.append({"name": m[1], "wall_seconds": int(m[2]), "exit": int(m[3]), **(summary or {}),
                         "entries": entries})
            entries, summary = [], None
    return runs


def by_file(entries: list[dict]) -> dict[str, float]:
    files: dict = collections.Counter()
    for e in entries:
        files[e["test"].split("::")[0]] += e["seconds"]
    return {k: round(v, 1) for k, v in files.most_common()}


def machine(commit: str | None = None) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    mem = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0) if Path("/proc/meminfo").exists() else 0
    commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                      text=True, timeout=30).stdout.strip()
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem / 2 ** 20, 1), "python": sys.version.split()[0],
            "commit": commit}


def markdown(runs: list[dict], title: str) -> str:
    out = [f"# {title}", ""]
    for run in runs:
        busy = sum(e["seconds"] for e in run["entries"])
        counts = ", ".join(f"{n} {k}" for k, n in run.get("counts", {}).items())
        out += [f"## The {run['name']}: {run.get('pytest_seconds', 0):.0f} s by pytest's count, "
                f"{run['wall_seconds']} s by the clock (set-up excluded); {counts}; "
                f"the entries the log lists (every one of 5 ms or more with --durations=0): {busy:.0f} "
                "worker-seconds", "", "By file (worker-seconds):", "", "```"]
        out += [f"{s:8.1f}  {f}" for f, s in list(by_file(run["entries"]).items())[:40]]
        out += ["```", "", "The 50 slowest entries:", "", "```"]
        out += [f"{e['seconds']:7.2f}s {e['when']:<8} {e['test']}" for e in run["entries"][:50]]
        out += ["```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="the output of `bash scripts/test.sh [--all] --durations=0`")
    ap.add_argument("--out", required=True, help="the JSON to write")
    ap.add_argument("--md", default=None, help="also write the tables as Markdown here")
    ap.add_argument("--commit", default=None, help="the commit the run tested (default: this checkout's HEAD)")
    ap.add_argument("--note", default="", help="what else ran on the machine, or anything a reader should know")
    a = ap.parse_args(argv)
    runs = parse(Path(a.log).read_text(errors="replace"))
    if not runs:
        ap.error(f"{a.log}: no `scripts/test.sh: the … took N s` line: not the log of scripts/test.sh")
    doc = {"machine": machine(a.commit), "note": a.note,
           "runs": [{**{k: v for k, v in r.items() if k != "entries"}, "by_file": by_file(r["entries"]),
                     "slowest": r["entries"][:50]} for r in runs]}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    if a.md:
        Path(a.md).write_text(markdown(runs, "Where the test suite's time goes") + "\n")
    for r in runs:
        print(f"{r['name']}: {r['wall_seconds']} s wall, pytest {r.get('pytest_seconds')} s, {r.get('counts')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
