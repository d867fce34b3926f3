"""Reading files other people hand you: torch files with tensors and plain values only, as named errors.

A checkpoint folder, a drift-cache entry or an optimizer state may come from someone else. Torch files
are loaded with ``weights_only=True`` (no unpickling of arbitrary objects, so no code runs) and every way
such a load fails (missing, truncated, empty, garbage, a pickle that needs code) is one CheckpointError
naming the file and what was expected in it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rookworld_debug.errors import CheckpointError


def load_torch(path, what: str):
    """The tensors/plain values saved at ``path`` (CPU); CheckpointError if it cannot be read safely."""
    import torch

    path = Path(path)
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{what}: {path} does not exist") from None
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError, AttributeError, ImportError,
            IndexError, KeyError, TypeError, UnicodeDecodeError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{what}: {path} is not a readable torch file of tensors and plain values "
                              f"({type(err).__name__}: {first})") from None


def check_fits(module, state, what: str, path) -> None:
    """CheckpointError unless ``state`` has exactly ``module``'s parameter names and shapes (checked before
    anything is loaded, so a refused file leaves the module as it was)."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{what}: {path} holds a {type(state).__name__}, not a state dict")
    mine = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    theirs = {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}
    if mine != theirs:
        diff = sorted(set(mine) ^ set(theirs)) or sorted(k for k in mine if mine[k] != theirs[k])
        raise CheckpointError(f"{what}: {path} does not fit this model (first differing parameters: {diff[:3]})")


def _check_optimizer_fits(optimizer, state, what: str, path) -> None:
    """torch checks only the number of parameters per group; a moment of another shape would load and
    fail at the next step, so every saved moment's shape is checked against its parameter here."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    groups = state.get("param_groups")
    saved = [i for g in groups for i in g.get("params", ())] if isinstance(groups, list) else None
    if saved is None or len(saved) != len(params) or not isinstance(state.get("state"), dict):
        raise CheckpointError(f"{what}: {path} is not an optimizer state for this model's {len(params)} parameters")
    shape = dict(zip(saved, (tuple(p.shape) for p in params)))
    for idx, moments in state["state"].items():
        for name, t in (moments.items() if isinstance(moments, dict) else ()):
            if getattr(t, "ndim", 0) and tuple(t.shape) != shape.get(idx):
                raise CheckpointError(f"{what}: {path} does not fit this model (its {name} of parameter {idx} has "
                                      f"shape {tuple(t.shape)}, the parameter {shape.get(idx)})")


def load_state_into(module_or_optimizer, state, what: str, path) -> None:
    """``load_state_dict`` that names the file when the state belongs to another model or optimizer."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{what}: {path} holds a {type(state).__name__}, not a state dict")
    if hasattr(module_or_optimizer, "param_groups"):
        _check_optimizer_fits(module_or_optimizer, state, what, path)
    try:
        module_or_optimizer.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"{what}: {path} does not fit this model ({type(err).__name__}: {first})") from None


def check_input_file(path, flag: str):
    """``path`` as a Path if it is an existing readable file, else ConfigError naming ``flag`` (checked before
    any work starts)."""
    import os

    from rookworld_debug.errors import ConfigError

    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(flag, f"{p} does not exist")
    if not p.is_file():
        raise ConfigError(flag, f"{p} is not a file")
    if not os.access(p, os.R_OK):
        raise ConfigError(flag, f"{p} is not readable")
    return p


def check_output_dir(path, flag: str):
    """``path`` as a Path if it is (or can be created as) a writable folder, else ConfigError naming ``flag``:
    an existing file there, or no write permission on the nearest existing parent."""
    import os

    from rookworld_debug.errors import ConfigError

    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(flag, f"{p} is a file, not a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(flag, f"{probe} (a parent of {p}) is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"cannot write under {probe}")
    return p


def check_output_file(path, flag: str):
    """``path`` as a Path if a file can be written there (its folder is creatable), else ConfigError."""
    from rookworld_debug.errors import ConfigError

    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(flag, f"{p} is a folder, not a file")
    check_output_dir(p.parent, flag)
    return p


# ------------------------------------------------------------------ atomic writes (readers never see a part)
def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part:
    temp file in the same directory, fsync, ``os.replace``, fsync of the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` for text."""
    return atomic_write_bytes(path, text.encode(encoding))


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types from numpy/torch scalars and arrays, dataclasses, paths, tuples and sets.
    Non-finite floats become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (strict JSON has no
    NaN, and dropping them would hide exactly the numbers a debugger is looking for)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(obj, key=repr)]
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return to_jsonable(obj.to_dict())
    if hasattr(obj, "tolist") and callable(obj.tolist):          # numpy / torch arrays and scalars
        return to_jsonable(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):
        return to_jsonable(obj.item())
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def atomic_write_json(path, obj: Any, *, indent: int | None = 2) -> Path:
    """Serialise ``obj`` (via :func:`to_jsonable`) as strict JSON and write it atomically."""
    text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False, ensure_ascii=False)
    return atomic_write_text(path, text + "\n")
