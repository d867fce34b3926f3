"""Folders that ask for custom code are refused by name before transformers reads them.

transformers runs Python shipped inside a model or tokenizer folder when its config.json or tokenizer_config.json
maps a class to it (`auto_map`), and with `trust_remote_code` unset it asks on stdin ("Do you wish to run the custom
code? [y/N]"): in a command whose stdout is JSON, or one with no terminal, that question is a hang or a corrupted
payload. Every load from a user's or a recorded folder passes `trust_remote_code=False` and calls
`refuse_custom_code` first, so such a folder is a named error, never a question and never code run.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelLoadError

CONFIG_FILES = ("config.json", "tokenizer_config.json")
MAX_CONFIG_BYTES = 64 << 20          # a config past this is not one transformers writes; too large to check


def custom_code(folder) -> str:
    """Why `folder` would need custom code (its config.json or tokenizer_config.json names some: `auto_map`, a
    tokenizer_class, architecture or model_type transformers does not have), else ""."""
    for name in CONFIG_FILES:
        path = Path(folder) / name
        if not path.is_file():                   # absent, a folder or a FIFO: transformers' own error, if any
            continue
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return f"{name} is {path.stat().st_size} bytes, too large to check for custom code"
        why = _asks(_read(path))
        if why:
            return f"{name} {why}"
    return ""


def refuse_custom_code(folder, error=ModelLoadError) -> None:
    """`error(message)` (ModelLoadError by default; TraceError for a recorded step's files) when `folder` asks for
    custom code."""
    why = custom_code(folder)
    if why:
        raise error(f"{folder}: {why}; this package never runs code shipped in a model or tokenizer folder "
                    "(trust_remote_code is off). Save the model and tokenizer with transformers' own classes")


def _read(path: Path):
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError, RecursionError):    # unreadable: transformers' parse names it where it is read
        return None


def _asks(d) -> str:
    if not isinstance(d, dict):
        return ""
    if "auto_map" in d:
        return f"maps classes to custom code (auto_map: {_short(d['auto_map'])})"
    cls = d.get("tokenizer_class")
    if cls is not None and not _tokenizer_class(cls):
        return f"names tokenizer_class {_short(cls)}, which transformers does not have (custom code)"
    archs = d.get("architectures")
    for arch in archs if isinstance(archs, list) else () if archs is None else (archs,):
        if not _transformers_class(arch):
            return f"names architecture {_short(arch)}, which transformers does not have (custom code)"
    kind = d.get("model_type")
    if kind is not None and not _model_type(kind):
        return f"names model_type {_short(kind)}, which transformers does not have (custom code)"
    return ""


def _short(x) -> str:
    return repr(x)[:120]


def _tokenizer_class(name) -> bool:
    from .tokenizer_file import CLASSES
    if not isinstance(name, str) or not name.isidentifier():
        return False
    if name in CLASSES:                       # answered without importing transformers (a second)
        return True
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    # transformers tries the fast variant first, then the name as written
    return any(tokenizer_class_from_name(n) is not None for n in (name, name + "Fast", name.removesuffix("Fast")))


def _transformers_class(name) -> bool:
    import transformers
    if not isinstance(name, str) or not name.isidentifier():
        return False
    try:
        return isinstance(getattr(transformers, name, None), type)
    except Exception:  # noqa: BLE001 - a lazy attribute whose import fails is not a class this version has
        return False


def _model_type(kind) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    return isinstance(kind, str) and kind in CONFIG_MAPPING
