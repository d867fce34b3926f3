"""What a token strip's colours mean: the per-token metrics it can show (definition, sign, units) and the
colour scale that maps their values to colours (diverging around a neutral value, or sequential; robust
percentile clamps). The strips themselves are in `tokens.py`."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ._style import diverging_rgb, fmt, fmt_signed, hex_rgb, sequential_rgb, NEG_RGB, POS_RGB, SEQ_RGB, NEUTRAL_RGB

__all__ = ["Metric", "METRICS", "ColorScale", "make_scale"]

# ----------------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class Metric:
    """How to colour and explain one per-token quantity.

    scale: "signed" (diverging, centred on 0), "ratio" (diverging on log r, centred on r = 1) or
    "sequential". neutral (sequential only): which end is white: "low" (e.g. KL: 0 = unremarkable)
    or "high" (e.g. logp: 0 = certain). anchor pins the neutral end's value (0 for logp/KL/entropy)
    so "white" means the same in every strip; clamp_lo/clamp_hi bound the automatic range; robust:
    the automatic far end is the batch's 1st (low) / 99th (high) percentile, so the scale fits the model
    (a 50k-vocab model's logps sit near −ln V ≈ −10.8, a trained char model's near 0) and one outlier
    does not wash out the rest; the legend then quotes ln V as the uniform-guess reference.
    """
    key: str
    name: str
    definition: str
    scale: str = "sequential"
    neutral: str = "low"
    anchor: float | None = None
    clamp_lo: float | None = None
    clamp_hi: float | None = None
    unit: str = ""
    robust: bool = False
    # which sign is drawn blue: the ONE colour language of every view is blue = makes this token more likely
    # after the step / lowers the loss. A loss-like metric (pg, loss) lowers the loss when NEGATIVE.
    blue_when: str = "positive"
    meaning: str = ""                   # the legend's words for blue/orange of this metric


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("logp", "policy logp",
           "log π_θ(y_t | x, y_<t): log_softmax(policy logits / T)[sampled token], fp32; "
           "T = sampling temperature. 0 = certain; more negative = more surprising.",
           "sequential", neutral="high", anchor=0.0, unit="nats", robust=True),
    Metric("ref_logp", "reference logp",
           "log π_ref(y_t | x, y_<t): log_softmax(reference logits / T)[sampled token], fp32.",
           "sequential", neutral="high", anchor=0.0, unit="nats", robust=True),
    Metric("old_logp", "old-policy logp",
           "log π_old(y_t | x, y_<t) at sampling time (the behaviour policy), logits / T, fp32.",
           "sequential", neutral="high", anchor=0.0, unit="nats", robust=True),
    Metric("ratio", "importance ratio",
           "r_t = exp(logp_θ − logp_old) per sampled token; coloured on log r (white at r = 1, "
           "blue r > 1, orange r < 1). Outlined = counted as clipped by the loss (is_clipped_low/high). "
           "On-policy at the first inner step old = logp, so r = 1 and no clipping: all white is expected.",
           "ratio", meaning="blue = r > 1: the policy now makes this token more likely than at sampling · "
                            "orange = r < 1: less likely"),
    Metric("log_ratio", "log ratio",
           "log r_t = logp_θ − logp_old per sampled token (0 at the first inner step).", "signed",
           unit="nats", meaning="blue = more likely than at sampling · orange = less likely"),
    Metric("kl", "per-token KL (k3)",
           "per-token k3 KL to the reference = exp(ref − logp) − (ref − logp) − 1, logits / T, "
           "sampled tokens; ≥ 0, 0 when policy = reference.", "sequential", anchor=0.0, unit="nats"),
    Metric("full_kl", "per-token exact KL",
           "exact KL(π_θ ‖ π_ref) at position t over the full vocabulary: "
           "Σ_v p_θ(v)·(log p_θ(v) − log p_ref(v)), logits / T.", "sequential", anchor=0.0,
           unit="nats"),
    Metric("entropy", "per-token entropy",
           "H_t = −Σ_v p_θ(v) log p_θ(v) of the full policy distribution at position t, logits / T.",
           "sequential", anchor=0.0, unit="nats", robust=True),
    Metric("delta_logp", "Δlogp after update",
           "Δlogp_t = logp_after − logp_before of the same sampled token, after the optimizer step, "
           "same batch, logits / T. Blue = became more likely.", "signed", unit="nats",
           meaning="blue = the step made this token more likely · orange = less likely"),
    Metric("adv_x_logp", "advantage × logp",
           "A_i · logp_t: the completion's advantage times the token's policy log-prob "
           "(per-token REINFORCE surrogate, before aggregation; sign shows the push direction).",
           "signed", meaning="blue = A > 0: the step makes this token more likely · orange = A < 0: less likely"),
    Metric("pg", "per-token PG loss",
           "per-token policy-gradient loss −min(r_t·A_i, clip(r_t, 1−ε_low, 1+ε_high)·A_i) before "
           "aggregation (LossBreakdown.per_token_pg). Negative = this token lowers the loss.", "signed",
           blue_when="negative",
           meaning="blue = negative: lowers the loss, the step makes this token more likely · orange = raises it"),
    Metric("loss", "per-token loss",
           "per-token total loss = pg + β·KL − c·entropy before aggregation (LossBreakdown.per_token_loss).",
           "signed", blue_when="negative", meaning="blue = negative: lowers the loss · orange = raises it"),
)}


def _resolve_metric(metric: str | Metric, signed: bool | None, values: np.ndarray,
                    definition: str | None) -> Metric:
    if isinstance(metric, Metric):
        m = metric
    elif metric in METRICS:
        m = METRICS[metric]
    else:
        finite = values[np.isfinite(values)]
        if signed is None:
            signed = bool(finite.size and finite.min() < 0 < finite.max())
        neutral = "high" if finite.size and finite.max() <= 0 else "low"
        m = Metric(str(metric), str(metric), definition or f"{metric} (user-supplied per-token values)",
                   "signed" if signed else "sequential", neutral=neutral)
    if signed is not None and m.scale != "ratio" and (m.scale == "signed") != signed:
        m = replace(m, scale="signed" if signed else "sequential")
    if definition:
        m = replace(m, definition=definition)
    return m


# ----------------------------------------------------------------------------------------- scale
@dataclass(frozen=True)
class ColorScale:
    """Maps a value to a background colour. lo/hi are in the metric's own units (ratio units for r)."""
    kind: str           # "signed" | "ratio" | "sequential"
    lo: float
    hi: float
    neutral: str = "low"
    basis: str = ""     # what set the automatic range, for the legend (e.g. "1st percentile of this batch")
    flip: bool = False  # signed: negative values drawn blue (loss-like metrics: negative = lowers the loss)

    def rgb(self, v: float) -> tuple[int, int, int] | None:
        """None for NaN/inf (drawn striped), else the colour."""
        if v is None or not math.isfinite(v):
            return None
        if self.kind == "signed":
            half = max(abs(self.lo), abs(self.hi))
            return diverging_rgb(0.0 if half == 0 else (-v if self.flip else v) / half)
        if self.kind == "ratio":
            if v <= 0:
                return None
            half = max(abs(math.log(self.lo)), abs(math.log(self.hi)))
            return diverging_rgb(0.0 if half == 0 else math.log(v) / half)
        span = self.hi - self.lo
        if span <= 0:
            return sequential_rgb(0.0)
        t = (v - self.lo) / span if self.neutral == "low" else (self.hi - v) / span
        return sequential_rgb(t)

    def gradient_css(self) -> str:
        n, p, s, w = (hex_rgb(c) for c in (NEG_RGB, POS_RGB, SEQ_RGB, NEUTRAL_RGB))
        if self.kind in ("signed", "ratio"):
            return f"linear-gradient(to right,{p},{w},{n})" if self.flip else f"linear-gradient(to right,{n},{w},{p})"
        return f"linear-gradient(to right,{w},{s})" if self.neutral == "low" else \
            f"linear-gradient(to right,{s},{w})"

    def ticks(self) -> tuple[str, str, str]:
        if self.kind == "signed":
            half = max(abs(self.lo), abs(self.hi))
            return fmt(-half, 3), "0", fmt_signed(half, 3)
        if self.kind == "ratio":
            half = max(abs(math.log(self.lo)), abs(math.log(self.hi)))
            return fmt(math.exp(-half), 4), "1", fmt(math.exp(half), 4)
        return fmt(self.lo, 3), fmt((self.lo + self.hi) / 2, 3), fmt(self.hi, 3)


def make_scale(metric: Metric, values: np.ndarray, vmin: float | None = None,
               vmax: float | None = None, *, vocab_size: int | None = None) -> ColorScale:
    """Colour range from the (unmasked, finite) values, unless vmin/vmax pin it.

    Signed metrics are symmetric around 0 (ratio: around 1 on log scale) so white always means
    exactly zero (r = 1). Sequential metrics with `robust` (logp, entropy) end at the batch's 1st/99th
    percentile; with `vocab_size` the legend also gives ln V (a uniform guess: logp −ln V, entropy ln V).
    """
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if metric.scale == "signed":
        half = max(abs(x) for x in (vmin, vmax) if x is not None) if (vmin is not None or vmax is not None) \
            else (float(np.max(np.abs(v))) if v.size else 0.0)
        pinned = "" if vmin is None and vmax is None else f"colour scale pinned at ±{fmt(half, 3)}"
        return ColorScale("signed", -half, half, basis=pinned, flip=metric.blue_when == "negative")
    if metric.scale == "ratio":
        v = v[v > 0]
        if vmin is not None or vmax is not None:
            half = max(abs(math.log(x)) for x in (vmin, vmax) if x is not None and x > 0)
        else:
            half = float(np.max(np.abs(np.log(v)))) if v.size else 0.0
        return ColorScale("ratio", math.exp(-half), math.exp(half))
    vlo = float(v.min()) if v.size else 0.0
    vhi = float(v.max()) if v.size else 0.0
    basis = ""
    if metric.robust and v.size:
        vlo, vhi = (float(x) for x in np.percentile(v, [1, 99]))
        basis = (f"colour range ends at the {'1st' if metric.neutral == 'high' else '99th'} percentile of these "
                 f"{v.size} tokens ({fmt(vlo if metric.neutral == 'high' else vhi, 4)}); beyond it drawn as it")
        if vocab_size and vocab_size > 1:
            ln_v = math.log(vocab_size)
            basis += (f". Uniform guess over V = {vocab_size}: " + (f"logp = −ln V = {fmt(-ln_v, 4)}"
                      if metric.neutral == "high" else f"entropy = ln V = {fmt(ln_v, 4)} (the maximum)"))
    if metric.neutral == "high":
        hi = vmax if vmax is not None else (metric.anchor if metric.anchor is not None else vhi)
        lo = vmin if vmin is not None else max(vlo, metric.clamp_lo) if metric.clamp_lo is not None else vlo
    else:
        lo = vmin if vmin is not None else (metric.anchor if metric.anchor is not None else vlo)
        hi = vmax if vmax is not None else min(vhi, metric.clamp_hi) if metric.clamp_hi is not None else vhi
    pinned = (vmin is not None) if metric.neutral == "high" else (vmax is not None)
    return ColorScale("sequential", lo, max(hi, lo), metric.neutral, "" if pinned else basis)


