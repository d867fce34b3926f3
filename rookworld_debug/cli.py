"""`rookworld-debug` command line. Each sub-command is a thin wrapper over library functions;
imports are lazy so `--help` stays instant."""
from __future__ import annotations

import argparse
import json
import sys
import time


def _smoke(args) -> int:
    """Load data, engine and model; print what was loaded (the pre-GRPO-step main job)."""
    t0 = time.perf_counter()
    from rookworld_debug.chess.engine import Engine
    from rookworld_debug.data.loaders import load_bundled
    from rookworld_debug.models import load_policy_and_reference

    samples = load_bundled()
    loaded = load_policy_and_reference(args.model)
    with Engine(depth=args.depth) as engine:
        fen = samples[0].fen if hasattr(samples[0], "fen") else None
        analysis = engine.analyse(fen) if fen else None
    print(json.dumps({
        "samples": len(samples),
        "model": loaded.provenance.to_dict(),
        "engine": engine.version,
        "first_analysis": None if analysis is None else {"fen": analysis.fen, "moves": analysis.moves,
                                                           "scores": analysis.scores},
        "seconds": round(time.perf_counter() - t0, 2),
    }, indent=2, default=str))
    return 0


DELEGATED = {
    "main": ("rookworld_debug.mainjob", "the README's main job: one GRPO step report on the embedded default"),
    "step": ("rookworld_debug.cli_step", "run ONE GRPO step, print the phase-by-phase log, save the trace"),
    "run": ("rookworld_debug.cli_run", "run N GRPO steps with schedules, checkpoints and a per-step log"),
    "report": ("rookworld_debug.report_cli", "papermill sweep: notebook x parameter grid -> HTML reports + index"),
    "generate-data": ("rookworld_debug.lab.generate", "generate RookWorld-format P:/A: samples"),
    "train-tiny": ("rookworld_debug.lab.train_tiny", "train the embedded tiny RookWorld model"),
    "measure": ("rookworld_debug.lab.measure", "measure format/legality metrics of any model"),
    "bench": ("rookworld_debug.lab.bench", "benchmark our step vs TRL GRPOTrainer vs rookworld-trl's manual debug loop"),
    "triage": ("rookworld_debug.report.triage_build", "a run's curves, flagged steps and their reports: "
               "triage.html + triage.json"),
    "trl-demo": ("rookworld_debug.trl.demo", "a TRL GRPOTrainer run that goes wrong at a known step, recorded by "
                 "the flight recorder (then: rookworld-debug triage OUT)"),
    "diagnose": ("rookworld_debug.cli_diagnose", "what is likely wrong with a step or a run: cause, evidence, fix "
                 "(exit 1 on an error-level finding)"),
    "verify-capture": ("rookworld_debug.trl.verify_cli", "replay a captured TRL step from the checkpoint before it and "
                       "compare with the checkpoint after it"),
    "whatif": ("rookworld_debug.cli_whatif", "branch a saved step or run from its state with changed settings: "
               "self-check, one-step counterfactual, k-step arms with shared seeds, a verdict per symptom"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rookworld-debug", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("smoke", help="load bundled data, Stockfish and the model; print provenance")
    s.add_argument("--model", default="tiny")
    s.add_argument("--depth", type=int, default=10)
    s.set_defaults(func=_smoke)

    for name, (_, help_) in DELEGATED.items():     # parsed by the module itself (see main)
        sub.add_parser(name, help=help_, add_help=False)
    return p


def fail(cmd: str, message: str) -> int:
    """The one error line every sub-command ends with on bad input: `rookworld-debug <cmd>: error: …`, exit 2."""
    print(f"rookworld-debug {cmd}: error: {message}", file=sys.stderr)
    return 2


def run_guarded(cmd: str, fn, *args) -> int:
    """``fn(*args)`` with project errors and OS errors on user-named paths turned into `fail` (no traceback)."""
    from rookworld_debug.errors import RookWorldError
    try:
        return int(fn(*args) or 0)
    except RookWorldError as err:
        return fail(cmd, f"{type(err).__name__}: {err}")
    except OSError as err:          # a path the user named: missing, unreadable, a folder where a file goes…
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        return fail(cmd, f"{err.strerror or type(err).__name__}{where}" if err.strerror else f"{type(err).__name__}: {err}")
    except KeyboardInterrupt:
        return fail(cmd, "interrupted") + 128


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:       # forward everything (incl. --help) to the module's main(argv)
        import importlib
        return run_guarded(argv[0], importlib.import_module(DELEGATED[argv[0]][0]).main, argv[1:])
    args = build_parser().parse_args(argv)
    return run_guarded(args.command, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
