"""The replay checks itself first: the unchanged arm must reproduce what was recorded about the step.

Stages, in the order the step computes them; the first that differs beyond its tolerance is named and the
branch refuses (a counterfactual from a state that does not reproduce the record would describe another step):

1. rewards     — the built-in reward of the recorded completions recomputed (trace source), or the mean sampled
                 reward of the step sampled again from its seed (checkpoint source), vs the record;
2. advantages  — the advantages recomputed from the recorded rewards with the step's settings;
3. log-probs   — logπ of the recorded sampled tokens under the start weights vs the rollout's (wrong start
                 weights show here first);
4. loss        — the loss the unchanged arm's update computed vs the recorded update's;
5. gradient    — its global grad norm before clipping vs the recorded one;
6. update      — ‖θ_after − θ_start‖₂ vs the recorded step's (one optimizer step only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

STAGES = ("rewards", "advantages", "log-probs", "loss", "gradient", "update")
# (absolute, relative) tolerance per stage: fp32 recompute noise is ~1e-7 on the loss, ~1e-6 on log-probs;
# Adam divides noise by √v, so the update size gets the loosest
TOLERANCES = {"rewards": (1e-6, 0.0), "advantages": (1e-5, 0.0), "log-probs": (1e-4, 0.0), "loss": (1e-5, 1e-4),
              "gradient": (1e-6, 1e-3), "update": (1e-9, 1e-2)}


@dataclass(frozen=True)
class StageCheck:
    stage: str
    recorded: float
    replayed: float
    diff: float                         # max |replayed − recorded| (elementwise for tensors)
    tolerance: float                    # atol + rtol·|recorded|
    ok: Optional[bool]                  # None: nothing recorded to compare
    definition: str

    def to_dict(self) -> dict:
        from rookworld_debug.whatif.stats import _num
        return {"stage": self.stage, "recorded": _num(self.recorded), "replayed": _num(self.replayed),
                "diff": _num(self.diff), "tolerance": _num(self.tolerance), "ok": self.ok,
                "definition": self.definition}


@dataclass(frozen=True)
class SelfCheck:
    passed: Optional[bool]              # None: nothing recorded could be compared
    first_diverging: Optional[str]      # the first stage that failed
    stages: tuple                       # StageCheck per stage, in STAGES order
    notes: tuple = ()

    def to_dict(self) -> dict:
        return {"passed": self.passed, "first_diverging": self.first_diverging,
                "stages": [s.to_dict() for s in self.stages], "notes": list(self.notes)}

    def describe(self) -> str:
        if self.passed:
            return "self-check passed: the unchanged arm reproduces the recorded step"
        if self.passed is None:
            return "self-check not possible: nothing recorded about the step to compare"
        s = next(x for x in self.stages if x.stage == self.first_diverging)
        notes = "".join(f"; note: {n}" for n in self.notes)
        return (f"self-check failed at stage '{s.stage}' (the first diverging stage): replayed {s.replayed:.6g} vs "
                f"recorded {s.recorded:.6g} (|diff| {s.diff:.3g} > {s.tolerance:.3g}; {s.definition}){notes}")


def stage(name: str, recorded: float, replayed: float, definition: str, diff: Optional[float] = None) -> StageCheck:
    atol, rtol = TOLERANCES[name]
    if recorded is None or not math.isfinite(float(recorded)):
        return StageCheck(name, math.nan, float(replayed), math.nan, math.nan, None, definition)
    d = abs(float(replayed) - float(recorded)) if diff is None else float(diff)
    tol = atol + rtol * abs(float(recorded))
    return StageCheck(name, float(recorded), float(replayed), d, tol, bool(d <= tol), definition)


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: Optional[torch.Tensor] = None) -> float:
    a, b = a.double(), b.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    d = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
    if mask is not None:
        d = d * mask
    d = torch.nan_to_num(d, nan=math.inf)
    return float(d.max()) if d.numel() else 0.0


def input_stages(state, rec) -> list:
    """rewards, advantages, log-probs: what the step computed before its update (the start weights' forward)."""
    from rookworld_debug.grpo.families import advantages_from_config
    from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy
    from rookworld_debug.grpo.phases.shared import rows
    from rookworld_debug.grpo.phases.rewards import compute_rewards
    from rookworld_debug.whatif.state import restore
    s, c, r = state.session, state.config, rec.rollout
    out = []
    if rec.regenerated:
        got = float(rec.rewards.rewards.nanmean())
        out.append(stage("rewards", state.recorded.get("rollout_reward"), got,
                         "mean reward of the N completions sampled again from the step's seed"))
        got_adv = float(rec.advantages.advantages.min())
        out.append(stage("advantages", state.recorded.get("advantage_min"), got_adv, "min advantage over the N rows"))
        out.append(StageCheck("log-probs", math.nan, math.nan, math.nan, math.nan, None,
                              "the run's table keeps no per-token log-probs"))
        return out
    again = compute_rewards(r.prompts, r.completions, r.tasks, labels=rows(s.batch.completions, c.num_generations),
                            reward_mode=c.reward_mode, engine=s.engine, completion_ids=r.completion_ids)
    d = _max_diff(again.rewards, rec.rewards.rewards)
    out.append(stage("rewards", 0.0, d, "max |recomputed − recorded| built-in reward over the N rows", diff=d))
    adv = advantages_from_config(rec.rewards.rewards, c).advantages
    d = _max_diff(adv, rec.advantages.advantages)
    out.append(stage("advantages", 0.0, d, "max |recomputed − recorded| advantage over the N rows", diff=d))
    restore(state)
    with torch.no_grad():
        lp, _ = per_token_logps_and_entropy(s.policy, r.prompt_ids, r.prompt_mask, r.completion_ids,
                                            r.completion_mask, r.temperatures)                # (N, T)
    d = _max_diff(lp, r.per_token_logps, r.completion_mask.double())
    out.append(stage("log-probs", 0.0, d, "max |logπ_start − recorded logπ| over the sampled tokens (mask)"
                     + _sha_note(state), diff=d))
    return out


def _sha_note(state) -> str:
    """Whether the start weights are the ones the trace recorded (sha256 of the weights), as evidence."""
    from rookworld_debug.models import weights_sha256
    want = state.recorded.get("start_weights_sha256")
    if not want:
        return ""
    got = weights_sha256(state.session.policy)
    return "; start weights sha256 " + ("= the recorded start's" if got == want else
                                        f"{got[:12]} ≠ the recorded start's {want[:12]}")


def update_stages(state, unchanged) -> list:
    """loss, gradient, update: the unchanged arm's first optimizer step vs the record."""
    rec = state.recorded
    loss_rec = rec.get("update_loss")
    if loss_rec is None or not math.isfinite(loss_rec):
        loss_rec = rec.get("loss")
    out = [stage("loss", loss_rec, unchanged.loss, "loss of the update's grad forward (first optimizer step)"),
           stage("gradient", rec.get("grad_norm_pre_clip"), unchanged.grad_norm_pre_clip,
                 "global L2 grad norm before clipping (first optimizer step)")]
    if unchanged.optimizer_steps == 1:
        out.append(stage("update", rec.get("param_delta_norm"), unchanged.param_delta_norm, "‖θ_after − θ_start‖₂"))
    else:
        out.append(StageCheck("update", math.nan, unchanged.param_delta_norm, math.nan, math.nan, None,
                              "several optimizer steps: the record keeps the last step's size only"))
    return out


def self_check(stages: list, notes=()) -> SelfCheck:
    failed = next((s.stage for s in stages if s.ok is False), None)
    compared = [s for s in stages if s.ok is not None]
    passed = None if not compared else failed is None
    return SelfCheck(passed, failed, tuple(stages), tuple(notes))
