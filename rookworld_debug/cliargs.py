"""Integer options bounded where the system bounds them: argparse turns a value outside the range into the usual
one-line usage error (exit 2), never an overflow inside torch or a loop that runs for days."""
from __future__ import annotations

import argparse

MAX_THREADS = 1024          # torch.set_num_threads takes a C int; no machine this runs on has more cores
MAX_STEPS = 10_000          # optimizer steps a command will take before writing anything


def int_in(lo: int, hi: int):
    """An argparse `type`: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is outside {lo} … {hi}")
        return v
    parse.__name__ = "integer"          # argparse names the type in its message
    return parse


threads = int_in(1, MAX_THREADS)


def default_threads(fallback: int = 2) -> int:
    """The --threads default: OMP_NUM_THREADS where the environment sets it (a job scheduler's or a test harness's
    limit for each process: more threads than that fight the other processes for the cores, and OpenMP's waiting
    threads spin), else `fallback`."""
    import os
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""), 10)
    except ValueError:
        return fallback
    return n if 1 <= n <= MAX_THREADS else fallback


def add_threads(parser: argparse.ArgumentParser) -> None:
    """The --threads option of the commands that run torch on the CPU (default: `default_threads()`)."""
    parser.add_argument("--threads", type=threads, default=default_threads(),
                        help="CPU threads for torch (default: $OMP_NUM_THREADS where set, else 2)")
