"""`rookworld-debug diagnose PATH`: what is likely wrong, with evidence and fix, for a step trace, a TRL capture, a
captures folder, a folder of recorded steps (each step, and what must carry over between consecutive ones) or a run
folder. Exit codes (a gate for scripts and CI):
0 = no error-level finding, 1 = an error-level finding, 2 = the diagnosis did not complete: bad input (a named
error), a check that could not run (named), or a failure of the tool itself (the message says which).

    rookworld-debug diagnose runs/demo                 # ranked findings, text
    rookworld-debug diagnose runs/demo --json          # {"findings": [...]}, most likely first
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug diagnose", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a step trace folder (trace.json), a capture, a captures folder, a folder of recorded "
                                 "steps (*/trace.json: each step and each pair of consecutive steps) or a run folder")
    ap.add_argument("--json", action="store_true", help='print {"findings": [...]} (ranked, most likely first)')
    ap.add_argument("--all", action="store_true", help="also list the phases' informational notes")
    ap.add_argument("--no-replay", action="store_true",
                    help="skip the replay (recomputing each phase from the previous phase's recorded output with "
                         "the trusted implementation, weights included when the step kept them)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.exists(a.path):           # named before torch and transformers load (several seconds)
        from rookworld_debug.grpo.trace.folder import leftover_hint
        return _fail(f"bad input: DataError: {Path(a.path)} does not exist{leftover_hint(Path(a.path))}")
    from rookworld_debug.diagnosis.text import format_findings
    from rookworld_debug.errors import RookWorldError
    try:
        findings, replays, pairs = _diagnose(a.path, replay=not a.no_replay)
    except RookWorldError as err:
        return _fail(f"bad input: {type(err).__name__}: {err}")
    except KeyboardInterrupt:
        return _fail("interrupted") + 128
    except Exception as err:  # noqa: BLE001 - exit 1 means "an error finding": never for a crash
        return _fail(f"failure of the tool (please report it): {type(err).__name__}: {str(err)[:300]}")
    if a.json:   # ASCII-escaped: valid JSON under any locale; the path's undecodable bytes as \xNN text
        print(json.dumps(as_json(a.path, findings, replays, pairs), indent=1, ensure_ascii=True))
    else:
        if hasattr(sys.stdout, "reconfigure"):           # a strict locale never fails on a path's bytes
            sys.stdout.reconfigure(errors="backslashreplace")
        print(format_findings(findings, notes=a.all))
    crashed = [f.cause for f in findings if f.code == "check_failed"]
    if crashed:      # a gate must not read a check that could not run as a healthy step
        return _fail(f"{len(crashed)} check(s) could not run, so the diagnosis is incomplete: " + "; ".join(crashed))
    return 1 if any(f.severity == "error" for f in findings) else 0


def _diagnose(path, replay: bool = True):
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    return folder_diagnosis(path, replay=replay)


def as_json(path: str, findings, replays: dict, pairs=()) -> dict:
    """{"path", "findings" (ranked), "first_disagreement" (the first replayed step's, or null), "phases", "replays"
    (per step: {"step", "first_disagreement", "phases", "declaration", "checks", "weights", "seconds"}),
    "consecutive" (per pair of consecutive recorded steps: {"steps", "folders", "note", "checks", "seconds"})}."""
    reps = [{"step": step, **rep.to_dict()} for step, rep in replays.items()]
    first = next((r for r in reps if r["first_disagreement"] is not None), reps[0] if reps else None)
    return {"path": printable(path), "findings": [f.to_dict() for f in findings],
            "first_disagreement": first["first_disagreement"] if first else None,
            "phases": first["phases"] if first else [], "replays": reps,
            "consecutive": [{**p.to_dict(), "folders": [printable(f) for f in p.folders]} for p in pairs]}


def printable(path: str) -> str:
    """A path as text: bytes that are not UTF-8 (a folder named on another system) shown as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _fail(message: str) -> int:
    print(f"rookworld-debug diagnose: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
