"""Generic fits: what transformation of the right answer the recorded values are.

A bug in a loop's data phase rarely has a signature of its own, but its output is almost always a simple function
of the right output: the same values in another row order, scaled or negated, shifted by a token, clamped, rounded
to another precision, or standardised over another grouping. Each fit below has few parameters, fitted from the
data; it counts only when it reproduces the recorded values within the phase's tolerance (the right answer does
not: the phase already disagrees). They are tried in order of simplicity; the first that holds is the cause.

Shape legend: N rows (B groups of G), T completion tokens. `rec` and `ref` are float64, (N,) or (N, T); `mask`
(N, T) or None.

    value_fits(g)(rec, ref, mask, tol) -> Optional[Fit]
    token_fits(...)                    -> the same, for the token-aligned tensors (masks, log-probs)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class Fit:
    """A transformation of the trusted values that reproduces the recorded ones."""
    kind: str                   # "negated", "scaled", "affine", "shifted", "permuted", "other_rows", "clamped", …
    params: dict = field(default_factory=dict)   # the fitted parameters (scale, shift, permutation, bounds, dtype)
    residual: float = math.nan  # max |recorded − fitted| where compared
    sentence: str = ""          # the transformation in one sentence, with its parameters

    def to_dict(self) -> dict:
        return {"kind": self.kind, "params": {k: _plain(v) for k, v in self.params.items()},
                "residual": _plain(self.residual), "sentence": self.sentence}


def _plain(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _resid(rec, fitted, mask) -> float:
    d = (rec - fitted).abs().nan_to_num(nan=math.inf)
    if mask is not None:
        d = d.masked_fill(mask == 0, 0.0)
    return float(d.max()) if d.numel() else 0.0


def _w(mask, like):
    return torch.ones_like(like) if mask is None else mask.to(like.dtype)


def _sign(rec, ref, mask, tol, g):
    r = _resid(rec, -ref, mask)
    return Fit("negated", {"sign": -1}, r, "the recorded values are the right ones negated") if r <= tol else None


def _scale(rec, ref, mask, tol, g):
    w = _w(mask, ref)
    den = float((w * ref * ref).sum())
    if den == 0:
        return None
    k = float((w * rec * ref).sum()) / den
    r = _resid(rec, k * ref, mask)
    if r <= tol and abs(k - 1) > 1e-6 and abs(k + 1) > 1e-6:
        return Fit("scaled", {"scale": k}, r, f"the recorded values are {k:.6g} × the right ones")
    return None


def _affine(rec, ref, mask, tol, g):
    """rec = a·ref + b over the whole batch (a shift of a baseline, a missing division)."""
    w = _w(mask, ref)
    n = float(w.sum())
    if n < 4:
        return None
    mx, my = float((w * ref).sum()) / n, float((w * rec).sum()) / n
    var = float((w * (ref - mx) ** 2).sum())
    if var == 0:
        return None
    a = float((w * (ref - mx) * (rec - my)).sum()) / var
    b = my - a * mx
    r = _resid(rec, a * ref + b, mask)
    if r <= tol and abs(b) > tol:
        return Fit("affine", {"scale": a, "offset": b}, r,
                   f"the recorded values are {a:.6g} × the right ones + {b:.6g}")
    return None


def _shift(rec, ref, mask, tol, g):
    """Token-aligned tensors: recorded position t holds the right value of position t − s."""
    if rec.ndim != 2:
        return None
    t = rec.shape[1]
    for s in (1, -1, 2, -2):
        moved = torch.roll(ref, s, 1)
        keep = torch.ones_like(rec)
        if s > 0:
            keep[:, :s] = 0
        else:
            keep[:, t + s:] = 0
        m = keep if mask is None else keep * (mask.to(keep.dtype) + torch.roll(mask.to(keep.dtype), s, 1)).clamp(max=1)
        r = _resid(rec, moved, m)
        if r <= tol:
            return Fit("shifted", {"tokens": s}, r, f"the recorded values are the right ones shifted by {s} token(s) "
                                                     f"({'later' if s > 0 else 'earlier'} positions)")
    return None


def _row_key(x, mask):
    return x if mask is None else x.masked_fill(mask == 0, 0.0)


def _permutation(rec, ref, mask, tol, g):
    """Each recorded row is some right row: a permutation (which one) or a many-to-one map (other rows' values)."""
    n = rec.shape[0]
    a, b = _row_key(rec, mask), _row_key(ref, None if mask is None else mask)
    flat_a, flat_b = a.reshape(n, -1), b.reshape(n, -1)
    close = (flat_a[:, None, :] - flat_b[None, :, :]).abs().nan_to_num(nan=math.inf).amax(-1) <= tol   # (N, N)
    if not bool(close.any(1).all()):
        return None
    source = _assign(close)
    if source == list(range(n)):               # the rows are where they belong: what differs is not their order
        return None
    if source is None:                         # no one-to-one map: some right rows used twice
        src = close.int().argmax(1).tolist()
        return Fit("other_rows", {"source_rows": src[:16]}, 0.0,
                   f"each recorded row holds another row's right values (row i ← row {src[:8]}…): not a "
                   "permutation, some rows' values are repeated")
    return Fit("permuted", {"source_rows": source[:16], "layout": _layout(source, g)}, 0.0,
               f"the recorded values are the right ones in another row order ({_layout(source, g)}; row i holds "
               f"row {source[:8]}{'…' if n > 8 else ''}'s value)")


def _assign(close: torch.Tensor) -> Optional[list]:
    """A one-to-one map row → source row with close[i, src[i]], preferring the identity, else None (greedy on the
    rows with the fewest candidates; exact for the layouts a loop produces)."""
    n = close.shape[0]
    src, used = [None] * n, set()
    for i in sorted(range(n), key=lambda i: int(close[i].sum())):
        cands = [j for j in torch.nonzero(close[i]).flatten().tolist() if j not in used]
        if not cands:
            return None
        j = i if i in cands else cands[0]
        src[i] = j
        used.add(j)
    return src


def _layout(src: list, g: int) -> str:
    n = len(src)
    for s in range(1, n):
        if all(src[i] == (i - s) % n for i in range(n)):
            return f"rolled by {s} row(s)"
    b = n // g if g else 0
    if b > 1 and all(src[i] == (i % b) * g + i // b for i in range(n)):
        return "prompt-major (stride B) instead of grouped"
    if g and all(src[i] // g == i // g for i in range(n)):
        return "permuted within each group"
    return "permuted across groups"


def _clamp(rec, ref, mask, tol, g):
    w = _w(mask, ref).bool()
    if not bool(w.any()):
        return None
    lo, hi = float(rec[w].min()), float(rec[w].max())
    r = _resid(rec, ref.clamp(lo, hi), mask)
    if r <= tol and (float(ref[w].min()) < lo - tol or float(ref[w].max()) > hi + tol):
        return Fit("clamped", {"min": lo, "max": hi}, r, f"the recorded values are the right ones clamped to "
                                                          f"[{lo:.6g}, {hi:.6g}]")
    return None


def _rounded(rec, ref, mask, tol, g):
    """Every recorded value is representable in a 16-bit type and within half a unit in its last place (plus the
    phase's tolerance: the right values are a recompute) of the right value."""
    for dt, mantissa in ((torch.bfloat16, 8), (torch.float16, 11)):
        if not bool(torch.equal(_row_key(rec, mask), _row_key(rec.to(dt).double(), mask))):
            continue
        half_ulp = ref.abs().clamp(min=1e-30).log2().floor().exp2() * 2.0 ** (-mantissa)   # (…) half a unit
        d = (rec - ref).abs()
        d = d if mask is None else d.masked_fill(mask == 0, 0.0)
        if bool((d <= half_ulp + tol).all()):
            name = str(dt).removeprefix("torch.")
            return Fit("rounded", {"dtype": name}, _resid(rec, ref.to(dt).double(), mask),
                       f"the recorded values are the right ones rounded to {name} (each representable in {name} "
                       "and within half a unit in its last place)")
    return None


def _integer(rec, ref, mask, tol, g):
    """Every recorded value a whole number where the right ones are not, and the right ones truncated toward zero,
    floored or rounded within the tolerance: the values were written into an integer tensor or cast by int()."""
    w = _w(mask, ref).bool()
    if not bool(w.any()) or not bool((rec[w] == rec[w].round()).all()) or bool((ref[w] == ref[w].round()).all()):
        return None
    for kind, op, said in (("truncated_to_integer", torch.trunc, "truncated toward zero"),
                           ("floored_to_integer", torch.floor, "floored"),
                           ("rounded_to_integer", torch.round, "rounded")):
        r = _resid(rec, op(ref), mask)
        if r <= tol:
            return Fit(kind, {"operation": said}, r, f"the recorded values are the right ones {said} to whole "
                                                     "numbers: they were written into an integer tensor (or cast "
                                                     "by int()), which drops the fraction")
    return None


def _per_group_affine(rec, ref, mask, tol, g):
    """rec = a_k·ref + b_k within each set of a grouping (statistics taken over another grouping)."""
    if rec.ndim != 1 or not g or rec.numel() % g:
        return None
    n, b = rec.numel(), rec.numel() // g
    layouts = {"each group of G rows": torch.arange(n) // g}
    if b > 1:
        layouts["each stride-B set (rows i, i + B, …)"] = torch.arange(n) % b
    for name, key in layouts.items():
        sizes = torch.bincount(key)
        if int(sizes.min()) < 3:                # more points than the 2 parameters, else it always fits
            continue
        fitted = torch.empty_like(ref)
        for k in range(int(key.max()) + 1):
            sel = key == k
            x, y = ref[sel], rec[sel]
            var = float(((x - x.mean()) ** 2).sum())
            a = float(((x - x.mean()) * (y - y.mean())).sum()) / var if var > 0 else 0.0
            fitted[sel] = a * x + (y.mean() - a * x.mean())
        r = _resid(rec, fitted, None)
        if r <= tol and _resid(fitted, ref, None) > tol:
            return Fit("affine_per_set", {"grouping": name}, r, f"the recorded values are an affine map of the right "
                                                                 f"ones within {name}: statistics over another grouping")
    return None


VALUE_FITS = (_integer, _sign, _scale, _permutation, _shift, _affine, _clamp, _rounded, _per_group_affine)


# the fits that keep every value where it was and change only how it is stored: a loop's own formula of the same
# values could not produce them by chance (each recorded value must be the right one to within a rounding)
STORAGE_FITS = (_integer, _rounded)


def value_fits(g: int, fits: tuple = VALUE_FITS) -> Callable:
    """The fit function `compare` calls on a disagreement: the first generic fit of `fits` that holds, else None."""
    def fit(rec, ref, mask, tol) -> Optional[Fit]:
        for f in fits:
            got = f(rec, ref, mask, tol, g)
            if got is not None:
                return got
        return None
    return fit


def token_fits(want, g: Optional[int]) -> Callable:
    """The fits for a token mask: a shift (the mask one token late or early)."""
    def fit(rec, ref, mask, tol) -> Optional[Fit]:
        return _shift(rec, ref, None, tol, g)
    return fit
