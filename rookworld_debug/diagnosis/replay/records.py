"""The replay's records: one `PhaseCheck` per recomputed quantity, and the `Replay` of a step."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# the phases in the order a step produces them; the first that disagrees is where the step went wrong
PHASES = ("generation", "rewards", "advantages", "scoring", "loss", "gradient", "update")
AGREE, DISAGREE, SKIPPED = "agree", "disagree", "not replayed"


@dataclass(frozen=True)
class PhaseCheck:
    """One recorded quantity recomputed from the previous phase's recorded output by the trusted implementation."""
    phase: str                  # one of PHASES
    quantity: str               # what was compared, e.g. "advantages (N,)"
    status: str                 # AGREE | DISAGREE | SKIPPED
    max_abs_diff: float = math.nan    # max |recorded − recomputed| (relative error for the gradient and update)
    tolerance: float = math.nan       # the bound the difference was held to (from the recorded precision)
    where: str = ""             # rows, tokens or layers where it differs most
    recorded: str = ""          # the recorded value(s) there
    recomputed: str = ""        # what the trusted implementation gives there
    cause: str = ""             # a finding code, when a known mechanism reproduces the recorded value exactly
    explanation: str = ""       # that mechanism in one sentence; for SKIPPED, why it could not be replayed
    measure: str = "max |recorded − recomputed|"   # the definition of max_abs_diff


@dataclass(frozen=True)
class Replay:
    checks: tuple               # PhaseCheck, in PHASES order
    weights: str                # where the weights came from ("recorded state/", "the embedded model", "none: …")
    seconds: float

    @property
    def first_disagreement(self) -> Optional[PhaseCheck]:
        return next((c for c in self.checks if c.status == DISAGREE), None)

    @property
    def skipped(self) -> tuple:
        return tuple(c for c in self.checks if c.status == SKIPPED)


def fmt(x) -> str:
    """A short rendering of a number or a small list of numbers."""
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x[:6]) + (", …" if len(x) > 6 else "") + "]"
    x = float(x)
    return f"{x:.6g}" if math.isfinite(x) else str(x)
