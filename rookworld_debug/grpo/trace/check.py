"""A loaded trace's tensors checked for types and shapes against each other, so a file whose fields are all
present but disagree (a (N, T) mask next to a (N, T + 1) log-prob, a string where a tensor goes) is refused at
load with a TraceError naming the field, instead of failing later inside a view.

Dims: N rows (B prompts × G), T completion tokens, P prompt tokens, B groups, K reward functions. A spec is the
dims of one field, "?" when the field may be None, "+" when more trailing dims follow (top-k), "seq" for a Python
sequence of N items.
"""
from __future__ import annotations

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
    if not isinstance(rec.recorded, (tuple, list)) or not set(rec.recorded) <= set(PIECES):
        raise TraceError(f"{where}.recorded must list pieces among {list(PIECES)}, found {rec.recorded!r}")
    if rec.weights not in ("", "state/"):
        raise TraceError(f"{where}.weights must be 'state/' or '', found {rec.weights!r}")
    if not isinstance(rec.loss, (int, float)) or isinstance(rec.loss, bool):
        raise TraceError(f"{where}.loss must be a number, found {type(rec.loss).__name__}")


def check_trace(trace, source: str) -> None:
    """TraceError naming the first field whose record type, type or shape disagrees with the others (module doc)."""
    _check_record_types(trace, source)
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
