"""What the consecutive-step replay re-runs: step k's optimizer step from its recorded state (for the moments it
leaves), and the declared loss's gradient at step k+1's weights (for what its recorded gradient should hold)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from .gradient_phase import GRAD_ATOL
from .update import OPTIMIZERS, recorded_optimizer

MOMENTS = ("exp_avg", "exp_avg_sq", "momentum_buffer", "max_exp_avg_sq")


def clip_of(trace):
    """The gradient clip the step applied: its loop's recorded one, else its config's (run_step, TRL)."""
    return trace.recorded.max_grad_norm if trace.recorded is not None else trace.config.max_grad_norm

__all__ = ["GRAD_ATOL", "clip_of", "declared_gradient_at", "moments_after", "relative_moments", "step_count", "stepped_twice",
           "zero_state"]


def step_count(state: dict, kind: str) -> Optional[int]:
    """The optimizer's step count (a fresh Adam/AdamW: 0); None for an optimizer that keeps none (SGD)."""
    if kind not in ("Adam", "AdamW"):
        return None
    steps = [int(float(st["step"])) for st in state.values() if "step" in st]
    return max(steps) if steps else 0


def zero_state(state: dict) -> bool:
    """No moment, or every moment 0 (a fresh or zeroed optimizer state)."""
    return all(not bool(v.abs().sum() > 0) for st in state.values() for k, v in st.items() if k in MOMENTS)


def has_moments(kind: str, settings: dict) -> bool:
    """Whether one step of this optimizer leaves moments (plain SGD leaves none)."""
    return kind in ("Adam", "AdamW") or kind == "SGD" and bool(settings.get("momentum"))


def _stepper(s, max_grad_norm, names):
    """(params, optimizer): θ_before(k) with step k's recorded gradient (clipped as the loop clips), in the recorded
    optimizer holding its recorded state."""
    params = [torch.nn.Parameter(s.before[n].detach().clone()) for n in names]
    for p, n in zip(params, names):
        p.grad = s.gradient[n].detach().clone().to(p.dtype)
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, float(max_grad_norm))
    return params, recorded_optimizer(s.optimizer, params, names, s.optimizer_settings, s.optimizer_state,
                                      s.optimizer_groups)


def stepped_twice(sk, max_grad_norm, names, lr_factor: float = 1.0) -> Optional[dict]:
    """{name: θ} after two steps of step k's optimizer on its one (clipped) gradient, the second at `lr_factor` × the
    first's rate (a scheduler stepped between them), or None where not replayable: what a loop that calls
    optimizer.step() again on the same gradients leaves."""
    if not sk.optimizer or sk.optimizer not in OPTIMIZERS or sk.before is None or sk.gradient is None or \
            not all(n in sk.gradient and n in sk.before for n in names):
        return None
    params, opt = _stepper(sk, max_grad_norm, list(names))
    opt.step()
    for g in opt.param_groups:
        g["lr"] = g["lr"] * lr_factor
    opt.step()
    return {n: p.detach() for n, p in zip(names, params)}


def moments_after(sk, max_grad_norm, names, bound: float) -> tuple[Optional[dict], str]:
    """({name: {moment: tensor}} that step k's optimizer step leaves, re-run from θ_before(k), its recorded gradient
    and state, as `update.rerun_update` does; "") — or (None, why not): not replayable, or the re-run θ is not the
    recorded θ_after(k) within `bound` (step k's own update disagrees: its moments are not known)."""
    s = sk
    if not s.optimizer or s.optimizer not in OPTIMIZERS or s.before is None or s.gradient is None:
        return None, "step k's optimizer is not one a replay re-runs, or its weights or gradient were not recorded"
    names = [n for n in names if n in s.gradient and n in s.before]
    params, opt = _stepper(s, max_grad_norm, names)
    opt.step()
    if s.after is not None:
        d = math.sqrt(sum(float((p.detach().double() - s.after[n].double()).pow(2).sum())
                          for p, n in zip(params, names) if n in s.after))
        if d > bound:
            return None, ("step k's own update disagrees with its re-run (its replay says so): the moments it left "
                          "are not known, and were held to non-zero only")
    return {n: {k: v.detach().clone() for k, v in opt.state[p].items() if k in MOMENTS}
            for p, n in zip(params, names)}, ""


def relative_moments(got: dict, due: dict, names) -> tuple[float, str]:
    """(the largest ‖got − due‖ / ‖due‖ over the moments (each moment over every parameter), where)."""
    worst, where = 0.0, ""
    keys = {k for n in names for k in (due.get(n) or {}) if k in MOMENTS}
    for k in sorted(keys):
        num = den = 0.0
        for n in names:
            a, b = (got.get(n) or {}).get(k), (due.get(n) or {}).get(k)
            if b is None:
                continue
            a = torch.zeros_like(b) if a is None or tuple(a.shape) != tuple(b.shape) else a
            num += float((a.double() - b.double()).pow(2).sum())
            den += float(b.double().pow(2).sum())
        err = math.sqrt(num / den) if den > 0 else (math.inf if num > 0 else 0.0)
        if err > worst:
            worst, where = err, k
    return worst, where


def declared_gradient_at(trace, state) -> tuple[Optional[dict], str]:
    """(∇θ of `trace`'s declared loss at `state`'s weights before the update, "") or (None, why not)."""
    from rookworld_debug.errors import RookWorldError
    from rookworld_debug.grpo.trace.state import build_model
    from .terms import TokenJacobian, declared_gradient
    if trace.config.beta and trace.rollout.ref_per_token_logps is None:
        return None, "the declared KL term needs the reference's log-probs, which were not recorded at k+1"
    from .weights import scoring_model
    try:
        policy = scoring_model(trace, build_model(state, state.before))
    except RookWorldError as err:
        return None, f"step k+1's model cannot be rebuilt ({err})"
    return declared_gradient(trace, TokenJacobian(trace, policy, state.trainable)), ""
