"""Mixed precision of the forwards: bf16 autocast on CUDA with fp32 master weights, as TRL's `bf16=True`.

`StepConfig.autocast`: 'auto' (bf16 autocast when the model is on CUDA in float32, nothing elsewhere),
'bf16' (also on CPU, for testing the path), 'off'. Only the forwards run under autocast; log-softmax,
logsumexp, KL and entropy always run on `logits.float()`, and the optimizer updates the fp32 weights.
The mode travels on the model (`set_autocast`), so every phase function that runs a forward — the
decoding loop, the scoring and training forwards — applies the same one without a new argument.
"""
from __future__ import annotations

import contextlib

import torch

AUTOCAST_MODES = ("auto", "bf16", "off")
_ATTR = "rookworld_autocast"


def set_autocast(mode: str, *models) -> None:
    """Record the autocast mode on each model (read by `autocast_for`)."""
    if mode not in AUTOCAST_MODES:
        from rookworld_debug.errors import ConfigError
        raise ConfigError("autocast", f"unknown {mode!r}; expected one of {list(AUTOCAST_MODES)}")
    for m in models:
        if m is not None:
            setattr(m, _ATTR, mode)


def autocast_dtype(model) -> torch.dtype | None:
    """bf16 when the model's forwards should autocast, else None."""
    mode = getattr(model, _ATTR, "auto")
    p = next(model.parameters())
    if mode == "off" or p.dtype != torch.float32:
        return None
    if mode == "bf16" or p.device.type == "cuda":
        return torch.bfloat16
    return None


def autocast_for(model):
    """The autocast context of `model`'s forwards (a no-op context when none applies)."""
    dtype = autocast_dtype(model)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


SAMPLING_AUTOCAST_MODES = (None, "bf16")


def sampling_autocast(mode, model):
    """The context of the SAMPLING calls (StepConfig.sampling_autocast): 'bf16' → torch.autocast(bf16) on the
    model's device around the generation phase only (sampling loop, its greedy rows and scoring forwards), while
    the update's forwards keep `autocast_for` (fp32 on the CPU) — a real sampler–trainer gap, as a bf16 sampler
    (vLLM) next to an fp32 trainer makes. None → a no-op context."""
    if mode not in SAMPLING_AUTOCAST_MODES:
        from rookworld_debug.errors import ConfigError
        raise ConfigError("sampling_autocast", f"unknown {mode!r}; expected one of {list(SAMPLING_AUTOCAST_MODES)}")
    if mode is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)


def forward_precision(model, sampling: str | None = None) -> dict:
    """How `model`'s forwards run, as the trace records it: {"device", "dtype" (the weights'), "autocast" (bf16 or
    None), "compute" (the matmuls' precision)}. `sampling`: StepConfig.sampling_autocast, for the sampler's row."""
    p = next(model.parameters())
    auto = torch.bfloat16 if sampling == "bf16" else autocast_dtype(model)
    return {"device": str(p.device), "dtype": str(p.dtype).removeprefix("torch."),
            "autocast": None if auto is None else str(auto).removeprefix("torch."),
            "compute": str(auto or p.dtype).removeprefix("torch.")}


def step_precision(policy, reference, sampling: str | None = None) -> dict:
    """{"policy", "reference", "sampler"}: `forward_precision` of each forward a step runs (the sampler is the policy
    under `sampling_autocast` when set)."""
    return {"policy": forward_precision(policy), "reference": forward_precision(reference),
            "sampler": forward_precision(policy, sampling)}
