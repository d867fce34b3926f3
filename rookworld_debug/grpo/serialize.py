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


def _not_a_trace(path, why: str):
    from rookworld_debug.errors import TraceError
    steps = sorted(p.name for p in path.glob("step-*") if (p / "trace.json").is_file()) if path.is_dir() else []
    hint = (f"; it holds captured steps {steps}: open one of them, e.g. {path / steps[0]}" if steps else
            "; a trace folder holds trace.json + trace.safetensors (StepTrace.save, rookworld-debug step, or a TRL "
            "capture's step-NNNNNN folder)")
    return TraceError(f"{path} is not a step trace or TRL capture: {why}{hint}")


def read_trace(path, record: str) -> Any:
    """Decode the `record` ("module:Class") saved in folder `path`, refusing anything else with a named error:
    TraceError (not a trace: missing/corrupt files, another record) or IncompatibleTraceError (a TRL capture
    from a TRL version this package does not read)."""
    import json
    from pathlib import Path

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "trace.json").is_file():
        raise _not_a_trace(path, "no trace.json" if path.is_dir() else "no such folder")
    try:
        payload = json.loads((path / "trace.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _not_a_trace(path, f"trace.json is not valid JSON ({err})") from None
    if not isinstance(payload, dict) or payload.get("__record__") != record:
        found = payload.get("__record__") if isinstance(payload, dict) else type(payload).__name__
        raise _not_a_trace(path, f"trace.json holds {found!r}, not {record!r}")
    capture = payload.get("fields", {}).get("capture")
    if capture is not None:
        from rookworld_debug.trl.record import check_compatible
        check_compatible(capture, path)
    if not (path / "trace.safetensors").is_file():
        raise _not_a_trace(path, "trace.json without its trace.safetensors (incomplete copy?)")
    try:
        tensors = load_file(str(path / "trace.safetensors"))
    except (SafetensorError, OSError) as err:
        raise _not_a_trace(path, f"trace.safetensors is unreadable ({err})") from None
    return decode(payload, tensors)
