"""An optimizer step taken inside the gradient-accumulation loop (clip_grad_norm_, optimizer.step() and zero_grad()
after each micro-batch's backward): the rows of micro-batch j + 1 are then scored at the weights the optimizer
reached after j steps, one per earlier micro-batch. Read from the loss forward's recorded log-probs: the first
micro-batch's agree with the weights before the update and a later one's do not. The fit re-runs those steps (each
micro-batch's share of the declared gradient at the weights it was scored at, clipped at the declared norm, through
the recorded optimizer from its recorded state) and holds each later micro-batch's recorded log-probs to the weights
that step reached."""
from __future__ import annotations

import copy
from dataclasses import replace

import torch

from .records import DISAGREE, PhaseCheck, fmt
from .fits import Fit


def stepped_in_accumulation(check: PhaseCheck, trace, w, ours: torch.Tensor, clip) -> PhaseCheck:
    """`check` (the loss forward's log-probs against the weights before the update, `ours` (N, T)) with the cause
    named where each later micro-batch's recorded log-probs are those of the weights after the earlier micro-batches'
    steps; else `check` unchanged."""
    from .loss_phase import micro_batches
    s, chunks = w.state, micro_batches(trace)
    if check.status != DISAGREE or check.cause or trace.capture is not None or len(chunks) < 2 or s is None \
            or not s.optimizer or w.policy is None:
        return check
    rec, mask = trace.rollout.per_token_logps.double(), trace.rollout.completion_mask.bool()

    def gap(values, rows) -> float:
        return float((rec[rows] - values[rows].double()).abs().masked_fill(~mask[rows], 0.0).max())
    if gap(ours, chunks[0]) > check.tolerance or all(gap(ours, rows) <= check.tolerance for rows in chunks[1:]):
        return check                  # the mechanism moves only the later micro-batches' rows
    gaps = _rerun(trace, w, chunks, clip, gap)
    if max(gaps) > check.tolerance:
        return check
    k = len(chunks)
    said = (f"the rows of micro-batch j + 1 were scored at the weights after j optimizer steps: optimizer.step() ran "
            f"after each of the {k} micro-batches' backward, inside the accumulation loop, so this step made {k} "
            f"updates where one was due. Re-running them (each micro-batch's share of the declared gradient, clipped "
            f"at {clip}, through the recorded optimizer) reproduces {'micro-batch 2' if k == 2 else f'micro-batches 2–{k}'}'s recorded log-probs to "
            f"{fmt(max(gaps))} (tolerance {fmt(check.tolerance)})")
    fit = Fit("stepped_in_accumulation", {"micro_batches": k, "max_gap": max(gaps), "gaps": gaps,
                                          "rows": [[int(chunk[0]), int(chunk[-1])] for chunk in chunks]},
              max(gaps), said)
    return replace(check, cause="optimizer_stepped_per_micro_batch", explanation=said, fit=fit.to_dict())


def _rerun(trace, w, chunks, clip, gap) -> list:
    """Each later micro-batch's gap to the weights the earlier micro-batches' steps reach (on a copy of the
    policy; the recorded optimizer state is read, never written)."""
    from rookworld_debug.grpo.objective.params import Objective

    from .model_phases import recompute_logps
    from .terms import TokenJacobian, token_weights
    from .update import recorded_optimizer
    s = w.state
    model = copy.deepcopy(w.policy)
    params = dict(model.named_parameters())
    names = [n for n in s.trainable if n in params]
    opt = recorded_optimizer(s.optimizer, [params[n] for n in names], names, s.optimizer_settings,
                             copy.deepcopy(s.optimizer_state), s.optimizer_groups)
    gaps = []
    for j, rows in enumerate(chunks[:-1]):
        jac = TokenJacobian(trace, model, names)
        u_lp, u_ent = token_weights(trace, Objective.from_config(trace.config), jac)
        keep = torch.zeros(u_lp.shape[0], 1, dtype=u_lp.dtype)
        keep[rows] = 1.0
        grad = jac.gradient(u_lp * keep, u_ent * keep)
        del jac                                   # its graph holds the forward's activations
        for n in names:
            params[n].grad = grad[n].to(params[n].dtype)
        if clip:
            torch.nn.utils.clip_grad_norm_([params[n] for n in names], float(clip))
        opt.step()
        for n in names:
            params[n].grad = None
        with torch.no_grad():
            gaps.append(gap(recompute_logps(model, trace.rollout), chunks[j + 1]))
    return gaps
