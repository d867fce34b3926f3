"""A loaded trace's tensors checked for types and shapes against each other, so a file whose fields are all
present but disagree (a (N, T) mask next to a (N, T + 1) log-prob, a string where a tensor goes) is refused at
load with a TraceError naming the field, instead of failing later inside a view. Every record's fields are held
to their annotations the same way (with `_ITEMS` for the items of a field annotated only `tuple` or `dict`).

Dims: N rows (B prompts × G), T completion tokens, P prompt tokens, B groups, K reward functions. A spec is the
dims of one field, "?" when the field may be None, "+" when more trailing dims follow (top-k), "seq" for a Python
sequence of N items.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections import abc

import torch

from rookworld_debug.errors import TraceError

_TOKENS = ("per_token_logps", "per_token_entropy", "sampling_per_token_logps", "completion_ids", "completion_mask")
SPECS = {
    "rollout": {"prompt_ids": "N P", "prompt_mask": "N P", **{k: "N T" for k in _TOKENS},
                "ref_per_token_logps": "N T ?", "per_token_full_kl": "N T ?", "topk_ids": "N T +", "topk_logps": "N T +",
                "is_truncated": "N", "temperatures": "N", "unique_per_group": "B", "prompts": "seq", "tasks": "seq",
                "completions": "seq", "completion_tokens": "seq"},
    "rewards": {"rewards": "N", "rewards_per_func": "N K"},
    "advantages": {"advantages": "N", "rewards": "N", "group_mean": "B", "group_std": "B", "denominator": "N"},
    "loss": {"completion_mask": "N T", "advantages": "N", "per_token_pg": "N T", "per_token_kl": "N T ?",
             "per_token_loss": "N T", "per_token_ratio": "N T", "per_token_entropy": "N T ?", "is_clipped_low": "N T",
             "is_clipped_high": "N T", "seq_len": "N", "per_seq_pg": "N", "per_seq_kl_loss": "N",
             "per_seq_entropy_term": "N", "per_seq_loss": "N", "per_seq_kl": "N ?", "per_seq_entropy": "N ?",
             "per_seq_ratio": "N", "per_seq_logp": "N", "per_group_pg": "B ?", "per_group_kl_loss": "B ?",
             "per_group_loss": "B ?", "loss": "", "pg_loss": "", "kl_loss": ""},
    "capture": {"old_per_token_logps": "N T ?", "sampling_per_token_logps": "N T ?"},
    "recorded": {"per_token_loss": "N T ?", "old_per_token_logps": "N T ?"},
}


def _check(where: str, value, spec: str, dims: dict) -> None:
    parts = spec.split()
    if not parts:                                   # a total: a number or a 0-dim tensor
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if not (isinstance(value, torch.Tensor) and value.ndim == 0):
            raise TraceError(f"{where}: a scalar expected, found {type(value).__name__} "
                             f"{tuple(getattr(value, 'shape', ()))}")
        return
    if "?" in parts:
        if value is None:
            return
        parts.remove("?")
    if parts == ["seq"]:
        if not isinstance(value, (tuple, list)):
            raise TraceError(f"{where}: a sequence of N items expected, found {type(value).__name__}")
        shape, parts = (len(value),), ["N"]
    else:
        if not isinstance(value, torch.Tensor):
            raise TraceError(f"{where}: a tensor expected, found {type(value).__name__}")
        shape = tuple(value.shape)
    more = "+" in parts
    names = [p for p in parts if p != "+"]
    if len(shape) != len(names) and not (more and len(shape) > len(names)):
        raise TraceError(f"{where}: shape {shape} where ({', '.join(names)}) was expected")
    for name, size in zip(names, shape):
        if dims.setdefault(name, (size, where))[0] != size:
            other = dims[name][1]
            raise TraceError(f"{where}: shape {shape} disagrees with {other} ({name} = {dims[name][0]}, here {size})")


# the record type each typed field of a StepTrace holds (None allowed where the trace may lack the record)
RECORD_FIELDS = {"config": ("StepConfig", False), "setup": ("Setup", False), "rollout": ("Rollout", False),
                 "rewards": ("Rewards", False), "advantages": ("Advantages", False), "loss": ("LossBreakdown", False),
                 "before": ("GreedyEval", True), "before_heldout": ("GreedyEval", True),
                 "update": ("UpdateResult", True), "evaluation": ("Evaluation", True),
                 "capture": ("TRLCapture", True), "recorded": ("RecordedStep", True),
                 "diagnostics": ("SignalNoise", True)}


def _check_record_types(trace, source: str) -> None:
    for name, (kind, optional) in RECORD_FIELDS.items():
        value = getattr(trace, name, None)
        if value is None and optional:
            continue
        if type(value).__name__ != kind:
            raise TraceError(f"{source}: {name} holds a {type(value).__name__}, not a {kind}")
    for name in ("timings", "counts"):
        if not isinstance(getattr(trace, name, None), dict):
            raise TraceError(f"{source}: {name} must be a mapping, found {type(getattr(trace, name, None)).__name__}")
    if not isinstance(trace.flags, (tuple, list)) or not all(isinstance(f, str) for f in trace.flags):
        raise TraceError(f"{source}: flags must be a sequence of strings")


# record fields annotated with a record that a trace may hold as None (a step without them)
_MAY_BE_NONE = {("Setup", "invariants"), ("StepTrace", "before")}
# the type of each item (each value, of a mapping) of a field annotated only `tuple`, `dict` or `object`, which
# the annotation cannot say: a record's name or a plain type, in a tuple with None where an item may be None
_ITEMS = {
    "StepTrace": {"iterations": "IterationRecord", "flags": str, "timings": float, "counts": float},
    "IterationRecord": {"updates": "UpdateResult"}, "Setup": {"heldout": "Sample"},
    "Batch": {"prompts": str, "completions": (str, None), "tasks": str, "indices": int},
    "Rewards": {"breakdowns": ("RewardBreakdown", None), "func_names": str, "weights": float, "format_valid": bool,
                "matches_label": (bool, None), "matches_sf1": (bool, None), "metrics": float},
    "LossBreakdown": {"metrics": float, "flags": str},
    "UpdateResult": {"grad_cosine": float, "per_term_global": float, "counts": int, "rows": int},
    "RecordedStep": {"recorded": str, "missing": str, "explicit": str, "scheduler": float},
    "SignalNoise": {"group_size": ("GroupSizeSweep", None), "entropy": ("EntropyMechanism", None),
                    "gap": ("SamplerTrainerGap", None)},
    "EntropyMechanism": {"clip": "ClipEvents"},
}


def _item(x, kind) -> bool:
    """Whether `x` is of an `_ITEMS` kind."""
    return any(x is None if k is None else type(x).__name__ == k if isinstance(k, str) else _fits(x, k)
               for k in (kind if isinstance(kind, tuple) else (kind,)))


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except NameError:                       # an annotation this module cannot resolve: its fields go unchecked
        return {}


def _fits(v, t) -> bool:
    """Whether `v` is of annotation `t`: containers with their items, an int as a float, anything where the
    annotation is not one of these."""
    origin, args = typing.get_origin(t), [a for a in typing.get_args(t) if a is not Ellipsis]
    if origin in (typing.Union, types.UnionType):
        return any(_fits(v, a) for a in args)
    if t in (int, float):
        return isinstance(v, (int, float) if t is float else int) and not isinstance(v, bool)
    if t in (type(None), str, bool, torch.Tensor):
        return isinstance(v, t)
    if origin in (tuple, list, abc.Sequence) or t in (tuple, list):
        if not isinstance(v, (tuple, list)):
            return False
        if origin is tuple and len(args) > 1 and len(args) == len(typing.get_args(t)):     # a fixed-length tuple
            return len(v) == len(args) and all(map(_fits, v, args))
        return not args or all(_fits(x, args[0]) for x in v)
    if origin in (dict, abc.Mapping) or t is dict:
        return isinstance(v, dict) and (len(args) != 2 or all(_fits(k, args[0]) and _fits(x, args[1])
                                                              for k, x in v.items()))
    return isinstance(v, t) if dataclasses.is_dataclass(t) else True


def _check_fields(rec, source: str, path: str = "") -> None:
    """Every field of `rec`, and of the records it holds, of its annotated type: a value of another type deep in a
    trace (a number where a mapping goes) is refused here by name, not as a crash inside a check or the replay."""
    hints = _hints(type(rec))
    for f in dataclasses.fields(rec):
        v, t, name = getattr(rec, f.name), hints.get(f.name), f"{path}.{f.name}" if path else f.name
        if t is not None and not _fits(v, t) and not (v is None and (type(rec).__name__, f.name) in _MAY_BE_NONE):
            raise TraceError(f"{source}: {name}: a {type(v).__name__} where {t} goes"[:400])
        items = tuple(v.values()) if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else (v,)
        kind = _ITEMS.get(type(rec).__name__, {}).get(f.name)
        bad = [x for x in items if kind is not None and not _item(x, kind)]
        if bad:
            raise TraceError(f"{source}: {name}: holds a {type(bad[0]).__name__} where {kind} goes"[:400])
        for x in items:
            if dataclasses.is_dataclass(x) and not isinstance(x, type):
                _check_fields(x, source, name)


def _check_recorded(rec, source: str) -> None:
    """A recorded step's own fields over their closed ranges: a tampered file is refused by name, not read as
    another step (a format this package does not know, a count below 1, a clip that is not a positive number)."""
    from rookworld_debug.grpo.trace.recorded import PIECES, RECORD_FORMAT
    where = f"{source}: recorded"

    def whole(name, value, least):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise TraceError(f"{where}.{name} must be an integer ≥ {least}, found {value!r}")
    if rec.format != RECORD_FORMAT:
        raise TraceError(f"{where}.format {rec.format!r}: this package reads recorded steps of format {RECORD_FORMAT}")
    whole("gradient_accumulation_steps", rec.gradient_accumulation_steps, 1)
    whole("iteration", rec.iteration, 0)
    if rec.step is not None:
        whole("step", rec.step, 1)
    clip = rec.max_grad_norm
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0
                             or clip == float("inf")):
        raise TraceError(f"{where}.max_grad_norm must be a positive number or null, found {clip!r}")
    if not isinstance(rec.recorded, (tuple, list)) or not all(isinstance(p, str) for p in rec.recorded) \
            or not set(rec.recorded) <= set(PIECES):
        raise TraceError(f"{where}.recorded must list pieces among {list(PIECES)}, found {rec.recorded!r}")
    if rec.weights not in ("", "state/"):
        raise TraceError(f"{where}.weights must be 'state/' or '', found {rec.weights!r}")
    if not isinstance(rec.loss, (int, float)) or isinstance(rec.loss, bool):
        raise TraceError(f"{where}.loss must be a number, found {type(rec.loss).__name__}")


def check_trace(trace, source: str) -> None:
    """TraceError naming the first field whose record type, type or shape disagrees with the others (module doc)."""
    _check_record_types(trace, source)
    _check_fields(trace, source)
    if getattr(trace, "recorded", None) is not None:
        _check_recorded(trace.recorded, source)
    dims: dict = {}
    for record, fields in SPECS.items():
        rec = getattr(trace, record, None)
        if rec is None and record in ("capture", "recorded"):
            continue
        if rec is None:
            raise TraceError(f"{source}: the trace has no {record} record")
        for name, spec in fields.items():
            if hasattr(rec, name):
                _check(f"{source}: {record}.{name}", getattr(rec, name), spec, dims)
    n, b = dims.get("N", (None,))[0], dims.get("B", (None,))[0]
    g = getattr(trace.rollout, "num_generations", None)
    if isinstance(g, int) and not isinstance(g, bool) and b is not None and n is not None and b * g != n:
        raise TraceError(f"{source}: {n} rows are not {b} groups of num_generations = {g}")
    names = getattr(trace.rewards, "func_names", ())
    if not isinstance(names, (tuple, list)):
        raise TraceError(f"{source}: rewards.func_names: a sequence of names expected, found {type(names).__name__}")
    k = len(names)
    if dims.get("K") and dims["K"][0] != k:
        raise TraceError(f"{source}: rewards.rewards_per_func has {dims['K'][0]} columns for {k} reward functions")
    if getattr(trace, "recorded", None) is not None and isinstance(g, int) and n is not None:
        _check_rows_by_rank(getattr(trace.recorded, "rows_by_rank", ()), n, g, f"{source}: recorded.rows_by_rank")


def _check_rows_by_rank(spans, n: int, g: int, where: str) -> None:
    """() for one process, else ≥ 2 (start, stop) spans of whole groups that tile rows 0 … N in rank order."""
    if not isinstance(spans, (tuple, list)):
        raise TraceError(f"{where}: a sequence of (start, stop) pairs expected, found {type(spans).__name__}")
    if not spans:
        return
    ints = all(isinstance(s, (tuple, list)) and len(s) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                    for v in s) for s in spans)
    if not ints or len(spans) < 2:
        raise TraceError(f"{where}: two or more (start, stop) pairs of integers expected, found {spans!r}"[:300])
    stops = [0] + [s[1] for s in spans]
    if any(s[0] != stop or s[1] <= s[0] or (s[1] - s[0]) % max(g, 1) for s, stop in zip(spans, stops)) \
            or stops[-1] != n:
        raise TraceError(f"{where}: {list(map(tuple, spans))[:8]} must tile the {n} rows in order, each rank's "
                         f"span whole groups of num_generations = {g}")
