"""The same rollout under TRL's objectives and rookworld-rlvr's "mini": advantages, per-token loss, each row's
gradient weight, the cosine between the updates, and which rows each one moves.

Shape legend: N rows, T completion tokens, K objectives. For objective k with loss L_k:

    w_k[i, t]   = −∂L_k/∂ℓ_it            the weight token t of row i gets on its ∇log π (autograd on a detached
                                        copy of the rollout's log-probs: no forward pass)
    row_k[i]    = Σ_t w_k[i, t]          > 0: the update raises row i's sampled tokens, < 0: lowers them
    cos_logp    = cos(w_j, w_k)          over all (i, t): the two updates as pushes on the sampled log-probs
    cos_param   = cos(J^T w_j, J^T w_k)  over the policy's parameters (J = ∂ℓ/∂θ; one forward with grad and
                                        one vector–Jacobian product per objective; only with a policy)

Each objective uses its own advantages: TRL's (group-normalised) for grpo/dapo, the mini's baseline + global
normalisation for rlvr_mini, all from the same rewards. The step's β, ε and entropy coefficient are shared;
the mini's KL coefficient is its controller's (as the step would use it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from rookworld_debug.grpo.registry import advantages_from_config
from rookworld_debug.grpo.phases.loss_inputs import loss_inputs

DEFAULT_OBJECTIVES = ("grpo", "dapo", "rlvr_mini")
MOVE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class ObjectiveView:
    """One objective on the rollout."""
    loss_type: str
    advantages: torch.Tensor            # (N,) its advantages
    advantage_formula: str              # how they were formed
    per_token_loss: torch.Tensor        # (N, T) the record's L_it (0 where masked)
    token_weight: torch.Tensor          # (N, T) −∂L/∂ℓ_it
    row_weight: torch.Tensor            # (N,) Σ_t token_weight: the push on row i's log-prob
    loss: float                         # its total loss value
    definition: str                     # its loss formula with this step's settings
    beta: float                         # KL coefficient used


@dataclass(frozen=True)
class SideBySide:
    objectives: tuple                   # K ObjectiveView
    cos_logp: torch.Tensor              # (K, K) cosine of the token weights
    cos_param: Optional[torch.Tensor]   # (K, K) cosine of the parameter gradients; None without a policy
    lengths: torch.Tensor               # (N,) trained tokens per row
    rewards: torch.Tensor               # (N,)
    num_generations: int

    def moved(self, k: int) -> tuple:
        """Rows objective k pushes (|row weight| > 1e-12)."""
        return tuple(int(i) for i in torch.nonzero(self.objectives[k].row_weight.abs() > MOVE_TOLERANCE).flatten())


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    na, nb = float(a.norm()), float(b.norm())
    return float((a * b).sum()) / (na * nb) if na > 0 and nb > 0 else math.nan


def _objective(rollout, rewards, config, mask) -> tuple[ObjectiveView, torch.Tensor]:
    adv = advantages_from_config(rewards, config)
    leaf = rollout.per_token_logps.detach().clone().requires_grad_(True)               # (N, T)
    rec = loss_inputs(rollout, adv, config, logps=leaf, old=leaf.detach(), mask=mask, prepare=True).loss()
    grad = torch.autograd.grad(rec.loss, leaf, allow_unused=True)[0] if rec.loss.requires_grad else None
    w = torch.zeros_like(leaf) if grad is None else -grad.detach()                     # (N, T)
    view = ObjectiveView(config.loss_type, adv.advantages.detach(), adv.normalization, rec.per_token_loss.detach(),
                         w, w.sum(1), float(rec.loss.detach()), rec.definition, float(rec.beta))
    return view, w


def side_by_side(rollout, rewards, config, *, objectives=DEFAULT_OBJECTIVES, policy=None) -> SideBySide:
    """The rollout under each objective (see the module docstring). `rewards`: the step's Rewards record or
    an (N,) tensor; `policy` (optional): also the parameter-space cosine."""
    r = rewards.rewards if hasattr(rewards, "rewards") else torch.as_tensor(rewards)
    mask = rollout.completion_mask.to(rollout.per_token_logps.dtype)                   # (N, T)
    views, weights = [], []
    for lt in objectives:
        v, w = _objective(rollout, r, config.replace(loss_type=lt), mask)
        views.append(v)
        weights.append(w)
    k = len(views)
    cos = torch.full((k, k), math.nan)
    for a in range(k):
        for b in range(k):
            cos[a, b] = _cos(weights[a], weights[b])
    cos_p = None if policy is None else _param_cosines(policy, rollout, weights)
    return SideBySide(tuple(views), cos, cos_p, mask.sum(1), r.detach().clone(), rollout.num_generations)


def _param_cosines(policy, rollout, weights) -> torch.Tensor:
    """cos(J^T w_j, J^T w_k): one forward with grad, one vector–Jacobian product per objective."""
    from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy
    params = [p for p in policy.parameters() if p.requires_grad]
    logps, _ = per_token_logps_and_entropy(policy, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                           rollout.completion_mask, rollout.temperatures, with_grad=True,
                                           entropy_grad=False)                          # (N, T)
    flat = []
    for i, w in enumerate(weights):
        g = torch.autograd.grad(logps, params, grad_outputs=w.to(logps.dtype), retain_graph=i < len(weights) - 1,
                                allow_unused=True)
        flat.append(torch.cat([(x if x is not None else torch.zeros_like(p)).flatten() for x, p in zip(g, params)]))
    k = len(flat)
    out = torch.full((k, k), math.nan)
    for a in range(k):
        for b in range(k):
            out[a, b] = _cos(flat[a], flat[b])
    return out
