"""The `Finding` record: a claim about what is wrong, with the numbers behind it and the change that should fix it.

A finding is a claim, so it carries its evidence (each number with its definition, its batch and where a view
shows it), the fix as concrete configuration changes, and the other causes its evidence could not rule out."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

from rookworld_debug.errors import DataError

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
        """The inverse of `to_dict` over a closed schema (a file's finding: only these keys, each of its type);
        DataError names the first field that does not fit."""
        return _finding_from_dict(d)


SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}

# broken invariants upstream of every other number: the log-probs, the reference, the optimizer, the loss, the
# objective's signs. When one holds, the signal-quality findings below are (or may be) its symptoms.
UPSTREAM = frozenset({
    "dropout_active", "forward_mismatch", "reference_not_start", "reference_precision", "reference_tracks_policy",
    "temperature_not_applied", "position_ids_left_pad", "pad_in_mask", "tokens_after_eos_trained",
    "sampler_precision", "sampler_trainer_mismatch", "optimizer_no_op", "loss_path_mismatch",
    "update_against_advantages", "objective_inverted", "non_finite", "sampling_greedy", "sampler_temperature_override"})
# what a broken upstream invariant produces downstream: noise-amplified advantages, a noisy or clipped update, a
# KL term that dominates for the wrong reason, a flat run
SYMPTOMS = frozenset({
    "tiny_sigma_groups", "std_floor_blowup", "update_mostly_noise", "grad_clip_binding", "kl_dominates",
    "no_signal_deterministic", "little_signal", "no_net_trend", "kl_runaway", "update_too_large",
    "grad_norm_spikes", "length_bias", "entropy_collapse", "phase_note"})


def is_replay_disagreement(f) -> bool:
    """The first phase a replay found disagreeing with its trusted recomputation (diagnosis.replay)."""
    return f.severity == "error" and bool(f.evidence) and str(f.evidence[0].name).startswith("replay/")


def _tier(findings):
    """−2 for the first phase a replay found disagreeing (every other finding is downstream of it or beside it),
    unless the replay only PLACED it (no mechanism reproduces the values: code replay_<phase>) while an error-level
    upstream check names a mechanism: then that check is −2 and the placement −1 after it; 1 for a symptom when an
    upstream invariant is broken (it ranks after every upstream finding), else 0."""
    broken = any(f.code in UPSTREAM or is_replay_disagreement(f) for f in findings)
    placed = [f for f in findings if is_replay_disagreement(f) and f.code.startswith("replay_")]
    named = bool(placed) and any(f.severity == "error" and f.code in UPSTREAM for f in findings)

    def tier(f):
        if named and f in placed:
            return -1
        if is_replay_disagreement(f) or f.code == "declaration_mismatch" or named and f.severity == "error" \
                and f.code in UPSTREAM:
            return -2
        return 1 if broken and f.code in SYMPTOMS else 0
    return tier


def rank(findings) -> list:
    """Most likely / most important first: a broken upstream invariant before the symptoms it produces, then by
    severity (a generic warning never outranks an error), then score (stable for ties)."""
    findings = list(findings)
    tier = _tier(findings)
    return sorted(findings, key=lambda f: (tier(f), SEVERITY_RANK[f.severity], -float(f.score)))


def rank_run(findings) -> list:
    """A run's findings: upstream causes before their symptoms, by severity, then the earliest step they hold at
    (a cause present from the start comes before what followed it), then score."""
    findings = list(findings)
    tier = _tier(findings)
    return sorted(findings, key=lambda f: (tier(f), SEVERITY_RANK[f.severity],
                                           f.step if f.step is not None else 1 << 60, -float(f.score)))


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else repr(x)


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


# ------------------------------------------------------------------ reading a finding from a file (closed schema)
_KEYS = {"code", "title", "severity", "cause", "evidence", "fix", "alternatives", "score", "step"}
_EVIDENCE_KEYS = {"name", "value", "definition", "batch", "where"}
_FIX_KEYS = {"description", "step_config", "grpo_config", "code_change"}
_NONFINITE = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf, "-inf": -math.inf,
              "-Infinity": -math.inf}


def _bad(field: str, message: str):
    return DataError(f"finding field {field!r}: {message}")


def _closed(d, keys: set, field: str) -> Mapping:
    if not isinstance(d, Mapping):
        raise _bad(field, f"is a {type(d).__name__}, not a JSON object")
    extra = sorted(map(str, set(d) - keys))
    if extra:
        raise _bad(field, f"unknown key(s) {', '.join(map(repr, extra[:5]))[:200]}")
    return d


def _str(d: Mapping, key: str, field: str, *, required: bool = False, default: str = "") -> str:
    if key not in d:
        if required:
            raise _bad(field, "is missing")
        return default
    v = d[key]
    if not isinstance(v, str):
        raise _bad(field, f"is a {type(v).__name__}, not a string")
    return v


def _number(v, field: str) -> float:
    """A number as to_dict writes it: int/float, or the text of a non-finite float."""
    if isinstance(v, str) and v in _NONFINITE:
        return _NONFINITE[v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(field, f"is a {type(v).__name__}, not a number")
    try:
        return float(v)
    except OverflowError:
        raise _bad(field, "is an integer too large for a number") from None


def _settings(v, field: str) -> dict:
    """A fix's configuration changes: {name: plain JSON value}."""
    if v is None:
        return {}
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise _bad(field, f"is a {type(v).__name__}, not an object of settings")
    return dict(v)


def _evidence(e, i: int) -> Evidence:
    f = f"evidence[{i}]"
    e = _closed(e, _EVIDENCE_KEYS, f)
    return Evidence(name=_str(e, "name", f + ".name"), value=_number(e.get("value", "nan"), f + ".value"),
                    definition=_str(e, "definition", f + ".definition"), batch=_str(e, "batch", f + ".batch"),
                    where=_str(e, "where", f + ".where"))


def _fix_from(v) -> Fix:
    fix = _closed({} if v is None else v, _FIX_KEYS, "fix")
    code = fix.get("code_change")
    if code is not None and not isinstance(code, str):
        raise _bad("fix.code_change", f"is a {type(code).__name__}, not a string")
    return Fix(description=_str(fix, "description", "fix.description"),
               step_config=_settings(fix.get("step_config"), "fix.step_config"),
               grpo_config=_settings(fix.get("grpo_config"), "fix.grpo_config"), code_change=code)


def _finding_from_dict(d) -> Finding:
    d = _closed(d, _KEYS, "finding")
    severity = _str(d, "severity", "severity", required=True)
    if severity not in SEVERITIES:
        raise _bad("severity", f"must be one of {SEVERITIES}, got {severity[:40]!r}")
    # absent or null means none; any other value must be a list (0, "" and {} are wrong types, not "empty")
    evidence, alternatives, step = d.get("evidence", []), d.get("alternatives", []), d.get("step")
    evidence = [] if evidence is None else evidence
    alternatives = [] if alternatives is None else alternatives
    if not isinstance(evidence, list):
        raise _bad("evidence", f"is a {type(evidence).__name__}, not a list")
    if not isinstance(alternatives, list) or not all(isinstance(a, str) for a in alternatives):
        raise _bad("alternatives", "is not a list of strings")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2 ** 63):
        raise _bad("step", f"is {type(step).__name__} {str(step)[:40]}, not a step number")
    _str(d, "title", "title")
    code = _str(d, "code", "code", required=True)
    if not code:
        raise _bad("code", "is empty")
    return Finding(code=code, severity=severity, cause=_str(d, "cause", "cause"),
                   evidence=tuple(_evidence(e, i) for i, e in enumerate(evidence)), fix=_fix_from(d.get("fix")),
                   alternatives=tuple(alternatives), score=_number(d.get("score", 0.0), "score"), step=step)
