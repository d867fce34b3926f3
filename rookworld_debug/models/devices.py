"""Torch device names → a usable ``torch.device``, or a named error BEFORE any model is loaded.

torch itself answers a typo ('gpu0') with a bare RuntimeError and a missing CUDA with a bare
AssertionError from deep inside ``model.to``; a user should instead read which field is wrong and why.
"""
from __future__ import annotations

import torch

from rookworld_debug.errors import ConfigError


def check_device(device: str | torch.device, field: str = "device") -> torch.device:
    """The ``torch.device`` for ``device`` if this machine has it; ConfigError(field, ...) otherwise.

    Accepts 'cpu', 'cuda', 'cuda:N', 'mps', 'auto' (cuda if available, else mps, else cpu) or a
    ``torch.device``.
    """
    if isinstance(device, str) and device.strip().lower() == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ConfigError(field, f"not a torch device name: {device!r} (use 'cpu', 'cuda', 'cuda:N', 'mps' or "
                          f"'auto'; torch said: {e})") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = "this torch build has no CUDA support" if torch.version.cuda is None else \
                "no CUDA device is visible (driver / CUDA_VISIBLE_DEVICES?)"
            raise ConfigError(field, f"{device!r} requested but {built}; use device='cpu'")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ConfigError(field, f"{device!r} requested but only {n} CUDA device(s): cuda:0..cuda:{n - 1}")
        return dev
    if dev.type == "mps":
        if not _mps_available():
            raise ConfigError(field, f"{device!r} requested but MPS (Apple GPU) is not available; use device='cpu'")
        return dev
    raise ConfigError(field, f"unsupported device type {dev.type!r} in {device!r}; use 'cpu', 'cuda', 'cuda:N' or "
                      "'mps'")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())
