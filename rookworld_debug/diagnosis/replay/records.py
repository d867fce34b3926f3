"""The replay's records: one `PhaseCheck` per recomputed quantity, and the `Replay` of a step."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# the phases in the order a step produces them; the first that disagrees is where the step went wrong
PHASES = ("generation", "rewards", "advantages", "scoring", "loss", "gradient", "update")
# the phases a corrected step (corrected.py, `whatif STEP --fix`) recomputes from; a generation or rewards fix changes
# the rollout or its scores, which a one-step comparison from the recorded rollout cannot hold
CORRECTABLE = ("advantages", "scoring", "loss", "gradient", "update")
AGREE, DISAGREE, SKIPPED = "agree", "disagree", "not replayed"
# a statistical test (not a recompute) beyond its warning bound but not its error bound: a warning, never the first
# disagreement a fit or the phases after it hang on
SUSPECT = "suspect"
# values a disagreement keeps for a plot (all of them when fewer): the worst quarter, then an even spread
MAX_SAMPLES = 2000


@dataclass(frozen=True)
class Samples:
    """A disagreeing quantity's values, a few thousand at most, flattened (what the replay view plots), and the
    positions where it differs beyond its tolerance (what the token view highlights)."""
    recorded: tuple             # (k,) floats: the recorded values at `positions`
    recomputed: tuple           # (k,) floats: the trusted implementation's values there
    positions: tuple            # (k,) index tuples into the quantity: (row,), (row, t), (element,) or () for a total
    axes: tuple                 # the index's axes: ("row",), ("row", "token"), ("element",) or () for a total
    beyond: tuple = ()          # index tuples beyond the tolerance, worst first (MAX_SAMPLES at most)
    n_beyond: int = 0           # how many elements are beyond the tolerance in all
    total: int = 0              # how many elements were compared (inside the loss mask, where there is one)
    threshold: float = math.nan     # the per-element bound `beyond` was held to
    parameter: str = ""         # a gradient or an update: the parameter whose elements these are
    picked: str = ""            # how the k values were chosen from the `total`


@dataclass(frozen=True)
class PhaseCheck:
    """One recorded quantity recomputed from the previous phase's recorded output by the trusted implementation."""
    phase: str                  # one of PHASES
    quantity: str               # what was compared, e.g. "advantages (N,)"
    status: str                 # AGREE | DISAGREE | SKIPPED | SUSPECT
    max_abs_diff: float = math.nan    # max |recorded − recomputed| (relative error for the gradient and update)
    tolerance: float = math.nan       # the bound the difference was held to (from the recorded precision)
    where: str = ""             # rows, tokens or layers where it differs most
    recorded: str = ""          # the recorded value(s) there
    recomputed: str = ""        # what the trusted implementation gives there
    cause: str = ""             # a finding code, when a known mechanism reproduces the recorded value exactly
    explanation: str = ""       # that mechanism in one sentence; for SKIPPED, why it could not be replayed
    measure: str = "max |recorded − recomputed|"   # the definition of max_abs_diff
    fit: Optional[dict] = None  # the fitted transformation that reproduces the recorded values (Fit.to_dict())
    samples: Optional[Samples] = None   # a disagreement's values and positions (for views; not in to_dict)

    def to_dict(self) -> dict:
        """Plain JSON (what `diagnose --json` carries for each replayed quantity)."""
        return {"phase": self.phase, "quantity": self.quantity, "status": self.status, "size": _num(self.max_abs_diff),
                "measure": self.measure, "tolerance": _num(self.tolerance), "where": self.where,
                "recorded": self.recorded, "recomputed": self.recomputed, "cause": self.cause,
                "explanation": self.explanation, "fit": _plain(self.fit)}


@dataclass(frozen=True)
class Replay:
    checks: tuple               # PhaseCheck, in PHASES order
    weights: str                # where the weights came from ("recorded state/", "the embedded model", "none: …")
    seconds: float
    declarations: tuple = ()    # DeclarationFit, in the order found: the keywords under which the step agrees
    trace: object = None        # the StepTrace replayed (under the fitted declarations when there are any)
    pass_note: object = None    # declaration.PassNote: num_iterations > 1 declared without which pass was recorded

    @property
    def declaration(self):
        """The first fitted declaration (None: the step agrees with, or disagrees beyond, the declared one)."""
        return self.declarations[0] if self.declarations else None

    def phases(self) -> list:
        """[{phase, status, quantities, why}] in PHASES order: agree / disagree / not replayed, and why not."""
        out = []
        for p in PHASES:
            cs = [c for c in self.checks if c.phase == p]
            if not cs:
                continue
            status = next((s for s in (DISAGREE, SUSPECT, AGREE) if any(c.status == s for c in cs)), SKIPPED)
            out.append({"phase": p, "status": status, "quantities": [c.quantity for c in cs],
                        "why": "; ".join(c.explanation for c in cs if c.status == SKIPPED)})
        return out

    def to_dict(self) -> dict:
        """Plain JSON: the first disagreement (None when every replayed phase agrees), every phase's status, the
        declaration fit, the checks and where the weights came from."""
        first = self.first_disagreement
        return {"first_disagreement": first.to_dict() if first is not None else None, "phases": self.phases(),
                "declarations": [{"keyword": d.keyword, "declared": d.declared, "fitted": d.fitted, "phase": d.phase,
                                  "quantity": d.quantity, "difference": _num(d.difference),
                                  "tolerance": _num(d.tolerance)} for d in self.declarations],
                "checks": [c.to_dict() for c in self.checks], "weights": self.weights,
                "seconds": _num(self.seconds)}

    @property
    def first_disagreement(self) -> Optional[PhaseCheck]:
        return next((c for c in self.checks if c.status == DISAGREE), None)

    @property
    def skipped(self) -> tuple:
        return tuple(c for c in self.checks if c.status == SKIPPED)


def _num(x):
    """A float as JSON: finite as is, else its name ("inf", "nan")."""
    x = float(x)
    return x if math.isfinite(x) else str(x)


def _plain(x):
    """`x` with every float as `_num` writes it (a fit's residual may be NaN): strict JSON."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return _num(x) if isinstance(x, float) else x


def fmt(x) -> str:
    """A short rendering of a number or a small list of numbers."""
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x[:6]) + (", …" if len(x) > 6 else "") + "]"
    x = float(x)
    return f"{x:.6g}" if math.isfinite(x) else str(x)
