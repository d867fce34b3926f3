"""Diagnosis by replay: recompute each phase of a step from the previous phase's RECORDED output with the project's
trusted implementation of the declared objective, and name the first phase that disagrees.

    generation   the rollout against itself: groups share a prompt, the mask ends at the first EOS, texts = ids,
                 the weights that sampled are the policy's (first pass)
    rewards      the RookWorld reward of the recorded completions against their labels
    advantages   the declared family's advantages of the recorded rewards
    scoring      the policy's log-probs from the weights before the update; π_old's and the sampler's from the
                 weights that sampled; the reference's from its weights
    loss         the declared loss from the recorded log-probs, π_old, reference and advantages
    gradient     ∇θ of that loss at the weights before the update, against the recorded gradient
    update       the recorded optimizer's step from its state and the recorded gradient, against the weights after

A bug written into a loop has no signature a catalogue knows, but it always has a place: the first phase whose
output is not what its inputs should give. Within that phase the replay FITS what the recorded values are: a
neighbouring declaration (one keyword changed: the loop is healthy, its declaration is not), a known variant of the
trusted computation, or a generic transformation of the right answer (a permutation, a scale or sign, an affine map
per grouping, a token shift, a clamp, a rounding, another set of weights, the loss's terms with other coefficients,
the update with another learning rate or a component along θ). A fit counts only when it explains the difference
within the recorded precision; when none does, the place is the finding. What cannot be replayed (no weights, the
loop's own reward function, an engine reward) is said, never guessed.

    replay_trace(trace, path)  -> Replay          (path: the trace folder, for its recorded weights)
    replay_findings(replay)    -> list[Finding]

Between two recorded steps of one run, `consecutive.replay_consecutive(folder_k, folder_k1)` checks what must carry
over from step k to step k+1 (weights, optimizer state, sampler, reference, gradient, rewards) and
`consecutive_findings.consecutive_findings` makes its findings.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Optional

from rookworld_debug.diagnosis.replay.consecutive import clip_of
from rookworld_debug.diagnosis.replay.data_phases import advantages_check, generation_checks, rewards_check, row_labels
from rookworld_debug.diagnosis.replay.declaration import (DeclarationFit, fit_declaration, quantity_key,
                                                          with_inferred_pass)
from rookworld_debug.diagnosis.replay.findings import replay_findings
from rookworld_debug.diagnosis.replay.loss_phase import accumulation, gradient_confirms, loss_check, \
    scaled_gradient_mechanism
from rookworld_debug.diagnosis.replay.gradient_phase import gradient_check, unreachable, within_rounding
from rookworld_debug.diagnosis.replay.records import PHASES, PhaseCheck, Replay
from rookworld_debug.diagnosis.replay.resolve import resolve_checks
from rookworld_debug.diagnosis.replay.schedule import schedule_check
from rookworld_debug.diagnosis.replay.update import coupled_decay_check, decay_groups_check, duplicated_check, \
    untied_check, untrained_check, update_check
from rookworld_debug.diagnosis.replay.weights import Weights, weights_for

# a loop rarely differs from its declaration in more than a couple of keywords; past three, the fits stop
MAX_DECLARATION_FITS = 3

__all__ = ["PHASES", "PhaseCheck", "Replay", "DeclarationFit", "replay_trace", "replay_path", "replay_findings"]


def replay_trace(trace, path=None, *, weights: bool = True, loaded: Optional[Weights] = None) -> Replay:
    """Every phase the trace allows, recomputed and compared (see the module doc). `weights=False`: only the
    phases that need no model (generation, rewards, advantages, loss): well under a second. When the first
    disagreement is a declaration's (a neighbouring one agrees), the step is replayed again under the fitted
    declaration (`Replay.declaration`, `Replay.trace`). The loss's term regression runs last, only on a loss or
    gradient disagreement nothing simpler explains. `loaded`: the step's weights, already read (`weights_for`): the
    caller shares their forward and gradients (the corrected step)."""
    t0 = time.perf_counter()
    trace, pass_note = with_inferred_pass(trace)
    w = loaded if loaded is not None else weights_for(trace, path) if weights else \
        Weights.none("not asked for (--no-replay of the weights)")
    checks = _checks(trace, w)
    first, fits = _first(checks), []
    while first is not None and len(fits) < MAX_DECLARATION_FITS:     # one keyword at a time, each then kept
        agreed = frozenset(quantity_key(c) for c in checks if c.status == "agree")
        fit = fit_declaration(trace, first, lambda t, phase: _phase(t, w, phase), agreed)
        if fit is None:
            break
        fits.append(fit)
        trace = fit.trace
        checks = _checks(trace, w)
        first = _first(checks)
    if first is not None and first.cause in ("", "gradient_missing") and first.phase in ("loss", "gradient"):
        checks = _with_term_fit(trace, w, checks)       # a 0 gradient may be a term that carries none
    elif first is not None and _total_only(first, checks):
        checks = _gradient_over_total(trace, first, _with_term_fit(trace, w, checks))
    checks = _ordered(resolve_checks(trace, checks))    # each fitted number named in the step's own quantities
    return Replay(checks=tuple(checks), weights=w.source, seconds=time.perf_counter() - t0,
                  declarations=tuple(fits), trace=trace, pass_note=pass_note)


def _is_gradient(c) -> bool:
    return c.quantity.startswith(("gradient:", "the loss's gradient"))


def _total_only(first, checks) -> bool:
    """The loss total named by a variant while the gradient disagrees unexplained: one number that the gradient,
    a vector, has not confirmed."""
    return first.phase == "loss" and bool(first.cause) and quantity_key(first) == "loss" and \
        any(_is_gradient(c) and c.status == "disagree" and not c.cause for c in checks)


def _gradient_over_total(trace, first, checks) -> list:
    """Where the terms' regression explains the gradient, it names the mechanism and the total's variant (a match
    of one number the gradient contradicts) is kept as a disagreement without a cause, unless the gradient's fit is
    the one the variant predicts (each micro-batch's weight)."""
    explained = [c for c in checks if _is_gradient(c) and c.status == "disagree" and c.cause]
    if not explained or any(gradient_confirms(trace, first.cause, c.fit) for c in explained):
        return checks
    said = f"{first.explanation} — not established: the gradient is not this variant's (the terms' fit below)"
    return _ordered([dataclasses.replace(c, cause="", explanation=said) if c is first else c
                     for c in checks])


def _first(checks) -> Optional[PhaseCheck]:
    return next((c for c in checks if c.status == "disagree"), None)


def _checks(trace, w: Weights) -> list[PhaseCheck]:
    from rookworld_debug.diagnosis.replay.compare import skipped
    checks = [*generation_checks(trace, w.eos, w.tokenizer), rewards_check(trace, row_labels(trace)),
              advantages_check(trace)]
    if w.policy is not None:
        _share_policy_forward(trace, w)
        checks += _scoring(trace, w)
    else:
        checks.append(skipped("scoring", "log-probs from the weights", w.why))
    checks.append(loss_check(trace))
    checks += _gradient_and_update(trace, w, _dtype(trace))
    rate = schedule_check(trace)                # the rate the update read, against its scheduler's
    return _ordered(checks + ([rate] if rate is not None else []))


def _ordered(checks) -> list[PhaseCheck]:
    """In PHASES order (a gradient that shows a loss mistake is the loss's); within a phase, an explained
    disagreement first."""
    return sorted(checks, key=lambda c: (PHASES.index(c.phase), 0 if c.status == "disagree" and c.cause else 1))


def _with_term_fit(trace, w: Weights, checks) -> list[PhaseCheck]:
    """The gradient check again, with the regression on the loss's terms (one forward, a backward per term)."""
    from rookworld_debug.diagnosis.replay.terms import GradientFit
    if w.policy is None or w.state is None or w.state.gradient is None:
        return checks
    fitted = _rounded(trace, w, gradient_check(
        w.state.gradient, _declared_gradient(trace, w), _dtype(trace), accumulation(trace),
        GradientFit(trace, _jacobian(trace, w), lambda: _previous_pass_gradient(trace, w)),
        max_grad_norm=clip_of(trace)))
    rest = [c for c in checks if not c.quantity.startswith(("gradient:", "the loss's gradient"))]
    return _ordered(rest + [fitted])


def _rounded(trace, w: Weights, check: PhaseCheck) -> PhaseCheck:
    """A 16-bit step's unexplained gradient difference held to the rounding the replay measures on this step."""
    if check.status != "disagree" or check.cause or w.policy is None:
        return check
    return within_rounding(check, trace, w.policy, w.trainable, _declared_gradient(trace, w), _dtype(trace))


def _previous_pass_gradient(trace, w: Weights):
    """The declared loss's gradient at the previous pass's weights, when they are recorded: on a rollout's second
    pass they are the weights that sampled it (None otherwise)."""
    from rookworld_debug.diagnosis.replay.terms import TokenJacobian, declared_gradient
    if w.sampler is None or getattr(trace.recorded, "iteration", 0) != 1:
        return None
    return declared_gradient(trace, TokenJacobian(trace, w.sampler, w.trainable))


def _jacobian(trace, w: Weights):
    """The policy's forward over the recorded rows, its graph kept: every declaration's gradient is one backward
    through it (the rows and weights are the same for all)."""
    from rookworld_debug.diagnosis.replay.terms import TokenJacobian
    temps = tuple(float(t) for t in trace.rollout.temperatures.unique())   # a temperature declaration: its own
    return w.memo(("jacobian", temps), lambda: TokenJacobian(trace, w.policy, w.trainable))


def _share_policy_forward(trace, w: Weights) -> None:
    """Where the gradient check will run, its forward (graph kept) gives the scoring check the policy's log-probs
    and the sampled tokens' check its head inputs too: one forward of the weights before the update, not three."""
    from rookworld_debug.diagnosis.replay.model_phases import remember_logps
    if w.state is None or w.state.gradient is None or (trace.config.beta and trace.rollout.ref_per_token_logps is None):
        return
    jac = _jacobian(trace, w)
    remember_logps(w.cache, w.policy, trace.rollout, jac.logps.detach(), jac.hidden)


def _declared_gradient(trace, w: Weights) -> dict:
    from rookworld_debug.diagnosis.replay.terms import declared_gradient
    return w.memo(_gradient_key(trace), lambda: declared_gradient(trace, _jacobian(trace, w)))


def _unreachable(trace, w: Weights):
    """The declared gradient's disagreement where the head screen shows it without a backward (a neighbouring
    declaration's gradient, ruled out), else None. A gradient already taken is compared as it is."""
    from rookworld_debug.diagnosis.replay.terms import declared_weights
    if _gradient_key(trace) in w.cache:
        return None
    jac = _jacobian(trace, w)
    return unreachable(w.state.gradient, jac, declared_weights(trace, jac), _dtype(trace))


def _gradient_key(trace) -> tuple:
    return "gradient", json.dumps(trace.config.to_dict(), sort_keys=True, default=str)    # by content, not id


def _dtype(trace) -> str:
    return getattr(trace.recorded, "dtype", None) or str(trace.config.dtype)


def _scoring_dtype(trace) -> str:
    """The precision the step's log-probs were computed in: a run_step whose sampler ran under bf16 autocast
    (`sampling_autocast`) scored its rollout there too."""
    if trace.recorded is None and trace.capture is None and getattr(trace.config, "sampling_autocast", None) == "bf16":
        return "bfloat16"
    return _dtype(trace)


def _scoring(trace, w: Weights) -> list[PhaseCheck]:
    from rookworld_debug.diagnosis.replay import model_phases as M
    from rookworld_debug.diagnosis.replay.stepped_in_accumulation import stepped_in_accumulation
    checks = M.scoring_checks(trace, w.policy, w.reference, _scoring_dtype(trace), have=w.have,
                              ref_is_policy=w.ref_is_policy, policy_moved=_moved_before(w.state), sampler=w.sampler,
                              cache=w.cache, eos=w.eos, tokenizer=w.tokenizer)
    # the loss forward's log-probs of weights this step had already moved: it needs the optimizer, so it is here
    return [stepped_in_accumulation(c, trace, w, M.policy_logps(trace, w.policy, w.cache), clip_of(trace))
            if c.quantity.startswith("per_token_logps") else c for c in checks]


def _phase(trace, w: Weights, phase: str) -> list[PhaseCheck]:
    """One phase's checks on `trace` (a neighbouring declaration's): what a declaration fit compares."""
    from rookworld_debug.diagnosis.replay.data_phases import mask_checks
    if phase == "generation":
        return mask_checks(trace, w.eos)
    if phase == "advantages":
        return [advantages_check(trace)]
    if phase == "scoring":
        return _scoring(trace, w) if w.policy is not None else []
    if phase == "update":
        s = w.state
        ok = s is not None and s.optimizer and all(x is not None for x in (s.after, s.gradient, s.before))
        return [update_check(s, clip_of(trace), _dtype(trace))] if ok else []
    out = [loss_check(trace)]           # the loss value first: a cheap filter before a backward
    if any(c.status == "disagree" for c in out) or w.policy is None or w.state is None or w.state.gradient is None:
        return out
    ruled_out = _unreachable(trace, w)  # then the head screen: a backward only for a gradient that can agree
    if ruled_out is not None:
        return out + [ruled_out]
    return out + [_rounded(trace, w, gradient_check(w.state.gradient, _declared_gradient(trace, w), _dtype(trace),
                                                   accumulation(trace), max_grad_norm=clip_of(trace)))]


def _gradient_and_update(trace, w: Weights, dtype: str) -> list[PhaseCheck]:
    from rookworld_debug.diagnosis.replay.compare import REL_TOL, scalar, skipped, tol_for
    q = "gradient: ∇θ of the declared loss at the weights before the update"
    out = []
    if w.policy is None:
        out.append(skipped("gradient", q, w.why))
    elif trace.config.beta and trace.rollout.ref_per_token_logps is None:
        out.append(skipped("gradient", q, "the declared KL term needs the reference's log-probs, which were not "
                                          "recorded"))
    elif w.state is not None and w.state.gradient is not None:
        out.append(_scaled_mechanism(trace, _rounded(trace, w, gradient_check(
            w.state.gradient, _declared_gradient(trace, w), dtype, accumulation(trace), max_grad_norm=clip_of(trace)))))
    elif trace.update is not None and w.state is None and _single_pass(trace.config):
        ours = _declared_gradient(trace, w)
        norm = sum(float(v.double().pow(2).sum()) for v in ours.values()) ** 0.5
        out.append(scalar("gradient", q + " (its global L2 norm: the trace keeps no gradient)",
                          float(trace.update.grad_norm_pre_clip), norm, tol_for(REL_TOL, dtype)))
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
        out.append(update_check(s, clip_of(trace), dtype))
    idle = untrained_check(s) if s is not None and s.gradient is not None and s.before is not None \
        and s.after is not None else None
    decay = decay_groups_check(s) if s is not None and s.optimizer and s.before is not None else None
    untied = untied_check(s) if s is not None and s.trainable else None
    listed = duplicated_check(s) if s is not None and s.trainable else None
    coupled = coupled_decay_check(s, trace.recorded is None) if s is not None and s.optimizer else None
    return out + [c for c in (listed, coupled, idle, decay, untied) if c is not None]


def _scaled_mechanism(trace, check: PhaseCheck) -> PhaseCheck:
    """A gradient scaled by a factor the loss's own mechanism gives (loss_phase.scaled_gradient_mechanism): the
    loss's disagreement, named."""
    if check.cause != "gradient_scaled" or not check.fit:
        return check
    named = scaled_gradient_mechanism(trace, float(check.fit["params"]["scale"]))
    if named is None:
        return check
    code, why = named
    return dataclasses.replace(check, phase="loss", cause=code, explanation=why, fit={**check.fit, "sentence": why},
                               quantity="the loss's gradient: ∇θ of the declared loss (the value agrees; what it "
                                        "differentiates does not)")


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
