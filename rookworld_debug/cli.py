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


def _delegate(module: str, func: str = "main"):
    """Forward the remaining argv to `module.func(argv) -> int`."""
    def run(args) -> int:
        import importlib
        return int(getattr(importlib.import_module(module), func)(args.rest) or 0)
    return run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rookworld-debug", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("smoke", help="load bundled data, Stockfish and the model; print provenance")
    s.add_argument("--model", default="tiny")
    s.add_argument("--depth", type=int, default=10)
    s.set_defaults(func=_smoke)

    for name, module, help_ in [
        ("main", "rookworld_debug.mainjob", "the README's main job: one GRPO step report on the embedded default"),
        ("step", "rookworld_debug.grpo.cli_step", "run ONE GRPO step, print the phase-by-phase log, save the trace"),
        ("run", "rookworld_debug.grpo.cli_run", "run N GRPO steps with schedules, checkpoints and a per-step log"),
        ("report", "rookworld_debug.report_cli", "papermill sweep: notebook x parameter grid -> HTML reports + index"),
        ("generate-data", "rookworld_debug.data.generate", "generate RookWorld-format P:/A: samples"),
        ("train-tiny", "rookworld_debug.models.train_tiny", "train the embedded tiny RookWorld model"),
        ("measure", "rookworld_debug.models.measure", "measure format/legality metrics of any model"),
        ("bench", "benchmarks.step", "benchmark our step vs TRL GRPOTrainer vs the seeds' loop"),
    ]:
        s = sub.add_parser(name, help=help_, add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
        s.set_defaults(func=_delegate(module))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
