"""`rookworld-debug diagnose PATH`: what is likely wrong, with evidence and fix, for a step trace, a TRL capture, a
captures folder or a run folder. Exit 1 when an error-level finding exists (a gate for scripts and CI), 0 otherwise,
2 on bad input.

    rookworld-debug diagnose runs/demo                 # ranked findings, text
    rookworld-debug diagnose runs/demo --json          # {"findings": [...]}, most likely first
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug diagnose", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a step trace folder (trace.json), a capture, a captures folder or a run folder")
    ap.add_argument("--json", action="store_true", help='print {"findings": [...]} (ranked, most likely first)')
    ap.add_argument("--all", action="store_true", help="also list the phases' informational notes")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from rookworld_debug.diagnosis import diagnose_path
    from rookworld_debug.diagnosis.text import format_findings
    findings = diagnose_path(a.path)
    if a.json:
        print(json.dumps({"path": a.path, "findings": [f.to_dict() for f in findings]}, indent=1, ensure_ascii=False))
    else:
        print(format_findings(findings, notes=a.all))
    return 1 if any(f.severity == "error" for f in findings) else 0


if __name__ == "__main__":
    raise SystemExit(main())
