"""The sampler's weights as an affine mix of the run's start and its update: a sync that serves other weights than
θ = θ_after(k) but a fixed combination of θ_start (the reference, the weights the run started from) and the update
since the start, θ − θ_start. Over every parameter that differs from θ, together, the least-squares fit

    sampler ≈ a·θ_start + c·(θ − θ_start)                                 (two scalars)

is accepted when its residual is within the sampler check's own bound, and named by (a, c):

    a = 1, c = 2      sampler_weights_extrapolated     the update merged into weights already holding it
    a = 0, c = 1      sampler_base_weights_discarded   the base weights zeroed, only the update (an adapter) synced
    a = 1, other c    sampler_update_scaled            the update served at c of its size (c said as 1/√r, 1/r, 2,
                                                       1/2 where it is one: an rsLoRA scale α/√r read as α/r)

a or c "is" a value when moving it there changes the fitted weights by at most the bound (|a − x|·‖θ_start‖,
|c − x|·‖θ − θ_start‖). Other (a, c) name nothing.

    AffineFit(got, due, start, names, bound, unit).named(code) -> (weights, sentence) or None
"""
from __future__ import annotations

import math
from typing import Optional

import torch

AFFINE_CODES = ("sampler_weights_extrapolated", "sampler_base_weights_discarded", "sampler_update_scaled")


def simple_forms() -> list:
    """[(value, text)]: 1/√r, then 1/r, for r a power of two up to 256, then 2 and 1/2."""
    powers = [2 ** e for e in range(1, 9)]
    return [(1.0 / math.sqrt(r), f"1/√{r}") for r in powers] + [(1.0 / r, f"1/{r}") for r in powers] + \
        [(2.0, "2"), (0.5, "1/2")]


def fit_affine(got: dict, due: dict, start: dict, names) -> Optional[dict]:
    """The least-squares (a, c) of got ≈ a·start + c·(due − start) over the parameters where got differs from due,
    with the residual's L2 norm and the norms that size a and c; None when nothing differs or the update is zero."""
    moved = [n for n in names if not torch.equal(got[n], due[n].to(got[n].dtype))]
    if not moved:
        return None
    uu = uv = vv = gu = gv = 0.0
    for n in moved:
        s, g = start[n].double(), got[n].double()
        v = due[n].double() - s
        uu, uv, vv = uu + float((s * s).sum()), uv + float((s * v).sum()), vv + float((v * v).sum())
        gu, gv = gu + float((g * s).sum()), gv + float((g * v).sum())
    det = uu * vv - uv * uv
    if uu <= 0 or vv <= 0 or det <= 1e-12 * uu * vv:
        return None
    a, c = (gu * vv - gv * uv) / det, (gv * uu - gu * uv) / det
    resid = math.sqrt(sum(float((got[n].double() - a * start[n].double() - c * (due[n].double() - start[n].double()))
                                .pow(2).sum()) for n in moved))
    return {"a": a, "c": c, "residual": resid, "start_norm": math.sqrt(uu), "update_norm": math.sqrt(vv),
            "moved": moved}


class Affine(dict):
    """a·start + c·(θ − start) on the `moved` parameters, θ elsewhere, each computed when read."""

    def __init__(self, weights: dict, start: dict, a: float, c: float, moved):
        super().__init__()
        self.w, self.start, self.a, self.c, self.moved = weights, start, a, c, set(moved)

    def __contains__(self, name) -> bool:
        return name in self.w and name in self.start

    def __getitem__(self, name):
        w = self.w[name]
        if name not in self.moved:
            return w
        s = self.start[name].to(w.dtype)
        return self.a * s + self.c * (w - s)


class AffineFit:
    """The fit of the module doc between the sampler's weights `got` and the synced ones `due`, made when first
    asked; `fit` is the accepted fit's record (for the check's evidence), else None."""

    def __init__(self, got: dict, due: dict, start: Optional[dict], names, bound: float, unit: float):
        self.got, self.due, self.start, self.names, self.bound, self.unit = got, due, start, tuple(names), bound, unit
        self.done, self.result, self.fit = False, None, None

    def _solve(self) -> Optional[tuple]:
        """(code, a, c, forms text) of the accepted fit, or None."""
        if self.done:
            return self.result
        self.done = True
        if self.start is None or any(n not in self.start for n in self.names):
            return None
        f = fit_affine(self.got, self.due, self.start, self.names)
        if f is None or f["residual"] > self.bound:
            return None

        def near(v, x, norm) -> bool:
            return abs(v - x) * norm <= self.bound
        a, c = f["a"], f["c"]
        if near(a, 1.0, f["start_norm"]) and near(c, 2.0, f["update_norm"]):
            code, a, c = AFFINE_CODES[0], 1.0, 2.0
        elif near(a, 0.0, f["start_norm"]) and near(c, 1.0, f["update_norm"]):
            code, a, c = AFFINE_CODES[1], 0.0, 1.0
        elif near(a, 1.0, f["start_norm"]) and not near(c, 1.0, f["update_norm"]):
            code, a = AFFINE_CODES[2], 1.0
        else:
            return None
        forms = [(v, t) for v, t in simple_forms() if near(c, v, f["update_norm"])]
        c = forms[0][0] if forms else c
        texts = " = ".join(dict.fromkeys(t for _, t in forms))
        self.result = (code, a, c, texts, f)
        self.fit = {"kind": "affine_start_update", "params": {"a": f["a"], "c": f["c"], "tensors": len(f["moved"])},
                    "residual": f["residual"] / self.unit, "sentence": ""}
        return self.result

    def named(self, code: str) -> Optional[tuple]:
        """(the weights the fit names, its sentence) when the accepted fit's name is `code`, else None."""
        r = self._solve()
        if r is None or r[0] != code:
            return None
        code, a, c, texts, f = r
        said = (f"fitted over the {len(f['moved'])} parameters that differ from θ: a = {f['a']:.4g}, c = {f['c']:.4g}, "
                f"residual {f['residual'] / self.unit:.3g} × step k's update (bound {self.bound / self.unit:.3g}), "
                f"‖θ − θ_start‖ = {f['update_norm']:.4g}")
        if code == AFFINE_CODES[0]:
            why = ("the sampler holds the synced weights plus their whole change since the start once more "
                   "(θ + (θ − θ_start)): the update was merged into weights that already held it (an adapter or delta "
                   f"merged twice); {said}")
        elif code == AFFINE_CODES[1]:
            why = ("the sampler holds only the update since the start, θ − θ_start, with no base weights under it "
                   "(0·θ_start + 1·(θ − θ_start)): its parameters were discarded and re-allocated as zeros (an engine's "
                   "deep sleep, or a reload that skipped the base checkpoint) and only the adapter was synced into "
                   f"them, so it samples from noise; {said}")
        else:
            form = f" = {texts}" if texts else ""
            rs = [t.removeprefix("1/√") for t in texts.split(" = ") if t.startswith("1/√")]
            mech = (f"an adapter's rsLoRA scale α/√r read as α/r (r = {rs[0]}), or the update synced at "
                    f"{c:.4g} of its size" if rs else f"the update synced at {c:.4g} of its size (an adapter's "
                                                      "scale applied wrongly, or a partial merge)")
            why = (f"the sampler holds θ_start + c·(θ − θ_start) with c = {c:.4g}{form}, not θ: the update since the "
                   f"start reaches the sampler scaled: {mech}; {said}")
        self.fit["sentence"] = why
        return Affine(self.due, self.start, a, c, f["moved"]), why
