"""Generic (de)serialization of frozen record dataclasses: tensors → safetensors, the rest → JSON.

A record is encoded as {"__record__": "module:Class", "fields": {...}}; a tensor as
{"__tensor__": key} pointing into the safetensors file. Fields that cannot be serialized (models,
tokenizers, optimizers) are declared by the record in `__transient__` and come back as None, so
every view can be re-rendered from the file without a model.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any

import torch


def _encode(obj: Any, tensors: dict, path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        key = path or "root"
        tensors[key] = obj.detach().cpu().clone().contiguous()  # clone: safetensors rejects shared storage
        return {"__tensor__": key}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        transient = set(getattr(obj, "__transient__", ()))
        fields = {}
        for f in dataclasses.fields(obj):
            value = None if f.name in transient else getattr(obj, f.name)
            fields[f.name] = _encode(value, tensors, f"{path}.{f.name}" if path else f.name)
        cls = type(obj)
        return {"__record__": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors, f"{path}.k{i}"), _encode(v, tensors, f"{path}.{i}")]
                             for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, float) and not math.isfinite(obj):
        return {"__float__": repr(obj)}          # JSON has no NaN/inf; keep them exact, never silently 0
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):   # numpy scalars
        return _encode(obj.item(), tensors, path)
    return {"__repr__": repr(obj)}


def _decode(obj: Any, tensors: dict) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__record__" in obj:
        module, _, name = obj["__record__"].partition(":")
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        fields = {k: _decode(v, tensors) for k, v in obj["fields"].items()}
        return cls(**fields)
    if "__dict__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__dict__"]}
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__repr__" in obj:
        return obj["__repr__"]
    return {k: _decode(v, tensors) for k, v in obj.items()}


def encode(record: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    tensors: dict[str, torch.Tensor] = {}
    return _encode(record, tensors, ""), tensors


def decode(payload: Any, tensors: dict[str, torch.Tensor]) -> Any:
    return _decode(payload, tensors)
