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


def usable(device: str) -> bool:
    """True when this machine can run `device` ('same' and 'auto' always can)."""
    from rookworld_debug.errors import ConfigError
    if str(device) in ("same", "auto", "cpu"):
        return True
    try:
        check_device(device)
    except ConfigError:
        return False
    return True


def model_device(model: torch.nn.Module) -> torch.device:
    """The device a model computes on (its first parameter's)."""
    return next(model.parameters()).device


def on_device(record, device: torch.device | str):
    """`record` with every tensor on `device`: a tensor, a frozen dataclass (its tensor fields and the tensors in
    its tuple/list/dict fields, nested records; other fields shared, not copied), or None. Records live on the CPU, where traces
    and views read them; a phase that computes with a model calls this once per record on the way in (to the
    model's device) and once on the way out (to the CPU), so the crossing is one visible line, not scattered
    `.to()` calls. A record already on `device` comes back as it is (no copy)."""
    import dataclasses
    device = torch.device(device)
    if record is None:
        return None
    if isinstance(record, torch.Tensor):
        return record if record.device == device else record.to(device)
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        return record
    moved = {}
    for f in dataclasses.fields(record):
        if not f.init:
            continue
        v = getattr(record, f.name)
        w = _moved_value(v, device)
        if w is not v:
            moved[f.name] = w
    return dataclasses.replace(record, **moved) if moved else record


def _moved_value(v, device: torch.device):
    """`v` with every tensor on `device`, at any depth of records, tuples, lists and dicts; `v` itself (no copy)
    when nothing inside it moved."""
    import dataclasses
    if dataclasses.is_dataclass(v) and not isinstance(v, type):   # a record inside a record
        return on_device(v, device)
    if isinstance(v, torch.Tensor):
        return v if v.device == device else v.to(device)
    if isinstance(v, (tuple, list)):
        items = [_moved_value(x, device) for x in v]
        if all(a is b for a, b in zip(items, v)):
            return v
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)      # a namedtuple keeps its type
    if isinstance(v, dict):
        items = {k: _moved_value(x, device) for k, x in v.items()}
        return v if all(items[k] is x for k, x in v.items()) else type(v)(items) if type(v) is dict else items
    return v


def cpu_state(obj):
    """A state_dict (nested dicts/lists of tensors and plain values) with every tensor copied to the CPU: what a
    checkpoint holds, so it loads on any machine (`load_state_dict` moves it back to the model's device)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_state(v) for v in obj)
    return obj
