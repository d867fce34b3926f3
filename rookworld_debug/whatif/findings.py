"""`whatif --from-findings`: one arm per finding whose fix is a configuration change, and the symptoms its
evidence names. The findings come from `rookworld_debug.diagnosis` (`diagnose_path`), or are given."""
from __future__ import annotations

from typing import Sequence

from rookworld_debug.errors import ConfigError
from rookworld_debug.whatif.overrides import Arm, canonical
from rookworld_debug.whatif.symptoms import EVIDENCE_TO_SYMPTOM

# GRPOConfig field → StepConfig field where the names differ (a finding's `grpo_config` delta)
GRPO_TO_STEP = {"learning_rate": "lr", "epsilon": "epsilon_low", "max_completion_length": "max_new_tokens",
                "adam_epsilon": "adam_eps"}


def diagnose(path) -> list:
    """The findings of a saved step or run folder (`rookworld_debug.diagnosis.diagnose_path`)."""
    try:
        from rookworld_debug.diagnosis import diagnose_path
    except ImportError:
        raise ConfigError("--from-findings", "this installation has no diagnosis checks "
                          "(rookworld_debug.diagnosis.diagnose_path is missing)") from None
    return list(diagnose_path(path))


def arms_from_findings(findings: Sequence, *, trl: bool = False) -> tuple:
    """(arms, symptom names): the unchanged arm, then one arm per finding with a configuration fix (highest
    score first; identical deltas tried once). `trl`: take the fix's GRPOConfig delta when it has one."""
    arms, seen, symptoms = [Arm("unchanged", {}, "recorded")], set(), []
    for f in sorted(findings, key=lambda x: -float(getattr(x, "score", 0.0))):
        fix = f.fix
        delta = {GRPO_TO_STEP.get(k, k): v for k, v in dict(fix.grpo_config).items()} \
            if trl and fix.grpo_config else dict(fix.step_config)
        if not delta:
            continue                      # a code change, not a setting: nothing to branch
        ov = canonical(delta)
        key = tuple(sorted((k, repr(v)) for k, v in ov.items()))
        if key in seen:
            continue
        seen.add(key)
        arms.append(Arm(f.code, ov, f"finding {f.code}: {fix.description}"))
        for e in f.evidence:
            s = EVIDENCE_TO_SYMPTOM.get(e.name)
            if s and s not in symptoms:
                symptoms.append(s)
    if len(arms) == 1:
        raise ConfigError("--from-findings", f"none of the {len(findings)} finding(s) has a configuration fix to try")
    return tuple(arms), tuple(symptoms)
