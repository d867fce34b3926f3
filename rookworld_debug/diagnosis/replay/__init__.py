"""Diagnosis by replay: recompute each phase of a step from the previous phase's RECORDED output with the project's
trusted implementation of the declared objective, and name the first phase that disagrees.

    generation   the rollout against itself: groups share a prompt, the mask ends at the first EOS, texts = ids
    rewards      the RookWorld reward of the recorded completions against their labels
    advantages   the declared family's advantages of the recorded rewards
    scoring      the policy's / π_old's / the sampler's log-probs from the weights before the update and the ids;
                 the reference's from its weights
    loss         the declared loss from the recorded log-probs, π_old, reference and advantages
    gradient     ∇θ of that loss at the weights before the update, against the recorded gradient
    update       the recorded optimizer's step from its state and the recorded gradient, against the weights after

A bug written into a loop has no signature a catalogue knows, but it always has a place: the first phase whose
output is not what its inputs should give. Within that phase, a known mechanism (a variant of the trusted
computation that reproduces the recorded values exactly) names the cause; when none does, the place is the finding.
What cannot be replayed (no weights, the loop's own reward function, an engine reward) is said, never guessed.

    replay_trace(trace, path)  -> Replay          (path: the trace folder, for its recorded weights)
    replay_findings(replay)    -> list[Finding]
"""
from __future__ import annotations

import time
from typing import Optional

from rookworld_debug.diagnosis.replay.data_phases import (advantages_check, generation_checks, loss_check,
                                                         rewards_check)
from rookworld_debug.diagnosis.replay.findings import replay_findings
from rookworld_debug.diagnosis.replay.records import PHASES, PhaseCheck, Replay
from rookworld_debug.diagnosis.replay.weights import Weights, weights_for

__all__ = ["PHASES", "PhaseCheck", "Replay", "replay_trace", "replay_path", "replay_findings"]


def replay_trace(trace, path=None, *, weights: bool = True) -> Replay:
    """Every phase the trace allows, recomputed and compared (see the module doc). `weights=False`: only the
    phases that need no model (generation, rewards, advantages, loss): well under a second."""
    from rookworld_debug.diagnosis.replay.compare import skipped
    from rookworld_debug.diagnosis.replay import model_phases as M
    t0 = time.perf_counter()
    w = weights_for(trace, path) if weights else Weights.none("not asked for (--no-replay of the weights)")
    g = trace.rollout.num_generations
    labels = [x for x in trace.setup.batch.completions for _ in range(g)] if trace.setup.batch.completions else []
    checks = [*generation_checks(trace, w.eos, w.tokenizer), rewards_check(trace, labels), advantages_check(trace)]
    dtype = getattr(trace.recorded, "dtype", None) or str(trace.config.dtype)
    if w.policy is not None:
        checks += M.scoring_checks(trace, w.policy, w.reference, dtype, have=w.have, ref_is_policy=w.ref_is_policy,
                                   policy_moved=_moved_before(w.state))
    else:
        checks.append(skipped("scoring", "log-probs from the weights", w.why))
    checks.append(loss_check(trace))
    checks += _gradient_and_update(trace, w, dtype, any(c.status == "disagree" for c in checks))
    checks.sort(key=lambda c: PHASES.index(c.phase))      # a gradient that shows a loss mistake is the loss's
    return Replay(checks=tuple(checks), weights=w.source, seconds=time.perf_counter() - t0)


def _gradient_and_update(trace, w: Weights, dtype: str, upstream: bool) -> list[PhaseCheck]:
    from rookworld_debug.diagnosis.replay import model_phases as M
    from rookworld_debug.diagnosis.replay.compare import scalar, skipped, tol_for
    q = "gradient: ∇θ of the declared loss at the weights before the update"
    out = []
    if w.policy is None:
        out.append(skipped("gradient", q, w.why))
    elif w.state is not None and w.state.gradient is not None:
        ours = M.recompute_gradient(trace, w.policy, w.trainable)
        # a loss mistake its value hides shows in its gradient: tried only when no earlier phase disagreed
        variants = () if upstream else M.loss_variant_gradients(trace, w.policy, w.trainable, ours)
        out.append(M.gradient_check(w.state.gradient, ours, dtype, trace.recorded.gradient_accumulation_steps,
                                    variants))
    elif trace.update is not None and w.state is None and _single_pass(trace.config):
        ours = M.recompute_gradient(trace, w.policy, w.trainable)
        norm = sum(float(v.double().pow(2).sum()) for v in ours.values()) ** 0.5
        out.append(scalar("gradient", q + " (its global L2 norm: the trace keeps no gradient)",
                          float(trace.update.grad_norm_pre_clip), norm, tol_for(M.REL_TOL, dtype)))
    else:
        out.append(skipped("gradient", q, "no gradient was recorded"))
    s = w.state
    uq = "update: θ_after from θ_before, the gradient and the optimizer's state"
    if s is None or s.after is None or s.gradient is None or s.before is None:
        out.append(skipped("update", uq, "the weights after the update, the gradient or the weights before it were "
                                         "not recorded" if s is not None else w.why_update))
    elif not s.optimizer:
        out.append(skipped("update", uq, "the optimizer is not one a replay re-runs (AdamW, Adam, SGD) or was not "
                                         "recorded"))
    else:
        out.append(M.update_check(s, trace.recorded.max_grad_norm if trace.recorded else None, dtype))
    return out


def _moved_before(state) -> bool:
    """Whether the optimizer's state shows an earlier non-zero update (its first moment or momentum is non-zero):
    then the policy has left its start weights."""
    opt = getattr(state, "optimizer_state", None) or {}
    return any(k in ("exp_avg", "momentum_buffer") and bool(v.abs().sum() > 0)
               for st in opt.values() for k, v in st.items())


def _single_pass(config) -> bool:
    return config.num_iterations == 1 and (config.steps_per_generation or 1) == 1


def replay_path(path, *, weights: bool = True) -> Optional[Replay]:
    """The replay of the trace folder `path`."""
    from rookworld_debug.grpo.step import StepTrace
    return replay_trace(StepTrace.load(path), path, weights=weights)
