"""The `Finding` record: a claim about what is wrong, with the numbers behind it and the change that should fix it.

A finding is a claim, so it carries its evidence (each number with its definition, its batch and where a view
shows it), the fix as concrete configuration changes, and the other causes its evidence could not rule out."""
from __future__ import annotations

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
