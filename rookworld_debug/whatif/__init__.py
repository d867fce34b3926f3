"""What if: branch a step or a run from its saved state, apply a fix, and measure whether it removes the symptom.

`whatif(path, arms, steps=k, seeds=S)`: the self-check (the unchanged arm must reproduce the record, else
`SelfCheckError` names the first diverging stage), the one-step counterfactual on the recorded rollout, and
k-step branches with S shared seeds judged per symptom (removed / not removed / cannot tell at this S / absent in both).
TRL captures are branched by `rookworld_debug.trl.whatif`, which runs TRL's own GRPOTrainer."""
from .overrides import Arm, arms_from_dicts, arms_from_sets, parse_sets
from .run import SelfCheckError, WhatIfResult, whatif

__all__ = ["Arm", "arms_from_dicts", "SelfCheckError", "WhatIfResult", "arms_from_sets", "parse_sets", "whatif"]
