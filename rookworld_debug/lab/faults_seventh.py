"""How the seventh held-out fault set (`handloop.SEVENTH_FAULTS`, `between_steps.SEVENTH_BETWEEN_FAULTS`) is written
into the hand-written loop: each helper is the buggy computation as a trainer that has the bug computes it, called by
the loop where the fault is named (its TRL part, `faults_trl.SEVENTH_TRL_FAULTS`, lives with the other TRL faults; its
part in the project's own step, `faults_heldout.SEVENTH_STEP_FAULTS`, with the other `Fault`s). Kept apart so that the
loop's own file stays readable; it imports nothing of the loop."""
from __future__ import annotations

import torch

LOSS_SCALE = 65536.0         # fp16's GradScaler's initial loss scale (2^16)
KL_TARGET, KL_HORIZON = 6.0, 10000   # an adaptive KL controller's target and horizon (the PPO defaults)


# ------------------------------------------------------------------------------------------------- one step
def without_first_token(mask: torch.Tensor, s_logps: torch.Tensor) -> tuple:
    """The completion mask of a loop whose action mask is cut one column too far to the right at its start: the
    first completion token is left out (the rest, EOS included, stays in). (mask, sampler log-probs) under it."""
    mask = mask.clone()
    mask[:, 0] = 0
    return mask, s_logps * mask


def top_token_logps(logps: torch.Tensor) -> torch.Tensor:
    """(N,) the log-prob an engine's per-position logprob dictionary lists first (the top-ranked token's), read as
    the sampled token's: right only where the sampled token is the top one. `logps`: (N, V) the sampling
    distribution's log-probs."""
    return logps.max(-1).values


def last_logp_zero_padded(s_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sampler's log-probs as an engine that returned one fewer log-prob than token ids gives them, zero-padded at
    the tail to the completion's length: each row's last in-mask token gets log-prob 0."""
    out = s_logps.clone()
    last = (mask.sum(1) - 1).clamp(min=0)
    rows = torch.arange(out.shape[0])
    out[rows, last] = torch.where(mask[rows, last].bool(), torch.zeros_like(out[rows, last]), out[rows, last])
    return out


def sequence_ratio_summed(logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The importance ratio of a loop that scores each completion by its SUMMED log-prob:
    exp(Σ_t m·(ℓ − ℓ_old)), the product of the token ratios (not their length-normalised geometric mean),
    broadcast to every token."""
    return torch.exp(((logps - old) * mask).sum(1, keepdim=True)).expand_as(logps)


def clip_counting_tied_twice(model, max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ whose global norm lists the tied input embedding and output head as two parameters: the
    shared gradient's square counted twice in the norm, the clip coefficient applied once to every tensor."""
    params = [p for p in model.parameters() if p.grad is not None]
    head = model.get_output_embeddings().weight
    norms = [p.grad.detach().norm() for p in params] + ([head.grad.detach().norm()] if head.grad is not None else [])
    total = torch.stack(norms).norm()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    with torch.no_grad():
        for p in params:
            p.grad.mul_(coef)
    return total


def clip_while_scaled(model, max_norm: float, scale: float = LOSS_SCALE) -> None:
    """A mixed-precision step that clips before unscaling: the gradient as the loss scaler holds it (× `scale`) is
    clipped to `max_norm`, then divided by `scale` when the scaler steps the optimizer."""
    params = [p for p in model.parameters() if p.grad is not None]
    with torch.no_grad():
        for p in params:
            p.grad.mul_(scale)
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    with torch.no_grad():
        for p in params:
            p.grad.div_(scale)


# ------------------------------------------------------------------------------------- between consecutive steps
def delta_applied_twice(state: dict, start: dict) -> dict:
    """The weights a sync sends whose update (the weights' change since the start, as an adapter's delta) was merged
    into weights that already hold it: θ + (θ − θ_start)."""
    return {k: v + (v - start[k]) if v.is_floating_point() else v for k, v in state.items()}


def qkv_interleaved(state: dict, heads: int) -> dict:
    """The weights a sync sends with each fused attention projection converted to the per-head interleaved layout
    ([q_h | k_h | v_h] for each head) while the engine reads the block layout [Q | K | V]."""
    out = dict(state)
    order = None
    for k, v in state.items():
        if order is None and k.endswith("attn.c_attn.bias"):
            width = v.shape[0] // 3
            dim = width // heads
            order = torch.cat([torch.arange(h * dim, (h + 1) * dim) + part * width
                               for h in range(heads) for part in range(3)])
    for k, v in state.items():
        if k.endswith("attn.c_attn.weight"):
            out[k] = v[:, order].contiguous()
        elif k.endswith("attn.c_attn.bias"):
            out[k] = v[order].contiguous()
    return out


def adapted_beta(beta: float, current_kl: float, n_steps: int) -> float:
    """The KL coefficient after an adaptive controller's update (run although a fixed coefficient was configured):
    β·(1 + clip(KL / target − 1, ±0.2)·n_steps / horizon)."""
    error = min(max(current_kl / KL_TARGET - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * n_steps / KL_HORIZON)


def rollout_kl(ref_logps: torch.Tensor, s_logps: torch.Tensor, mask: torch.Tensor) -> float:
    """The rollout's mean per-token k3 KL of the sampled tokens to the reference (what the controller reads)."""
    d = (ref_logps - s_logps) * mask
    return float(((torch.exp(d) - d - 1) * mask).sum() / mask.sum().clamp(min=1))
