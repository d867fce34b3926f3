"""The hand-written-loop fault benchmark: every fault of `lab.handloop.FAULTS` recorded through `StepRecorder`,
diagnosed by `diagnose_path` (replay on), scored by top-1 / top-3 cause and the first disagreeing phase; healthy
steps of the same loop over varied settings must give no error-level finding.

    python -m rookworld_debug.lab.replay_bench --out reports/replay_bench      # results.jsonl + table.md
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from rookworld_debug.diagnosis.replay.records import PHASES

HEALTHY = tuple(
    dict(loss_type=lt, beta=beta, num_generations=g, task=task, lr=lr)
    for lt, beta, g, task, lr in (
        ("grpo", 0.04, 4, "P", 1e-4), ("dapo", 0.0, 4, "P", 1e-5), ("bnpo", 0.1, 3, "P", 3e-4),
        ("dr_grpo", 0.04, 4, "A", 1e-4), ("grpo", 0.0, 2, "A", 1e-6), ("dapo", 0.04, 3, "A", 1e-4),
        ("bnpo", 0.0, 4, "P", 1e-5), ("dr_grpo", 0.1, 2, "P", 1e-4)))


# settings a fault needs to change the step at all (a clip that never binds changes nothing)
FAULT_SETTINGS = {"no_clip": {"max_grad_norm": 1e-3}}


def diagnose_case(cfg, fault: str) -> dict:
    from rookworld_debug.diagnosis import diagnose_path
    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.lab.handloop import FAULTS, run
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run(cfg, out=tmp, fault=fault)
        t1 = time.perf_counter()
        findings = diagnose_path(tmp)
        t2 = time.perf_counter()
        first = replay_path(tmp).first_disagreement
    phase, cause = FAULTS.get(fault, ("", ""))
    codes = [f.code for f in findings if f.severity != "info"]
    return {"fault": fault, "config": dataclasses.asdict(cfg), "expected_phase": phase, "expected_cause": cause,
            "first_phase": first.phase if first else "", "codes": codes[:5],
            "errors": sum(f.severity == "error" for f in findings),
            "top1": bool(codes) and _names(codes[0], cause, phase), "top3": any(_names(c, cause, phase)
                                                                           for c in codes[:3]),
            "record_seconds": t1 - t0, "diagnose_seconds": t2 - t1}


def _names(code: str, cause: str, phase: str) -> bool:
    """A finding names the fault: its cause code, or — for a fault with no known mechanism — its phase."""
    return code == cause if cause else code == f"replay_{phase}"


def run_all(out: Path, faults=None, healthy=HEALTHY) -> list:
    from rookworld_debug.lab.handloop import FAULTS, LoopConfig
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "results.jsonl", "w") as fh:
        for fault in faults if faults is not None else FAULTS:
            rows.append(diagnose_case(LoopConfig(**FAULT_SETTINGS.get(fault, {})), fault))
            fh.write(json.dumps(rows[-1]) + "\n")
            fh.flush()
        for kw in healthy:
            rows.append(diagnose_case(LoopConfig(**kw), ""))
            fh.write(json.dumps(rows[-1]) + "\n")
            fh.flush()
    (out / "table.md").write_text(table(rows))
    return rows


def table(rows) -> str:
    faults = [r for r in rows if r["fault"]]
    healthy = [r for r in rows if not r["fault"]]
    lines = [f"Faults: {len(faults)}; top-1 {sum(r['top1'] for r in faults)}/{len(faults)}, top-3 "
             f"{sum(r['top3'] for r in faults)}/{len(faults)}, first disagreeing phase right "
             f"{sum(r['first_phase'] == r['expected_phase'] for r in faults)}/{len(faults)}; healthy steps "
             f"{len(healthy)}, with an error-level finding: {sum(r['errors'] > 0 for r in healthy)}", "",
             "| fault | phase broken | first disagreeing phase | top finding | top-1 | top-3 |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['fault']} | {r['expected_phase']} | {r['first_phase'] or '—'} | "
              f"{r['codes'][0] if r['codes'] else '—'} | {'✓' if r['top1'] else '✗'} | {'✓' if r['top3'] else '✗'} |"
              for r in faults]
    conf = Counter((r["expected_phase"], r["first_phase"] or "none") for r in faults)
    cols = [p for p in PHASES] + ["none"]
    lines += ["", "Confusion (rows: the phase the fault broke; columns: the first phase the replay found "
                  "disagreeing):", "", "| broken \\ found | " + " | ".join(cols) + " |",
              "|---|" + "---|" * len(cols)]
    lines += [f"| {p} | " + " | ".join(str(conf.get((p, q), 0) or "") for q in cols) + " |" for p in PHASES]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.lab.replay_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="reports/replay_bench", help="folder for results.jsonl and table.md")
    ap.add_argument("--fault", action="append", help="only these faults (repeatable); default: all")
    ap.add_argument("--no-healthy", action="store_true", help="skip the healthy steps")
    a = ap.parse_args(argv)
    rows = run_all(Path(a.out), a.fault, () if a.no_healthy else HEALTHY)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
