"""`whatif`: self-check, then the one-step counterfactual, then (steps ≥ 1) the k-step branches and a verdict
per symptom. The result is one record (`WhatIfResult`) whose `to_dict()` is the JSON the CLI writes."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from rookworld_debug.errors import RookWorldError
from rookworld_debug.whatif import stats
from rookworld_debug.whatif.overrides import sampling_fields, Arm
from rookworld_debug.whatif.symptoms import choose, default_symptoms, symptom as named_symptom


class SelfCheckError(RookWorldError, ValueError):
    """The unchanged arm does not reproduce the recorded step: the branch refuses (the message names the stage)."""

    def __init__(self, check):
        self.check = check
        super().__init__(check.describe())


@dataclass(frozen=True)
class WhatIfResult:
    source: dict                        # kind, path, step, before
    config: dict                        # the saved step's StepConfig (or TRL GRPOConfig) as a dict
    arms: tuple                         # Arm per arm, the unchanged arm first
    self_check: object                  # SelfCheck
    one_step: tuple                     # OneStepArm per arm ((): not run, e.g. an arm changes the sampling)
    branches: tuple                     # BranchRun per (arm, seed)
    symptoms: tuple                     # Symptom judged
    verdicts: tuple                     # Verdict per (symptom, fix arm)
    steps: int
    seeds: int
    seconds: float
    notes: tuple = ()
    extra: dict = field(default_factory=dict)   # e.g. the group-size prediction

    def trajectories(self, arm: str) -> dict:
        """{metric: {"per_seed": [[...] per seed], "mean": [...]} } of one arm."""
        runs = [b for b in self.branches if b.arm == arm]
        if not runs:
            return {}
        metrics = [k for k in runs[0].rows[0] if k != "step"] if runs[0].rows else []
        out = {"step": [r["step"] for r in runs[0].rows]}
        for m in metrics:
            per = [b.series(m) for b in runs]
            mean = [_nanmean([p[i] for p in per]) for i in range(len(per[0]))]
            out[m] = {"per_seed": [[stats._num(x) for x in p] for p in per], "mean": [stats._num(x) for x in mean]}
        return out

    def to_dict(self) -> dict:
        one = {a.name: a for a in self.one_step}
        arms = [{"name": a.name, "overrides": dict(a.overrides), "source": a.source,
                 "update": one[a.name].to_dict() if a.name in one else None,
                 "trajectories": self.trajectories(a.name)} for a in self.arms]
        verdict: dict = {}
        for v in self.verdicts:
            verdict.setdefault(v.symptom, {})[v.arm] = v.to_dict()
        return {"source": self.source, "config": self.config, "self_check": self.self_check.to_dict(),
                "steps": self.steps, "seeds": self.seeds, "arms": arms,
                "symptoms": [{"name": s.name, "metric": s.metric, "agg": s.agg, "direction": s.direction,
                              "threshold": stats._num(s.threshold) if s.threshold is not None else None,
                              "definition": s.definition} for s in self.symptoms],
                "verdict": verdict, "seconds": self.seconds, "notes": list(self.notes), "extra": self.extra}


def _nanmean(v) -> float:
    f = [x for x in v if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(f) / len(f) if f else math.nan


def judge(branches: Sequence, arms: Sequence[Arm], symptoms: Sequence, *, pick: bool = True) -> tuple:
    """(symptoms judged, Verdict per (symptom, fix arm)): each arm's seeds paired with the unchanged arm's."""
    base = arms[0].name
    by = {}
    for b in branches:
        by.setdefault(b.arm, {})[b.seed] = b
    seeds = sorted(by.get(base, {}))
    values = {s.name: {a.name: [s.reduce(by[a.name][sd].series(s.metric)) if sd in by.get(a.name, {}) else math.nan
                                for sd in seeds] for a in arms} for s in symptoms}
    chosen = choose(symptoms, {n: v[base] for n, v in values.items()}) if pick else tuple(symptoms)
    out = [stats.verdict(s, a.name, values[s.name][a.name], values[s.name][base]) for s in chosen for a in arms[1:]]
    return tuple(chosen), tuple(out)


def whatif(path, arms: Sequence[Arm], *, steps: int = 0, seeds: int = 1, before=None, symptoms: Sequence[str] = (),
           cluster=None, device: Optional[str] = None, progress: Optional[Callable] = None, require_self_check: bool = True
           ) -> WhatIfResult:
    """The whole branch from a run_step trace or run_steps checkpoint (`whatif.state.load_state`). `device`: where
    the arms run (None: the saved configuration's own `device`).
    `arms[0]` must be the unchanged arm (no overrides). `progress(kind, n)`: kind 'arm' / 'step' ticks."""
    from rookworld_debug.whatif import onestep, selfcheck
    from rookworld_debug.whatif.branch import branch
    from rookworld_debug.whatif.state import load_state
    from rookworld_debug.whatif.overrides import check_needs_steps
    t0 = time.perf_counter()
    tick = progress or (lambda kind, n=1: None)
    check_needs_steps(arms, steps)
    sym_names = tuple(named_symptom(n).name for n in symptoms)     # unknown names refused before any work
    state = load_state(path, before=before, device=device)
    for a in arms:
        a.config(state.config)                        # every override checked before any work
    if arms[0].overrides:
        arms = (Arm("unchanged", {}, "recorded"), *arms)
    rec = onestep.recorded(state)
    stages = selfcheck.input_stages(state, rec)
    same = [a for a in arms if not set(a.overrides) & set(sampling_fields())]
    _, ones = onestep.one_step(state, same, rec=rec, on_arm=lambda i, r: tick("arm"))
    check = selfcheck.self_check(stages + selfcheck.update_stages(state, ones[0]), state.notes)
    if check.passed is False and require_self_check:
        raise SelfCheckError(check)
    runs, chosen, verdicts = (), (), ()
    if steps:
        runs = branch(state, arms, steps=steps, seeds=seeds, on_step=lambda: tick("step"), cluster=cluster)
        sym = tuple(named_symptom(n, state.history) for n in sym_names) or default_symptoms(state.history)
        chosen, verdicts = judge(runs, arms, sym, pick=not symptoms)
    extra = {}
    if steps and any("num_generations" in a.overrides for a in arms):
        from rookworld_debug.whatif.groupsize import group_size_report
        extra["group_size"] = group_size_report(state, arms, runs)
    return WhatIfResult(
        source={"kind": state.kind, "path": state.path, "step": state.step, "before": state.before},
        config=state.config.to_dict(), arms=tuple(arms), self_check=check, one_step=ones, branches=runs,
        symptoms=chosen, verdicts=verdicts, steps=steps, seeds=seeds if steps else 0,
        seconds=time.perf_counter() - t0, notes=state.notes, extra=extra)
