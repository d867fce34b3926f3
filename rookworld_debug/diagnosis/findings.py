"""The `Finding` record: a claim about what is wrong, with the numbers behind it and the change that should fix it.

A finding is a claim, so it carries its evidence (each number with its definition, its batch and where a view
shows it), the fix as concrete configuration changes, and the other causes its evidence could not rule out."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Evidence:
    """One number behind a finding."""
    name: str                           # metric key as TRL logs it or as the glossary names it ("kl", "clip_ratio/region_mean")
    value: float
    definition: str                     # estimator and normalization, in words
    batch: str                          # which batch: "sampled rollout", "greedy before/after", "held-out", "run log"
    where: str = ""                     # where a view shows it ("report: Loss decomposition", "triage: kl curve")


@dataclass(frozen=True)
class Fix:
    """The change that should remove the cause: configuration deltas and/or a code change in words."""
    description: str
    step_config: Mapping[str, object] = field(default_factory=dict)   # StepConfig overrides (run_step / whatif)
    grpo_config: Mapping[str, object] = field(default_factory=dict)   # TRL GRPOConfig overrides (a TRL branch)
    code_change: Optional[str] = None   # when no setting fixes it ("load the reference from the policy's start weights")


@dataclass(frozen=True)
class Finding:
    """A likely cause of what is wrong, ranked by `score` (higher = more likely / more important)."""
    code: str                           # stable identifier, e.g. "dropout_active"
    severity: str                       # "error" | "warning" | "info"
    cause: str                          # one sentence
    evidence: tuple                     # tuple[Evidence, ...]
    fix: Fix
    alternatives: tuple = ()            # other causes the evidence could not rule out (codes or sentences)
    score: float = 0.0
    step: Optional[int] = None          # the step the finding is about (run-level findings: first step it holds)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding.severity must be one of {SEVERITIES}, got {self.severity!r}")

    @property
    def title(self) -> str:
        """The catalogue's short name of the cause (e.g. "dropout active"); the code when not catalogued."""
        from rookworld_debug.diagnosis.catalogue import TITLES
        return TITLES.get(self.code, self.code.replace("_", " "))

    def to_dict(self) -> dict:
        """Plain JSON: what `rookworld-debug diagnose --json`, captures.json and triage.json hold."""
        return {"code": self.code, "title": self.title, "severity": self.severity, "cause": self.cause,
                "evidence": [_evidence_dict(e) for e in self.evidence], "fix": _fix_dict(self.fix),
                "alternatives": list(self.alternatives), "score": _num(self.score), "step": self.step}

    @staticmethod
    def from_dict(d: Mapping) -> "Finding":
        """The inverse of `to_dict` over a closed schema (a file's finding: only these keys, plain values)."""
        if not isinstance(d, Mapping):
            raise ValueError("a finding is a JSON object")
        fix = d.get("fix") or {}
        return Finding(code=str(d["code"]), severity=str(d["severity"]), cause=str(d.get("cause", "")),
                       evidence=tuple(Evidence(name=str(e.get("name", "")), value=_float(e.get("value")),
                                               definition=str(e.get("definition", "")), batch=str(e.get("batch", "")),
                                               where=str(e.get("where", ""))) for e in d.get("evidence") or ()
                                      if isinstance(e, Mapping)),
                       fix=Fix(description=str(fix.get("description", "")),
                               step_config=dict(fix.get("step_config") or {}),
                               grpo_config=dict(fix.get("grpo_config") or {}),
                               code_change=fix.get("code_change") if isinstance(fix.get("code_change"), str) else None),
                       alternatives=tuple(str(a) for a in d.get("alternatives") or ()),
                       score=_float(d.get("score", 0.0)),
                       step=d.get("step") if isinstance(d.get("step"), int) else None)


SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def rank(findings) -> list:
    """Most likely / most important first: by severity, then score (stable for ties)."""
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], -float(f.score)))


def rank_run(findings) -> list:
    """A run's findings: by severity, then the earliest step they hold at (a cause present from the start comes
    before what followed it), then score."""
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.step if f.step is not None else 1 << 60,
                                           -float(f.score)))


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else repr(x)


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _plain(v):
    if isinstance(v, (str, bool, int)) or v is None:
        return v
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return repr(v)


def _evidence_dict(e: Evidence) -> dict:
    return {"name": e.name, "value": _num(e.value), "definition": e.definition, "batch": e.batch, "where": e.where}


def _fix_dict(f: Fix) -> dict:
    return {"description": f.description, "step_config": {k: _plain(v) for k, v in f.step_config.items()},
            "grpo_config": {k: _plain(v) for k, v in f.grpo_config.items()}, "code_change": f.code_change}
