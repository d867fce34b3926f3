"""`whatif` on a TRL run folder: which captured step to branch, and from which Trainer checkpoint.

A run folder (TRL's output_dir with the flight recorder's captures.json somewhere inside, e.g. a trl-demo run)
names the steps it flagged (a trigger fired) and holds the Trainer checkpoints it saved (checkpoint-N). A
flagged step's metrics are measured before its own update, so what made them is the update of the step before:
the branch re-runs the last captured step before the flagged one whose start (checkpoint step − 1) was saved,
else the flagged step itself. With --before checkpoint-N the captured step N + 1 is branched.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rookworld_debug.errors import CheckpointError, TraceError


@dataclass(frozen=True)
class BranchPoint:
    capture: Path            # the captured step's folder (trace.json)
    before: Path             # checkpoint-(step − 1): the Trainer state the step started from
    step: int
    flagged: Optional[int]   # the flagged step it leads to (None: no step was flagged)
    why: str                 # one line for the user: what was picked and why


def is_run_folder(path: Path) -> bool:
    """A folder that is neither a step nor a capture but holds flight-recorder captures (captures.json)."""
    return not (path / "trace.json").is_file() and not (path / "state.json").is_file() and \
        any(True for _ in path.rglob("captures.json"))


def _checkpoints(run: Path) -> dict:
    """{N: folder} of the Trainer checkpoints (checkpoint-N with optimizer.pt) directly inside `run`."""
    out = {}
    for p in run.glob("checkpoint-*"):
        n = p.name.removeprefix("checkpoint-")
        if n.isdigit() and (p / "optimizer.pt").is_file():
            out[int(n)] = p
    return out


def _fired(reasons) -> list:
    """The trigger names of a capture's reasons that are firings (not "lead-up" or "named" steps)."""
    return [str(r.get("trigger")) for r in reasons if isinstance(r, dict) and r.get("kind") not in ("lead-up", "named")]


def _captures(run: Path) -> dict:
    """{step: {"path", "reasons"}} of the captured steps the run's captures.json files name whose folder (inside
    its index's folder) holds a trace.json; entries of any other shape are left out."""
    out = {}
    for index in sorted(run.rglob("captures.json")):
        try:
            data = json.loads(index.read_text())
        except (OSError, ValueError, RecursionError) as err:
            raise TraceError(f"{index} is not readable JSON ({type(err).__name__})") from None
        home = index.parent.resolve()
        for e in data.get("captures", []) if isinstance(data, dict) and isinstance(data.get("captures"), list) else []:
            if not (isinstance(e, dict) and type(e.get("step")) is int and isinstance(e.get("path"), str)):
                continue
            try:
                path = (index.parent / e["path"]).resolve()
                ok = path.is_relative_to(home) and path != home and (path / "trace.json").is_file()
            except (OSError, ValueError, RuntimeError):
                ok = False
            if ok:
                out[e["step"]] = {"path": path, "reasons": e["reasons"] if isinstance(e.get("reasons"), list) else []}
    return out


def pick_branch(run, before=None) -> BranchPoint:
    """The captured step and checkpoint a what-if of this run folder starts from (module doc); TraceError or
    CheckpointError naming what is missing."""
    run = Path(run)
    captures = _captures(run)
    if not captures:
        raise TraceError(f"{run}: no captured step opens (captures.json names none that can be read)")
    ckpts = _checkpoints(run)
    if before is not None:
        return _given(run, Path(before), captures)
    flagged = {s: _fired(c["reasons"]) for s, c in sorted(captures.items()) if _fired(c["reasons"])}
    usable = sorted(s for s in captures if s - 1 in ckpts)
    for f, names in flagged.items():
        earlier = [s for s in usable if s < f]
        s = earlier[-1] if earlier else (f if f in usable else None)
        if s is not None:
            lead = f"the update before step {f}" if s < f else f"step {f} itself"
            why = (f"step {f} was flagged ({', '.join(sorted(set(names)))}): branching captured step {s} ({lead}) "
                   f"from {ckpts[s - 1]}")
            return BranchPoint(captures[s]["path"], ckpts[s - 1], s, f, why)
    if flagged:
        f = next(iter(flagged))
        raise CheckpointError(f"{run}: step {f} was flagged, but no Trainer checkpoint was saved before a captured "
                              f"step up to it (checkpoint-{f - 2} or checkpoint-{f - 1}): save checkpoints around it "
                              "(save_steps, or TrainerControl.should_save in a callback) or give a capture with --before")
    if not usable:
        raise CheckpointError(f"{run}: no Trainer checkpoint-N was saved before a captured step (checkpoint-N, "
                              "N = captured step − 1); give a capture folder with --before")
    s = usable[-1]
    return BranchPoint(captures[s]["path"], ckpts[s - 1], s, None,
                       f"no step was flagged: branching the last captured step {s} from {ckpts[s - 1]}")


def _given(run: Path, before: Path, captures: dict) -> BranchPoint:
    n = before.name.removeprefix("checkpoint-")
    if not n.isdigit():
        raise CheckpointError(f"--before {before}: not a Trainer checkpoint-N folder")
    s = int(n) + 1
    if s not in captures:
        raise TraceError(f"{run}: step {s} (the step after --before {before.name}) was not captured; captured: "
                         f"{sorted(captures)}")
    return BranchPoint(captures[s]["path"], before, s, None, f"branching captured step {s} from {before}")
