"""How the eighth held-out fault set (`handloop.EIGHTH_FAULTS`, `between_steps.EIGHTH_BETWEEN_FAULTS`) is written
into the hand-written loop: each helper is the buggy computation as a trainer that has the bug computes it, called by
the loop where the fault is named (its TRL part, `faults_trl.EIGHTH_TRL_FAULTS`, lives with the other TRL faults; its
part in the project's own step, `faults_heldout.EIGHTH_STEP_FAULTS`, with the other `Fault`s). Kept apart so that the
loop's own file stays readable; it imports nothing of the loop."""
from __future__ import annotations

import math

import torch

LORA_RANK = 16               # the adapter's rank r: rsLoRA scales by α/√r, an engine that ignores it by α/r
HORIZON_FACTOR = 2           # the resumed run's schedule horizon, in units of the one the run started with


# ------------------------------------------------------------------------------------------------- one step
def optimizer_over_named_parameters(model, lr: float) -> torch.optim.Optimizer:
    """AdamW over the list `named_parameters(remove_duplicate=False)` gives: the tied input embedding and output head
    listed twice, so each step applies the tied weight's update twice (and advances its moments twice)."""
    params = [p for _, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr)


def rows_summed_over_horizon(lm: torch.Tensor, horizon: int, micro_batches: int) -> torch.Tensor:
    """Dr. GRPO's loss as a trainer computes it that sums the sequences' token sums and divides by the horizon only:
    Σ_rows Σ_t L·m / T per micro-batch (÷ the accumulation's micro-batches), not averaged over the rows."""
    return lm.sum() / horizon / micro_batches


def sequence_ratio(logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, 1) the sequence-level importance ratio exp(Σ_t m·(ℓ − ℓ_old) / |o|) that a trainer multiplies the per-token
    KL by for its bias correction in place of the per-token ratio: the same value on-policy, another gradient."""
    return torch.exp(((logps - old) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1))


def micro_batch_row_mean(lm: torch.Tensor, m: torch.Tensor, micro_batches: int) -> torch.Tensor:
    """The per-sequence mean loss taken over the micro-batch's own rows, then divided by the number of
    micro-batches: each micro-batch weighted the same whatever its size (the rows of a short one weigh more)."""
    return (lm.sum(1) / m.sum(1).clamp(min=1)).mean() / micro_batches


# ------------------------------------------------------------------------------------- between consecutive steps
def delta_scaled(state: dict, start: dict, scale: float = 1.0 / math.sqrt(LORA_RANK)) -> dict:
    """The weights an engine serves for an adapter trained with rsLoRA when it scales the adapter by α/r instead of
    α/√r: the update since the start shrunk √r times, θ_start + (θ − θ_start)/√r."""
    return {k: start[k] + (v - start[k]) * scale if v.is_floating_point() else v for k, v in state.items()}


def base_discarded(state: dict, start: dict, params: set) -> dict:
    """The weights an engine holds after a deep sleep that discarded its parameters (the buffers kept), woken up with
    only the adapter synced into it: the base weights' memory re-allocated as zeros, plus the update since the
    start, θ − θ_start, for every parameter."""
    return {k: (v - start[k]) if k in params and v.is_floating_point() else v for k, v in state.items()}


def schedule_with_horizon(opt, total: int, position: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The linear decay a resumed run builds over another horizon (`total` optimizer steps) and fast-forwards to the
    restored `position` by stepping it: the rate at the position is the new schedule's, not the run's."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 - k / total)
    for _ in range(position):
        sched.step()
    return sched
