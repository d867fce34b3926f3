"""Fitted parameters resolved against the step's own structure: a fit says "the recorded gradient is 0.4903 × the
loss's gradient"; the step says why — 0.4903 = 1130 / 2304 = in-loss tokens / completion tokens with the truncated
rows: the loop's denominator counts rows the loss masks out.

A scale, a learning-rate factor or a term's coefficient is tested against the quantities the step itself defines
(token counts of every mask and subset it has, N, B, G, micro-batches, passes, ranks, β, ε, the temperature, the
clip) and against their inverses, ratios and products. A match counts when it is within the fit's own precision;
several quantities with one value (B = G = 4) are all named, since the step cannot tell them apart; a parameter
that matches none says so, with how many candidates were tried.

Shape legend: N rows (B groups of G), T completion positions per row.

    step_quantities(trace)                      -> tuple[Quantity, ...]
    resolve(value, quantities, rel_tol)         -> Resolution
    resolve_checks(trace, checks)               -> list[PhaseCheck]   (each fitted parameter resolved)
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Optional

import torch

from .consecutive import clip_of
from .records import DISAGREE, PhaseCheck

# a fitted parameter this close to 1 (relatively) is no scale at all
UNIT = 1e-6
# the loosest relative precision a match may have: past it, ~1,000 candidates would match by chance
MAX_REL_TOL = 1e-3
# a scalar total's ratio is known to float32 accumulation precision (a few ulps × the terms summed), relatively
SCALAR_REL_TOL = 1e-4


@dataclass(frozen=True)
class Quantity:
    """A number the step defines."""
    key: str                    # short id ("tokens_in_loss", "G", "beta")
    name: str                   # what it is, for a sentence ("in-loss tokens (Σ completion_mask)")
    value: float
    count: bool = True          # a count of rows or tokens (a denominator), not a coefficient
    unit: str = ""              # "tokens", "rows" or "": a ratio of one unit is a normaliser swapped for another


@dataclass(frozen=True)
class Resolution:
    """A fitted parameter and the step's quantities it equals (`expression` None: none of them)."""
    parameter: str              # "scale", "lr_factor", "KL term (per unit β) / declared", …
    value: float
    expression: Optional[str]   # "1130 / 2304"
    meaning: str                # "in-loss tokens / completion tokens with the truncated rows"
    mechanism: str              # what a loop does to produce it, in the step's own quantities
    rel_error: float            # |value − expression| / |expression|
    tried: int                  # candidate expressions tried
    also: tuple = ()            # other expressions of the same value (the step cannot tell them apart)

    def sentence(self) -> str:
        if self.expression is None:
            return (f"{self.value:.4g} matches none of the step's own quantities ({self.tried} candidates tried: "
                    "token counts, N, B, G, micro-batches, passes, β, ε, temperature, their ratios and products)")
        also = f" (equally {'; '.join(self.also)}: the step cannot tell them apart)" if self.also else ""
        return f"{self.value:.4g} = {self.expression} = {self.meaning}{also}: {self.mechanism}"

    def to_dict(self) -> dict:
        return {"parameter": self.parameter, "value": _num(self.value), "equals": self.expression,
                "meaning": self.meaning, "mechanism": self.mechanism, "rel_error": _num(self.rel_error),
                "candidates_tried": self.tried, "also": list(self.also)}


def _num(x: float):
    return x if math.isfinite(x) else str(x)


# ------------------------------------------------------------------------------------------ the step's quantities
def step_quantities(trace) -> tuple:
    """Every count and coefficient the step defines (values ≤ 0 or = 1 left out: they resolve nothing)."""
    r, c = trace.rollout, trace.config
    mask = r.completion_mask.double()                                       # (N, T)
    n, t = mask.shape
    g = int(r.num_generations) or 1
    trunc = r.is_truncated.bool() if r.is_truncated is not None else torch.zeros(n, dtype=torch.bool)
    with_trunc = mask.clone()
    with_trunc[trunc] = 1.0                                                 # a truncated row runs to T
    tok, rows = dict(unit="tokens"), dict(unit="rows")
    q = [Quantity("N", "N rows", n, **rows), Quantity("B", "B prompts", n // g),
         Quantity("G", "G completions per prompt", g),
         Quantity("T", "T completion positions per row", t, **tok),
         Quantity("NT", "N·T completion positions", n * t, **tok),
         Quantity("tokens_in_loss", "in-loss tokens (Σ completion_mask)", float(mask.sum()), **tok),
         Quantity("tokens_with_truncated", "completion tokens with the truncated rows", float(with_trunc.sum()), **tok),
         Quantity("tokens_truncated", "tokens of the truncated rows", float(with_trunc[trunc].sum()), **tok),
         Quantity("rows_truncated", "truncated rows", float(trunc.sum()), **rows),
         Quantity("rows_ended", "rows that ended (EOS)", float((~trunc).sum()), **rows),
         Quantity("rows_in_loss", "rows with tokens in the loss", float((mask.sum(1) > 0).sum()), **rows),
         Quantity("longest", "the longest in-loss completion", float(mask.sum(1).max()) if n else 0.0, **tok)]
    if float(mask[~trunc].sum()) != float(mask.sum()):      # else one set: every in-loss token is a finished row's
        q.append(Quantity("tokens_ended", "tokens of the rows that ended (EOS)", float(mask[~trunc].sum()), **tok))
    q += _micro_batch_quantities(trace, mask)
    spg = getattr(trace.capture, "steps_per_generation", None) or c.steps_per_generation or 1
    q += [Quantity("mu", "μ passes over the rollout", int(c.num_iterations or 1)),
          Quantity("spg", "steps_per_generation (optimizer steps per generation batch)", int(spg)),
          Quantity("ranks", "ranks", len(getattr(trace.recorded, "rows_by_rank", ()) or ()))]
    q += _coefficients(trace)
    return tuple(x for x in q if math.isfinite(x.value) and x.value > 0 and abs(x.value - 1) > UNIT)


def _micro_batch_quantities(trace, mask) -> list:
    from .loss_phase import accumulation, micro_batches
    k = accumulation(trace)
    out = [Quantity("k", "k micro-batches (gradient_accumulation_steps)", k),
           Quantity("k2", "k² (micro-batches squared)", k * k)]
    chunks = micro_batches(trace)
    if len(chunks) > 1:
        for i, rows in enumerate(chunks):
            out.append(Quantity(f"tokens_mb{i + 1}", f"in-loss tokens of micro-batch {i + 1} (rows {int(rows[0])}–"
                                                     f"{int(rows[-1])})", float(mask[rows].sum()), unit="tokens"))
        out.append(Quantity("rows_mb", "rows per micro-batch", float(len(chunks[0])), unit="rows"))
    for i, (a, b) in enumerate(getattr(trace.recorded, "rows_by_rank", ()) or ()):
        out.append(Quantity(f"tokens_rank{i}", f"in-loss tokens of rank {i} (rows {a}–{b - 1})",
                            float(mask[a:b].sum()), unit="tokens"))
    return out


def _temperature(trace) -> float:
    temps = trace.rollout.temperatures
    return float(temps[0]) if temps is not None and temps.numel() and bool((temps == temps[0]).all()) else math.nan


def _coefficients(trace) -> list:
    c = trace.config
    out = [Quantity("beta", "β", float(c.beta), False), Quantity("beta2", "β²", float(c.beta) ** 2, False),
           Quantity("epsilon", "ε_low (the clip range)", float(c.epsilon_low), False),
           Quantity("temperature", "the temperature", _temperature(trace), False)]
    if c.epsilon_high != c.epsilon_low:
        out.append(Quantity("epsilon_high", "ε_high", float(c.epsilon_high), False))
    clip = clip_of(trace)
    if clip:
        out.append(Quantity("max_grad_norm", "max_grad_norm", float(clip), False))
    return out


# ------------------------------------------------------------------------------------------------- the search
def _candidates(qs: tuple):
    """(level, value, expression, meaning, how, quantities) simplest first: q, 1/q, a/b, a·b."""
    for a in qs:
        yield 1, a.value, f"{_v(a.value)}", a.name, "times", (a,)
        yield 1, 1 / a.value, f"1 / {_v(a.value)}", f"1 / {a.name}", "over", (a,)
    for a, b in permutations(qs, 2):
        if a.value == b.value:                 # a ratio of two equal numbers is 1: it names no normaliser
            continue
        yield 2, a.value / b.value, f"{_v(a.value)} / {_v(b.value)}", f"{a.name} / {b.name}", "ratio", (a, b)
    for a, b in combinations(qs, 2):
        yield 2, a.value * b.value, f"{_v(a.value)} × {_v(b.value)}", f"{a.name} × {b.name}", "product", (a, b)


def _v(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def resolve(value: float, quantities: tuple, rel_tol: float, parameter: str = "scale",
            role: str = "value") -> Resolution:
    """The simplest expression in the step's quantities that equals `value` within `rel_tol` (relative). `role`:
    what the parameter multiplies ("value": the recorded quantity is value × the right one; "coefficient": a loss
    term's coefficient over its declared one), for the mechanism's sentence."""
    tol = min(max(rel_tol, 1e-9), MAX_REL_TOL)
    matches, tried, level_found = [], 0, None
    for level, v, expr, meaning, how, parts in _candidates(quantities):
        tried += 1
        if level_found is not None and level > level_found:
            continue                                     # a simpler match exists: count the rest, keep none
        if math.isfinite(value) and v > 0 and abs(value - v) <= tol * v:
            level_found = level
            matches.append((abs(value - v) / v, expr, meaning, how, parts))
    if not matches:
        return Resolution(parameter, value, None, "", "", math.nan, tried)
    matches.sort(key=_plausibility)
    err, expr, meaning, how, parts = matches[0]
    also = tuple(dict.fromkeys(f"{e} = {m}" for _, e, m, _, _ in matches[1:] if m != meaning))[:4]
    return Resolution(parameter, value, expr, meaning, _mechanism(how, parts, role), err, tried, also)


def _plausibility(match) -> tuple:
    """Of the expressions with one value, the likeliest mechanism first: a known pair of normalisers, then a
    ratio within one unit (tokens ÷ tokens: one count swapped for another), then the closest."""
    err, _, _, how, parts = match
    known = how == "ratio" and (parts[0].key, parts[1].key) in HINTS
    one_unit = how != "ratio" or (parts[0].unit and parts[0].unit == parts[1].unit)
    return (not known, not one_unit, err)


# known pairs of denominators: what a loop does to divide by one where the objective divides by the other
HINTS = {
    ("tokens_in_loss", "tokens_with_truncated"): "the denominator counts the truncated rows' tokens, which the loss "
                                                 "masks out",
    ("tokens_in_loss", "NT"): "the denominator counts every completion position, padding included",
    ("tokens_with_truncated", "tokens_in_loss"): "the numerator keeps the truncated rows the declared objective "
                                                 "masks out",
    ("tokens_ended", "tokens_in_loss"): "only the rows that ended are normalised as declared",
}


def _mechanism(how: str, parts: tuple, role: str) -> str:
    what, are, carry = ("the recorded values", "are", "carry") if role == "value" else ("the term", "is", "carries")
    if how == "ratio":
        a, b = parts
        if a.count and b.count:
            base = (f"{what} {are} divided by {b.name} ({_v(b.value)}) where the declared objective divides by "
                    f"{a.name} ({_v(a.value)})")
            hint = HINTS.get((a.key, b.key))
            return f"{base}: {hint}" if hint else base
        return f"{what} {carry} an extra factor {a.name} / {b.name}"
    if how == "times":
        (a,) = parts
        if a.count:
            return f"a division by {a.name} ({_v(a.value)}) that the declared objective has is missing"
        return f"{what} {carry} an extra factor {a.name} ({_v(a.value)})"
    if how == "over":
        (a,) = parts
        return f"{what} {are} divided by {a.name} ({_v(a.value)}) once more than the declared objective"
    a, b = parts
    return f"{what} {carry} an extra factor {a.name} × {b.name}"


# ------------------------------------------------------------------------------------------ on a replay's checks
def resolve_checks(trace, checks) -> list:
    """Each disagreeing check's fitted parameters resolved (the fit's `resolved` list, the sentence appended to
    its explanation); a total with no fit gets its recorded ÷ recomputed ratio resolved, and a named scale when it
    matches and the gradient does not refute it."""
    qs = step_quantities(trace)
    out = [_resolved(c, qs) if c.status == DISAGREE else c for c in checks]
    return [_refuted(c, out) for c in out]


def _gradient_scale(fit: dict) -> Optional[float]:
    """The one factor a gradient fit found between the recorded gradient and the declared one: a scale fit's, or
    the terms' regression's where every declared term carries the same ratio (None: not a scale)."""
    params = fit.get("params") or {}
    if fit.get("kind") == "scaled" and isinstance(params.get("scale"), (int, float)):
        return float(params["scale"])
    if fit.get("kind") != "terms":
        return None
    ratios = [fd["fitted"] / fd["declared"] for fd in params.values()
              if isinstance(fd, dict) and isinstance(fd.get("declared"), (int, float)) and fd["declared"]]
    return ratios[0] if ratios and all(abs(r - ratios[0]) <= 2e-2 * abs(ratios[0]) for r in ratios) else None


def _refuted(c: PhaseCheck, checks: list) -> PhaseCheck:
    """A loss total named a scale k of the declared loss, unless the loop's gradient disagrees with the declared one
    other than by that same k: a loss scaled by k backpropagates k × the declared gradient, so a gradient that is not
    is evidence against the scale (the value's match to the step's counts was a coincidence of one number)."""
    if c.cause != "loss_scaled" or (c.fit or {}).get("kind") != "scaled":
        return c
    k = float(c.fit["params"]["scale"])
    grad = next((g for g in checks if g.phase == "gradient" and g.status == DISAGREE), None)
    if grad is None:
        return c
    g = _gradient_scale(grad.fit or {})
    if g is not None and abs(g - k) <= 2e-2 * abs(k):           # the terms' regression's 2 %
        return c
    why = (f"the recorded loss is {k:.4g} × the recomputed one, but the recorded gradient is not {k:.4g} × the "
           "declared loss's gradient (the gradient check below), so no scale of the declared loss explains the step; "
           "the ratio matched the step's counts by coincidence of one number")
    return dataclasses.replace(c, cause="", explanation=why,
                               fit={**c.fit, "kind": "ratio", "sentence": "", "refuted_by": "gradient"})


def _resolved(c: PhaseCheck, qs: tuple) -> PhaseCheck:
    if not c.fit and not c.cause and c.samples is not None and c.samples.axes == () and c.samples.total == 1:
        return _total(c, qs)
    if not c.fit:
        return c
    params, kind = c.fit.get("params") or {}, c.fit.get("kind")
    tol = _fit_tol(c.fit.get("residual"))
    found = []
    for name in ("scale", "lr_factor"):
        v = params.get(name)
        if isinstance(v, (int, float)) and math.isfinite(v) and abs(abs(v) - 1) > max(UNIT, tol) and v != 0:
            found.append(resolve(abs(v), qs, tol, name))
    if kind in ("terms", "micro_batches", "carried_over"):
        found += _term_resolutions(params, qs, tol)
    if not found:
        return c
    named = [x for x in found if x.expression is not None]
    said = "; ".join(x.sentence() for x in (named or found))
    return dataclasses.replace(c, fit={**c.fit, "resolved": [x.to_dict() for x in found]},
                               explanation=f"{c.explanation}. {said[0].upper()}{said[1:]}" if c.explanation else said)


def _term_resolutions(params: dict, qs: tuple, tol: float) -> list:
    """Each term whose fitted coefficient is off its declared one: fitted ÷ declared, or the fitted value itself
    where nothing was declared (a term the objective does not have)."""
    out = []
    for term, fd in params.items():
        if not isinstance(fd, dict):
            continue
        a, d = fd.get("fitted"), fd.get("declared")
        if not isinstance(a, (int, float)) or not isinstance(d, (int, float)) or not math.isfinite(a) or abs(a) < 1e-9:
            continue
        if d and abs(abs(a / d) - 1) > 0.02:       # a term of the opposite sign and its size is a sign, not a scale
            out.append(resolve(abs(a / d), qs, max(tol, 1e-4), f"{term}: fitted ÷ declared", "coefficient"))
        elif not d and abs(a) > 1e-6:
            out.append(resolve(abs(a), qs, max(tol, 1e-4), f"{term}: fitted", "coefficient"))
    return out


def _fit_tol(residual) -> float:
    """The relative precision of a fitted scale: its fit's own residual (relative), never below float32 noise."""
    try:
        r = float(residual)
    except (TypeError, ValueError):
        r = math.nan
    return max(3 * r, 1e-6) if math.isfinite(r) else MAX_REL_TOL


def _total(c: PhaseCheck, qs: tuple) -> PhaseCheck:
    """A total that disagrees with no known mechanism: its recorded ÷ recomputed ratio, when the step's
    quantities give it, is a scale fit (a total alone always fits a scale: only a structural match counts)."""
    rec, ours = c.samples.recorded[0], c.samples.recomputed[0]
    if not (math.isfinite(rec) and math.isfinite(ours)) or ours == 0 or rec == 0 or abs(rec / ours - 1) <= UNIT:
        return c
    k = rec / ours
    tol = max(SCALAR_REL_TOL, c.tolerance / abs(ours)) if math.isfinite(c.tolerance) else SCALAR_REL_TOL
    res = resolve(abs(k), qs, tol, "scale")
    if res.expression is None or k < 0:       # the step's counts are positive: a negative ratio is not their scale
        return dataclasses.replace(c, fit={"kind": "ratio", "params": {"scale": k}, "residual": 0.0,
                                           "sentence": "", "resolved": [res.to_dict()] if k > 0 else []})
    sign = "" if k > 0 else "−"
    why = f"the recorded {c.phase} is {sign}{abs(k):.4g} × the recomputed one; {res.sentence()}"
    return dataclasses.replace(c, cause=f"{c.phase}_scaled", explanation=why,
                               fit={"kind": "scaled", "params": {"scale": k}, "residual": 0.0, "sentence": why,
                                    "resolved": [res.to_dict()]})
