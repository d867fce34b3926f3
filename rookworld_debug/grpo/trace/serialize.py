"""Generic (de)serialization of frozen record dataclasses: tensors → safetensors, the rest → JSON.

A record is encoded as {"__record__": "Class", "fields": {...}}, by its stable name (the class name,
whatever module defines it; version-1 traces wrote "module:Class" and still load); a tensor as
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
        for name in _record_fields(type(obj)):
            value = None if name in transient else getattr(obj, name)
            fields[name] = _encode(value, tensors, f"{path}.{name}" if path else name)
        return {"__record__": type(obj).__qualname__, "fields": fields}
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


# The only places a record type can come from. A name read from a file is looked up in the table built
# from these modules (names written here, in code); nothing is ever imported or called by a name a file
# supplies, so opening a trace is as safe as opening a CSV. Moving a record to another module: change this
# list only; saved traces name records by class name, not by module.
RECORD_MODULES = (
    "rookworld_debug.config", "rookworld_debug.metrics", "rookworld_debug.chess.arbiter",
    "rookworld_debug.chess.engine", "rookworld_debug.chess.formats", "rookworld_debug.chess.rewards",
    "rookworld_debug.data.loaders", "rookworld_debug.models.provenance", "rookworld_debug.grpo.phases.advantages",
    "rookworld_debug.grpo.phases.decoding", "rookworld_debug.grpo.phases.evaluation", "rookworld_debug.grpo.phases.generation",
    "rookworld_debug.grpo.phases.iterations", "rookworld_debug.grpo.objective.loss", "rookworld_debug.grpo.multistep.loop",
    "rookworld_debug.grpo.phases.rewards", "rookworld_debug.grpo.phases.setup", "rookworld_debug.grpo.step",
    "rookworld_debug.grpo.phases.update", "rookworld_debug.grpo.trace.captured", "rookworld_debug.grpo.trace.recorded", "rookworld_debug.grpo.signal.noise",
    "rookworld_debug.grpo.signal.group_size", "rookworld_debug.grpo.signal.entropy_mechanism", "rookworld_debug.grpo.signal.sampler_gap",
)
# Trace version 1 wrote "module:Class" with these modules (frozen: they name where records lived THEN, not
# now); such a name is read as its class name. rookworld_debug.trl.record held TRLCapture before version 1 ended.
V1_MODULES = frozenset((
    "rookworld_debug.config", "rookworld_debug.metrics", "rookworld_debug.chess.arbiter",
    "rookworld_debug.chess.engine", "rookworld_debug.chess.formats", "rookworld_debug.chess.rewards",
    "rookworld_debug.data.loaders", "rookworld_debug.models.provenance", "rookworld_debug.grpo.advantages",
    "rookworld_debug.grpo.decoding", "rookworld_debug.grpo.evaluation", "rookworld_debug.grpo.generation",
    "rookworld_debug.grpo.iterations", "rookworld_debug.grpo.loss", "rookworld_debug.grpo.multistep",
    "rookworld_debug.grpo.rewards", "rookworld_debug.grpo.setup", "rookworld_debug.grpo.step",
    "rookworld_debug.grpo.update", "rookworld_debug.grpo.captured", "rookworld_debug.grpo.diagnostics",
    "rookworld_debug.grpo.group_size", "rookworld_debug.grpo.entropy_mechanism", "rookworld_debug.grpo.sampler_gap",
    "rookworld_debug.trl.record",
))
_RECORDS: dict[str, type] = {}
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def record_types() -> dict[str, type]:
    """Stable name (class name) → class for every dataclass defined in RECORD_MODULES (the closed allowlist)."""
    if not _RECORDS:
        table: dict[str, type] = {}
        for name in RECORD_MODULES:
            mod = importlib.import_module(name)
            for obj in vars(mod).values():
                if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name:
                    if obj.__qualname__ in table:    # two records, one name: a trace could not tell them apart
                        raise RuntimeError(f"record name {obj.__qualname__} is defined in {name} and "
                                           f"{table[obj.__qualname__].__module__}")
                    table[obj.__qualname__] = obj
        _RECORDS.update(table)
    return _RECORDS


def stable_name(name: Any) -> str | None:
    """The stable record name a trace's `__record__` value stands for (a version-1 "module:Class" read as its
    class name when the module is one version 1 wrote), or None for anything else."""
    if not isinstance(name, str):
        return None
    if ":" in name:
        module, _, name = name.partition(":")
        if module not in V1_MODULES:
            return None
    return name if name in record_types() else None


def _record_fields(cls) -> dict:
    """A record's stored fields → whether a file must hold it: its dataclass fields, or its own flat names (a
    StepConfig stores every setting flat, an objective family's too, all with defaults)."""
    if hasattr(cls, "__record_fields__"):
        return dict.fromkeys(cls.__record_fields__(), False)
    return {f.name: f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            for f in dataclasses.fields(cls)}


class _Bad(Exception):
    """A malformed payload; read_trace turns it into a TraceError naming the file."""


def _make_record(obj: dict, tensors: dict, where: str) -> Any:
    name = obj["__record__"]
    stable = stable_name(name)
    cls = record_types()[stable] if stable is not None else None
    if cls is None:
        raise _Bad(f"{where}: record type {name!r} is not one of this package's records")
    fields = obj.get("fields")
    if not isinstance(fields, dict):
        raise _Bad(f"{where}: record {name} without a fields mapping")
    known = _record_fields(cls)
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise _Bad(f"{where}: unknown field(s) {unknown} in record {name} (written by another version?)")
    missing = [n for n, required in known.items() if required and n not in fields]
    if missing:
        raise _Bad(f"{where}: record {name} lacks field(s) {missing}")
    values = {k: _decode(v, tensors, f"{where}.{k}") for k, v in fields.items()}
    try:
        return cls(**values)
    except Exception as err:  # noqa: BLE001 - a record's own validation refusing the file's values
        raise _Bad(f"{where}: record {name} refused its values ({type(err).__name__}: {err})") from None


def _decode(obj: Any, tensors: dict, where: str = "trace") -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, f"{where}.{i}") for i, v in enumerate(obj)]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        key = obj["__tensor__"]
        if not isinstance(key, str) or key not in tensors:
            raise _Bad(f"{where}: tensor {key!r} is not in trace.safetensors")
        return tensors[key]
    if "__record__" in obj:
        return _make_record(obj, tensors, where)
    if "__dict__" in obj:
        items = obj["__dict__"]
        if not isinstance(items, list) or not all(isinstance(kv, list) and len(kv) == 2 for kv in items):
            raise _Bad(f"{where}: a mapping must be a list of [key, value] pairs")
        out = {}
        for i, (k, v) in enumerate(items):
            key = _decode(k, tensors, f"{where}.k{i}")
            try:
                hash(key)
                ok = not isinstance(key, torch.Tensor)
            except TypeError:
                ok = False
            if not ok:
                raise _Bad(f"{where}: mapping key {i} is a {type(key).__name__}, not a plain value")
            out[key] = _decode(v, tensors, f"{where}.{i}")
        return out
    if "__tuple__" in obj:
        if not isinstance(obj["__tuple__"], list):
            raise _Bad(f"{where}: a tuple must be a list")
        return tuple(_decode(v, tensors, f"{where}.{i}") for i, v in enumerate(obj["__tuple__"]))
    if "__float__" in obj:
        if not isinstance(obj["__float__"], str) or obj["__float__"] not in _FLOATS:
            raise _Bad(f"{where}: __float__ {obj['__float__']!r} is not nan, inf or -inf")
        return _FLOATS[obj["__float__"]]
    if "__repr__" in obj:
        return str(obj["__repr__"])
    return {k: _decode(v, tensors, f"{where}.{k}") for k, v in obj.items()}


def encode(record: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    tensors: dict[str, torch.Tensor] = {}
    return _encode(record, tensors, ""), tensors


def decode(payload: Any, tensors: dict[str, torch.Tensor], source: str = "trace") -> Any:
    """The record `payload` describes (record types from the allowlist only); TraceError names what is wrong."""
    from rookworld_debug.errors import TraceError
    try:
        return _decode(payload, tensors, source)
    except _Bad as err:
        raise TraceError(str(err)) from None
    except RecursionError:
        raise TraceError(f"{source}: nested too deeply to be a trace") from None


def _not_a_trace(path, why: str):
    from rookworld_debug.errors import TraceError
    from rookworld_debug.grpo.trace.folder import not_a_trace
    return TraceError(not_a_trace(path, why))


def read_trace(path, record: str, version: int | None = None) -> Any:
    """Decode the `record` (a stable record name, e.g. "StepTrace") saved in folder `path`, refusing anything else with a named error:
    TraceError (not a trace: missing/corrupt files, another record, unknown/missing fields or tensors) or
    IncompatibleTraceError (written by a newer trace `version`, or a TRL capture from a TRL version this
    package does not read)."""
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
    except RecursionError:
        raise _not_a_trace(path, "trace.json is nested too deeply to be a trace") from None
    if not isinstance(payload, dict) or stable_name(payload.get("__record__")) != record:
        found = payload.get("__record__") if isinstance(payload, dict) else type(payload).__name__
        raise _not_a_trace(path, f"trace.json holds {found!r}, not {record!r}")
    fields = payload.get("fields")
    if not isinstance(fields, dict):
        raise _not_a_trace(path, "trace.json has no fields mapping")
    found = fields.get("version", 1)
    if version is not None and (not isinstance(found, int) or isinstance(found, bool) or found > version):
        from rookworld_debug.errors import IncompatibleTraceError
        raise IncompatibleTraceError(f"{path}: trace version {found!r}; this rookworld_debug reads versions 1 up to "
                                     f"{version}: upgrade rookworld_debug to open it")
    if version is not None and found < 1:
        raise _not_a_trace(path, f"trace version {found!r} is no version this package ever wrote (1 … {version})")
    capture = fields.get("capture")
    if capture is not None:
        from rookworld_debug.grpo.trace.captured import check_compatible
        check_compatible(capture, path)
    if not (path / "trace.safetensors").is_file():
        raise _not_a_trace(path, "trace.json without its trace.safetensors (incomplete copy?)")
    try:
        tensors = load_file(str(path / "trace.safetensors"))
    except (SafetensorError, OSError, ValueError) as err:
        raise _not_a_trace(path, f"trace.safetensors is unreadable ({err})") from None
    return decode(payload, tensors, str(path / "trace.json"))
