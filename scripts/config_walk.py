"""Follow a step's configuration through `run_step`: every call of this package's code that receives a StepConfig
from a caller that had one (the calls that pass it on), in the order a step makes them.

A stay is one such call site (caller → callee, counted once however often a loop repeats it); a room is the module
the callee lives in; a visit is an entry into a room from another one, and a return is a visit to a room the walk
had already left. Methods of the configuration itself (`config.replace`, its checks) are its own reading, not a
pass. Run on the embedded model:

    .venv/bin/python scripts/config_walk.py [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = str(ROOT / "rookworld_debug")
sys.path.insert(0, str(ROOT))


def _module(code) -> str:
    rel = Path(code.co_filename).resolve().relative_to(ROOT)
    return ".".join(rel.with_suffix("").parts)


def _takes_config(frame, kinds) -> bool:
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    if names and names[0] == "self" and isinstance(frame.f_locals.get("self"), kinds):
        return False                              # the configuration reading itself
    return any(isinstance(frame.f_locals.get(n), kinds) for n in names)


def walk(config, session=None) -> list:
    """[(caller, callee, room)] in first-call order, of `run_step(config, session=session)`."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.step import run_step
    stays, seen, holders = [], set(), set()

    def tracer(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(PKG):
            return None
        caller = frame.f_back
        if frame.f_code is run_step.__code__:
            holders.add(frame)
            return None
        if caller in holders and _takes_config(frame, StepConfig):
            holders.add(frame)
            edge = (caller.f_code, frame.f_code)
            if edge not in seen:
                seen.add(edge)
                stays.append((f"{_module(caller.f_code)}.{caller.f_code.co_name}",
                              f"{_module(frame.f_code)}.{frame.f_code.co_name}", _module(frame.f_code)))
        return None
    sys.settrace(tracer)
    try:
        run_step(config, session=session)
    finally:
        sys.settrace(None)
    return stays


def summary(stays: list) -> dict:
    """Stays, rooms, visits per room and returns (entries into a room the walk had already left)."""
    visits, last, returns = Counter(), None, 0
    for _, _, room in stays:
        if room != last:
            returns += room in visits
            visits[room] += 1
            last = room
    return {"stays": len(stays), "rooms": len(visits), "returns": returns, "max_visits": max(visits.values(), default=0),
            "visits": dict(visits.most_common())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the walk and its summary as JSON")
    a = ap.parse_args(argv)
    import torch

    from rookworld_debug.config import StepConfig
    torch.set_num_threads(1)
    config = StepConfig(model="tiny", reward_mode="dataset", batch_size=2, num_generations=2, max_new_tokens=8,
                        eval_max_new_tokens=4, heldout_n=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stays = walk(config)
    out = summary(stays)
    if a.json:
        print(json.dumps({**out, "walk": stays}, indent=1))
        return 0
    for caller, callee, _ in stays:
        print(f"{caller} → {callee}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
