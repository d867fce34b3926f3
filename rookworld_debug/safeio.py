"""Reading files other people hand you: torch files with tensors and plain values only, as named errors.

A checkpoint folder, a drift-cache entry or an optimizer state may come from someone else. Torch files
are loaded with ``weights_only=True`` (no unpickling of arbitrary objects, so no code runs) and every way
such a load fails (missing, truncated, empty, garbage, a pickle that needs code) is one CheckpointError
naming the file and what was expected in it.
"""
from __future__ import annotations

import pickle
from pathlib import Path

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
