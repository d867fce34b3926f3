"""Comparisons shared by the replay's phases: where two tensors differ, and which known mechanism (a variant of
the trusted computation) reproduces the recorded values exactly."""
from __future__ import annotations

import math
from typing import Mapping, Optional

import torch

from .records import AGREE, DISAGREE, MAX_SAMPLES, SKIPPED, PhaseCheck, Samples, fmt

# tolerances by the precision the loop's forwards ran in: fp32 recomputes agree to ~1e-6 nats; bf16 to ~1e-2
LOGP_TOL = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 0.5, "float16": 0.2}
# 16-bit forwards of the same weights round apart with a heavy tail (a bf16 step of the embedded model: mean 0.002,
# 99th percentile 0.04, max 0.16 nats): there the max gets a loose bound and the mean a tight one; fp32 keeps the max
MEAN_TOL = {"float32": None, "float64": None, "bfloat16": 0.02, "float16": 0.01}
# the sampler's KV-cached loop against a full forward: fp32 agrees to ~1e-5; 16-bit rounds apart by up to ~0.1 nats
SAMPLER_TOL = {"float32": 1e-3, "float64": 1e-6, "bfloat16": 0.25, "float16": 0.1}
# a log-prob's rounding grows with its size (the chosen logit's distance from the log-sum-exp, both carrying the
# logits' relative error): a token of log-prob −14 recomputes ~1e-4 apart in fp32; the bound is tol + rel·|value|
LOGP_REL = {"float32": 1e-5, "float64": 1e-10, "bfloat16": 0.0, "float16": 0.0}
REL_TOL = {"float32": 1e-3, "float64": 1e-6, "bfloat16": 5e-2, "float16": 2e-2}   # gradient / update, relative
DISTINCT = 10.0              # a variant names a cause only when it is this many tolerances from the trusted value
EXPLAINS = 100.0             # or, a total within a few tolerances, when it reproduces it this many times closer
VALUE_TOL = 1e-5              # rewards, advantages, loss totals (float32 arithmetic of the same inputs)


def skipped(phase: str, quantity: str, why: str) -> PhaseCheck:
    return PhaseCheck(phase=phase, quantity=quantity, status=SKIPPED, explanation=why)


def _where(diff: torch.Tensor, tol: float, unit: str) -> tuple[str, list]:
    """('rows [1, 3]' / 'tokens (row, t) [(0, 5)]', the index tuples) of the entries beyond `tol`, worst first."""
    bad = torch.nonzero(diff > tol)
    order = diff[tuple(bad.T)].argsort(descending=True) if bad.numel() else bad
    idx = [tuple(int(v) for v in bad[i]) for i in order.tolist()][:6]
    count = int(bad.shape[0])
    if diff.ndim == 1:
        return f"{count} of {diff.numel()} {unit}s, e.g. {unit}s {[i[0] for i in idx]}", idx
    return f"{count} of {diff.numel()} tokens, e.g. (row, t) {idx}", idx


def compare(phase: str, quantity: str, recorded: torch.Tensor, recomputed: torch.Tensor, tol: float, *,
            mask: Optional[torch.Tensor] = None, unit: str = "row",
            variants: Optional[Mapping[str, tuple]] = None, mean_tol: Optional[float] = None,
            fit=None, rel: float = 0.0) -> PhaseCheck:
    """Recorded vs recomputed, elementwise (where `mask` is 1). `variants`: {code: (values, sentence)} — known
    mechanisms; the first that reproduces the recorded values within `tol` names the cause. `fit(rec, ref, mask,
    tol) -> Fit | None`: the generic fits (fits.py) tried when no variant does. `mean_tol`: also hold the mean
    |difference| to it (16-bit recomputes: a loose max, a tight mean). `rel`: each element's bound is
    tol + rel·|recomputed| (log-probs, whose rounding grows with their size)."""
    rec, ref = recorded.double(), recomputed.double()
    if rec.shape != ref.shape:
        return PhaseCheck(phase, quantity, DISAGREE, math.inf, tol, f"shape {tuple(rec.shape)}",
                          "", f"shape {tuple(ref.shape)}", explanation="the recorded tensor has another shape")
    both_nan = torch.isnan(rec) & torch.isnan(ref)
    diff = (rec - ref).abs().masked_fill(both_nan, 0.0).nan_to_num(nan=math.inf)
    if mask is not None:
        diff = diff.masked_fill(mask == 0, 0.0)        # not ×: an inf or NaN outside the mask is no difference
    worst = float(diff.max()) if diff.numel() else 0.0
    mean = float(diff.sum() / mask.sum().clamp(min=1)) if mask is not None else float(diff.mean()) \
        if diff.numel() else 0.0
    over = diff if rel == 0 else diff * (diff > tol + rel * ref.abs().nan_to_num(0.0))   # beyond each one's bound
    if float(over.max() if over.numel() else 0.0) <= tol and (mean_tol is None or mean <= mean_tol):
        return PhaseCheck(phase, quantity, AGREE, worst, tol)
    where, idx = _where(over, tol if worst > tol else mean_tol, unit)
    code, sentence = match_variant(rec, variants or {}, tol, mask, trusted=ref)
    found = fit(rec, ref, None if mask is None else mask.double(), tol) if fit is not None and not code else None
    if found is not None:
        code, sentence = f"{phase}_{found.kind}", found.sentence
    axes = ("row",) if diff.ndim == 1 else ("row", "token") if diff.ndim == 2 else ("element",)
    return PhaseCheck(phase, quantity, DISAGREE, worst, tol, where, fmt([float(rec[i]) for i in idx]),
                      fmt([float(ref[i]) for i in idx]), code, sentence,
                      fit=found.to_dict() if found is not None else None,
                      samples=take_samples(rec, ref, diff, tol if worst > tol else mean_tol, axes=axes, mask=mask))


def take_samples(rec: torch.Tensor, ref: torch.Tensor, diff: torch.Tensor, threshold: float, *, axes: tuple,
                 mask: Optional[torch.Tensor] = None, parameter: str = "") -> Samples:
    """MAX_SAMPLES of the compared elements (all when fewer): the worst quarter by |difference|, then an even
    spread over the rest, in index order; and the positions beyond `threshold`, worst first."""
    inside = torch.ones_like(diff, dtype=torch.bool) if mask is None else mask.bool().expand_as(diff)
    flat = torch.nonzero(inside.reshape(-1)).flatten()                      # (M,) compared elements
    d = diff.reshape(-1)[flat]
    if flat.numel() <= MAX_SAMPLES:
        pick, how = flat, f"all {flat.numel()} compared values"
    else:
        worst = d.argsort(descending=True)[:MAX_SAMPLES // 4]
        rest = torch.ones_like(d, dtype=torch.bool)
        rest[worst] = False
        others = torch.nonzero(rest).flatten()
        spread = others[torch.linspace(0, others.numel() - 1, MAX_SAMPLES - worst.numel()).long()]
        pick = flat[torch.cat([worst, spread]).sort().values]
        how = (f"{MAX_SAMPLES} of {flat.numel()} compared values: the {worst.numel()} farthest apart and an even "
               "spread over the rest")
    bad = torch.nonzero((diff.reshape(-1) > threshold) & inside.reshape(-1)).flatten()
    bad = bad[diff.reshape(-1)[bad].argsort(descending=True)][:MAX_SAMPLES]

    def at(ix):                         # torch.unravel_index, without its import of torch's symbolic shapes
        out, rest = [], ix
        for size in reversed(diff.shape):
            out.append(rest % size)
            rest = rest // size
        return tuple(tuple(int(v) for v in k) for k in reversed(out))
    pos = tuple(zip(*at(pick))) if pick.numel() else ()
    return Samples(recorded=tuple(rec.reshape(-1)[pick].tolist()), recomputed=tuple(ref.reshape(-1)[pick].tolist()),
                   positions=pos, axes=axes, beyond=tuple(zip(*at(bad))) if bad.numel() else (),
                   n_beyond=int(((diff > threshold) & inside).sum()), total=int(flat.numel()),
                   threshold=float(threshold), parameter=parameter, picked=how)


def parameter_samples(recorded: Mapping, recomputed: Mapping, name: str, rel_tol: float) -> Optional[Samples]:
    """The elements of one parameter's recorded and recomputed tensors (the worst parameter of a gradient or an
    update); an element is beyond when it differs by more than `rel_tol` × the largest recomputed |value|."""
    if name not in recorded or name not in recomputed:
        return None
    rec, ref = recorded[name].double().reshape(-1), recomputed[name].double().reshape(-1)
    if rec.shape != ref.shape:
        return None
    diff = (rec - ref).abs().nan_to_num(nan=math.inf)
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    return take_samples(rec, ref, diff, rel_tol * scale, axes=("element",), parameter=name)


def total_samples(recorded: float, recomputed: float, bound: float) -> Samples:
    """A total's one recorded and one recomputed value."""
    return Samples(recorded=(float(recorded),), recomputed=(float(recomputed),), positions=((),), axes=(),
                   beyond=((),), n_beyond=1, total=1, threshold=float(bound), picked="the step's total")


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: Optional[torch.Tensor]) -> float:
    d = (a.double() - b.double()).abs().nan_to_num(nan=math.inf)
    if mask is not None:
        d = d.masked_fill(mask == 0, 0.0)
    return float(d.max()) if d.numel() else 0.0


def match_variant(rec: torch.Tensor, variants: Mapping[str, tuple], tol: float,
                  mask: Optional[torch.Tensor] = None, trusted: Optional[torch.Tensor] = None) -> tuple[str, str]:
    """(code, sentence) of the first variant whose values reproduce `rec` within `tol` AND differ from the trusted
    values by more than `DISTINCT` × tol (a variant the data cannot tell from the right answer explains nothing;
    a sentence may be a callable: a fitted parameter it names is known only once its values are computed),
    else ("", "")."""
    for code, (values, sentence) in variants.items():
        try:
            v = values() if callable(values) else values
        except (RuntimeError, ValueError, IndexError):   # a forward the model refuses (an unsupported mask, positions
            # past its table): explains nothing
            continue
        if v is None or tuple(v.shape) != tuple(rec.shape):
            continue
        if trusted is not None and _max_diff(v, trusted, mask) <= DISTINCT * tol:
            continue
        if _max_diff(rec, v, mask) <= tol:            # "code/variant": one cause, several ways to reach it
            return code.split("/")[0], sentence() if callable(sentence) else sentence
    return "", ""


def _total_variant(recorded: float, recomputed: float, gap: float, bound: float, tol: float,
                   variants: Mapping[str, tuple]) -> tuple[str, str]:
    """(code, sentence) of the variant that reproduces a total: the first within tolerance and DISTINCT
    tolerances from the trusted value; else, for a disagreement within a few tolerances, the one variant that
    reproduces it EXPLAINS × closer than the trusted value does (and no other comes within DISTINCT × of it)."""
    near = []
    for c, (v, s) in variants.items():
        v = v() if callable(v) else v
        if v is None or not math.isfinite(float(v)):
            continue
        miss = abs(recorded - float(v))
        if miss > tol * max(1.0, abs(float(v))):
            continue
        if abs(float(v) - recomputed) > DISTINCT * bound:
            return c.split("/")[0], s
        if miss * EXPLAINS <= gap:
            near.append((miss, c.split("/")[0], s))
    near.sort(key=lambda x: x[0])
    rivals = {code for miss, code, _ in near if miss <= DISTINCT * max(near[0][0], 1e-300)} if near else set()
    return (near[0][1], near[0][2]) if len(rivals) == 1 else ("", "")   # two causes as close: neither is named


def scalar(phase: str, quantity: str, recorded: float, recomputed: float, tol: float,
           variants: Optional[Mapping[str, tuple]] = None) -> PhaseCheck:
    """A total: |recorded − recomputed| ≤ tol · max(1, |recomputed|)."""
    bound = tol * max(1.0, abs(recomputed))
    d = abs(recorded - recomputed) if math.isfinite(recorded) or math.isfinite(recomputed) else 0.0
    if not math.isfinite(d):
        d = math.inf
    if d <= bound:
        return PhaseCheck(phase, quantity, AGREE, d, bound)
    code, sentence = _total_variant(recorded, recomputed, d, bound, tol, variants or {})
    return PhaseCheck(phase, quantity, DISAGREE, d, bound, "the step's total", fmt(recorded), fmt(recomputed),
                      code, sentence, samples=total_samples(recorded, recomputed, bound))


def tol_for(table: dict, dtype: str) -> float:
    return table.get(str(dtype).removeprefix("torch."), table["float32"])


__all__ = ["AGREE", "DISAGREE", "SKIPPED", "compare", "scalar", "skipped", "match_variant", "tol_for",
           "LOGP_REL", "LOGP_TOL", "REL_TOL", "VALUE_TOL"]
