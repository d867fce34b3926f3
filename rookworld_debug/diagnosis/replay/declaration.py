"""The declared objective, fitted: when a phase disagrees with the declaration but agrees with a neighbouring one
(one keyword changed), the loop is healthy and its declaration is not; the finding names the keyword to pass.

Neighbours are tried in order of simplicity (a switch before a choice, the declared family's loss types before
another family's) and each only in the phases its keyword changes. A neighbour counts when the disagreeing phase's
own check agrees under it; the whole step is then replayed under the fitted declaration, so a real fault further
down is still found.

    fit_declaration(trace, first, phase_checks, agreed) -> Optional[DeclarationFit]
    with_declaration(trace, keyword, value) -> StepTrace
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch

from .records import AGREE, PhaseCheck

SCALES = ("group", "batch", "none")
ESTIMATORS = ("k3", "k1", "k2")
PRECISIONS = ("bfloat16", "float16")


@dataclass(frozen=True)
class DeclarationFit:
    """A keyword under which the disagreeing phase agrees: the loop computes `fitted`, the recorder was told
    `declared`."""
    keyword: str                # StepRecorder's keyword ("use_bias_correction_kl", "loss_type", "precision", …)
    declared: object
    fitted: object
    phase: str                  # the phase that disagreed under the declaration and agrees under the fit
    quantity: str               # what was compared there
    difference: float           # its difference under the declaration
    tolerance: float
    trace: object = None        # the StepTrace under the fitted declaration
    equivalent: tuple = ()      # other values of the keyword under which the whole phase agrees as well


def _loss_types(c) -> list:
    """The declared family's other loss types first, then the other families'."""
    from rookworld_debug.grpo.families import families
    own = next((f for f in families() if c.loss_type in f.rules), None)
    first = [lt for lt in (own.rules if own else ()) if lt != c.loss_type]
    return first + [lt for f in families() if f is not own for lt in f.rules]


def _kin(keyword: str, a, b) -> bool:
    """Values worth trying as equivalents of a fit: a loss type of the same family (the aggregations that coincide
    when lengths are equal), any other value of a keyword of few values."""
    if keyword != "loss_type":
        return True
    from rookworld_debug.grpo.families import families
    return any(a in f.rules and b in f.rules for f in families())


def _later_pass(trace) -> bool:
    """A later optimizer pass over the rollout (π_old ≠ the current weights): the loop's declared pass, or a TRL
    capture whose kept π_old differs from its loss forward's log-probs."""
    if trace.recorded is not None:
        return bool(getattr(trace.recorded, "iteration", 0))
    old = getattr(trace.capture, "old_per_token_logps", None)
    m = trace.rollout.completion_mask.bool()
    return old is not None and not torch.allclose(old[m], trace.rollout.per_token_logps[m], atol=1e-6)


def _precision(trace) -> str:
    return str(getattr(trace.recorded, "dtype", None) or trace.config.dtype).removeprefix("torch.")


# (keyword, the phases it changes, its neighbouring values given the trace), simplest first
NEIGHBOURS = (
    ("mask_truncated_completions", ("generation", "loss", "gradient"),
     lambda t: [not t.config.mask_truncated_completions] if bool(t.rollout.is_truncated.any()) else []),
    ("use_bias_correction_kl", ("loss", "gradient"),
     lambda t: [not t.config.use_bias_correction_kl] if t.config.beta else []),
    ("scale_rewards", ("advantages",), lambda t: [v for v in SCALES if v != t.config.scale_rewards]),
    ("precision", ("scoring",), lambda t: [p for p in PRECISIONS if p != _precision(t)]),
    ("sampler_precision", ("scoring",),
     lambda t: [p for p in PRECISIONS if p != (getattr(t.recorded, "sampler_dtype", "") or _precision(t))]),
    ("kl_estimator", ("loss", "gradient"),
     lambda t: [v for v in ESTIMATORS if v != t.config.kl_estimator] if t.config.beta else []),
    ("importance_sampling_level", ("loss", "gradient"),
     lambda t: [v for v in ("token", "sequence") if v != t.config.importance_sampling_level]
     if _later_pass(t) else []),
    ("loss_type", ("loss", "gradient"), lambda t: _loss_types(t.config)),
    # a clip-higher range declared and ignored: the upper bound taken from ε (a later pass: the ratio ≠ 1)
    ("epsilon_high", ("loss", "gradient"),
     lambda t: [t.config.epsilon_low] if t.config.epsilon_high != t.config.epsilon_low and _later_pass(t) else []),
)


# the neighbours a TRL capture can be fitted to: GRPOConfig's fields that the trainer copies to attributes it reads
# at each step (set apart from the config, by a subclass or after construction, they contradict it)
TRL_KEYWORDS = ("mask_truncated_completions", "use_bias_correction_kl", "scale_rewards",
                "importance_sampling_level", "loss_type", "epsilon_high")


# keywords of a continuous value, (keyword, phases, fit kind, fit parameter): their one candidate is the value the
# disagreeing phase's own fit found (a temperature that reproduces the log-probs, a clip norm that reproduces the
# update), tried at 2, 3 and 4 significant digits
FITTED = (("temperature", ("scoring",), "temperature", "temperature"),
          ("max_grad_norm", ("update",), "clip", "max_grad_norm"))


# keywords whose candidate is fitted to the loss total alone (one equation, one unknown: always solvable)
ONE_NUMBER = ("beta",)


# where a keyword's mistake shows first (the quantity it must be), for the keywords of one forward's precision
SHOWN_IN = {"precision": "per_token_logps", "sampler_precision": "sampling_per_token_logps"}


def with_declaration(trace, keyword: str, value):
    """The trace as if the recorder had been told `keyword=value` (None when the config refuses the value)."""
    from rookworld_debug.errors import ConfigError
    if keyword in ("precision", "sampler_precision"):
        field = "dtype" if keyword == "precision" else "sampler_dtype"
        roles = ("policy",) + (() if trace.recorded.sampler_dtype else ("sampler",)) if keyword == "precision" \
            else ("sampler",)
        return dataclasses.replace(trace, recorded=dataclasses.replace(trace.recorded, **{field: value}),
                                   setup=_with_precision(trace.setup, roles, value))
    if keyword == "temperature":
        return _with_temperature(trace, float(value))
    try:
        other = dataclasses.replace(trace, config=trace.config.replace(**{keyword: value}))
    except (ConfigError, ValueError, TypeError):
        return None
    if keyword == "max_grad_norm" and trace.recorded is not None:     # the update reads the recorded clip
        other = dataclasses.replace(other, recorded=dataclasses.replace(trace.recorded, max_grad_norm=value))
    if trace.capture is not None:                       # its loss recomputed under the neighbour, where it can be
        from .loss_phase import recaptured
        other = recaptured(trace, other)
    return other


def _with_temperature(trace, t: float):
    """The trace as if the loop had said it samples and scores at temperature `t` (every row)."""
    from rookworld_debug.errors import ConfigError
    r = trace.rollout
    try:
        config = trace.config.replace(p_temperature=t, a_temperature=t)
    except (ConfigError, ValueError, TypeError):
        return None
    sampling = {task: (t, *rest[1:]) for task, rest in (r.sampling or {}).items()}
    rollout = dataclasses.replace(r, temperatures=torch.full_like(r.temperatures, t), sampling=sampling)
    return dataclasses.replace(trace, config=config, rollout=rollout)


def quantity_key(check: PhaseCheck) -> str:
    """What a check compares, without the declaration's words ("loss", "gradient", "advantages (N,)", …)."""
    key = check.quantity.split(":")[0].strip()
    return "gradient" if key == "the loss's gradient" else key


def _with_precision(setup, roles, dtype: str):
    """The setup whose provenance says `roles` computed in `dtype` (what the signature checks read)."""
    prov = dict(setup.provenance or {})
    prec = {k: dict(v) for k, v in (prov.get("precision") or {}).items() if isinstance(v, dict)}
    for role in roles:
        prec[role] = {**prec.get(role, {}), "dtype": dtype, "compute": dtype}
    return dataclasses.replace(setup, provenance={**prov, "precision": prec})


@dataclass(frozen=True)
class PassNote:
    """A loop that did not say which pass it recorded (num_iterations > 1 without iteration, or num_iterations left
    at its default 1 while π_old is not the loss forward's): the pass its records show."""
    num_iterations: int
    inferred: Optional[int]     # 0: the first pass; 1: a later one; None: the records cannot tell
    why: str                    # what in the records says so
    mu_inferred: bool = False   # num_iterations was not passed at all: a later pass implies μ ≥ 2


def with_inferred_pass(trace) -> tuple:
    """(the trace with the pass its records show, PassNote or None). On a rollout's first pass π_old is the weights
    before the update, so π_old's recorded log-probs equal the loss forward's; on a later pass the policy has moved
    and they differ. A loop that passed `iteration` itself is taken at its word; one that left num_iterations at
    its default 1 while its π_old moved is read as a later pass of μ ≥ 2 passes, said as a note (a loop of one pass
    whose π_old is not the loss forward's is told so in the same note), never as errors about its sampler."""
    from .compare import LOGP_TOL, MEAN_TOL, _max_diff, tol_for
    rec = trace.recorded
    mu = int(getattr(trace.config, "num_iterations", 1) or 1)
    if rec is None or rec.iteration or "iteration" in rec.explicit or (mu < 2 and "num_iterations" in rec.explicit):
        return trace, None
    old, lp, mask = rec.old_per_token_logps, trace.rollout.per_token_logps, trace.rollout.completion_mask
    if old is None or lp is None:
        if mu < 2:
            return trace, None
        return _pass(trace, 1), PassNote(mu, None, "π_old's log-probs were not recorded (logprobs(old=...))")
    dt = _precision(trace)
    gap = _max_diff(old, lp, mask)
    mean = float(((old.double() - lp.double()).abs() * mask).sum() / mask.sum().clamp(min=1))
    if gap <= tol_for(LOGP_TOL, dt) or (tol_for(MEAN_TOL, dt) is not None and mean <= tol_for(MEAN_TOL, dt)):
        return trace, None                      # the first pass, as the default says: nothing to note
    why = (f"π_old's recorded log-probs differ from the loss forward's by up to {gap:.3g} nats (mean {mean:.3g}): "
           "the policy moved since sampling")
    if mu < 2:                                  # μ left at its default: a later pass needs at least two
        trace = dataclasses.replace(trace, config=dataclasses.replace(trace.config, num_iterations=2))
        return _pass(trace, 1), PassNote(2, 1, why, mu_inferred=True)
    return _pass(trace, 1), PassNote(mu, 1, why)


def _pass(trace, k: int):
    return dataclasses.replace(trace, recorded=dataclasses.replace(trace.recorded, iteration=k))


def fit_declaration(trace, first: PhaseCheck, phase_checks, agreed: frozenset = frozenset()
                    ) -> Optional[DeclarationFit]:
    """The first neighbouring declaration under which `first`'s quantity agrees and no quantity of its phase that
    agreed (`agreed`: their keys) stops agreeing. `phase_checks(trace, phase)` runs that phase's checks on a trace
    (the replay's own functions). A loop off in two keywords is fitted one at a time: the loss value under the right
    loss type, then its gradient under the right KL correction."""
    if trace.recorded is None and trace.capture is None:     # a run_step trace computes what its config says
        return None
    want = quantity_key(first)
    best, best_score, whole = None, None, False
    candidates = iter(_neighbours(trace, first))
    for keyword, value, other in candidates:
        checks = _quietly(phase_checks, other, first.phase)
        if keyword in ONE_NUMBER and not (checks and all(c.status == AGREE for c in checks)
                                          and any(quantity_key(c) == "gradient" for c in checks)):
            continue            # fitted to one total: the gradient must agree under it as well
        if want == "loss" and any(quantity_key(c) == "gradient" and c.status != AGREE for c in checks):
            continue            # the total fixed and its gradient not: one number that many declarations reach
        fixed = any(quantity_key(c) == want and c.status == AGREE for c in checks)
        kept = all(c.status == AGREE for c in checks if quantity_key(c) in agreed)
        # of the neighbours that fix it: the one that fixes most, then the one left nearest (in tolerances)
        score = (sum(c.status == AGREE for c in checks),
                 -sum(c.max_abs_diff / c.tolerance for c in checks if c.status != AGREE and c.tolerance > 0))
        if fixed and kept and (best_score is None or score > best_score):
            best, best_score, whole = (keyword, value, other), score, score[0] == len(checks)
        if whole:
            break                                       # the simplest neighbour under which the whole phase agrees
    if best is None:
        return None
    keyword, value, other = best
    # the first whole fit ended the loop, so no neighbour before it was whole: only those after it can tie with it
    same = tuple(v for k, v, t in candidates if k == keyword and _kin(keyword, v, value)
                 and all(c.status == AGREE for c in _quietly(phase_checks, t, first.phase))) if whole else ()
    return DeclarationFit(keyword, _declared(trace, keyword), value, first.phase, first.quantity,
                          first.max_abs_diff, first.tolerance, other, same)


# a difference whose signed mean is this share of its mean size leans one way: rounding does not
SYSTEMATIC_SHARE = 0.5
SYSTEMATIC_MIN_VALUES = 32


def systematic(check: PhaseCheck) -> bool:
    """Whether `check`'s differences lean one way (|mean(rec − ours)| > SYSTEMATIC_SHARE × mean |rec − ours| over
    at least SYSTEMATIC_MIN_VALUES compared values): a shift, a filter or another temperature, never a rounding, whose
    errors fall on both sides. A precision neighbour is not tried on such a difference: its wider tolerance would
    absorb it."""
    s = check.samples
    if s is None or len(s.recorded) < SYSTEMATIC_MIN_VALUES:
        return False
    d = [a - b for a, b in zip(s.recorded, s.recomputed) if math.isfinite(a - b)]
    size = sum(abs(x) for x in d) / max(len(d), 1)
    return size > 0 and abs(sum(d) / len(d)) > SYSTEMATIC_SHARE * size


def confined_to_rows(check: PhaseCheck, trace) -> bool:
    """Whether `check`'s differences beyond its tolerance sit in at most half of the rows that have completion
    tokens (every such position listed): another precision rounds every row's values, so a difference that spares
    the other rows at the declared precision is not its rounding (rows scored at other weights, other inputs)."""
    s = check.samples
    if s is None or s.axes != ("row", "token") or not s.beyond or s.n_beyond > len(s.beyond):
        return False
    rows = int((trace.rollout.completion_mask.sum(1) > 0).sum())
    return 2 * len({pos[0] for pos in s.beyond}) <= rows


def _neighbours(trace, first: PhaseCheck):
    """(keyword, value, the trace under it) of every neighbouring declaration that can change `first`'s phase,
    simplest first."""
    for keyword, phases, values in NEIGHBOURS:
        if first.phase not in phases or not first.quantity.startswith(SHOWN_IN.get(keyword, "")):
            continue            # a forward in another precision shows first in that forward's own log-probs
        if trace.recorded is None and keyword not in TRL_KEYWORDS:
            continue            # a TRL capture: only what a GRPOConfig holds and the trainer reads
        if keyword in SHOWN_IN and (systematic(first) or first.cause or confined_to_rows(first, trace)):
            continue            # not rounding: a mechanism reproduces it, or it leans one way or spares rows
        for value in values(trace):
            other = with_declaration(trace, keyword, value)
            if other is not None:
                yield keyword, value, other
    if first.phase == "loss" and quantity_key(first) == "loss" and trace.recorded is not None \
            and "beta" not in trace.recorded.explicit:                # a β left at its default, fitted to the total
        from .loss_phase import beta_from_total
        b = _quietly(lambda t, _: beta_from_total(t), trace, "loss")
        if isinstance(b, float):
            yield from _rounded(trace, "beta", b)
    fit = first.fit or {}
    for keyword, phases, kind, param in FITTED:
        v = (fit.get("params") or {}).get(param)
        if first.phase in phases and fit.get("kind") == kind and isinstance(v, (int, float)) and math.isfinite(v):
            yield from _rounded(trace, keyword, float(v))


def _rounded(trace, keyword: str, v: float):
    """A fitted value at 2, 3 and 4 significant digits (the shortest that agrees is the one said)."""
    for value in dict.fromkeys(float(f"{v:.{digits}g}") for digits in (2, 3, 4)):     # each once, shortest first
        other = with_declaration(trace, keyword, value)
        if other is not None and value != _declared(trace, keyword):
            yield keyword, value, other


def _declared(trace, keyword: str):
    if keyword == "temperature":
        return float(trace.rollout.temperatures[0])
    if keyword == "max_grad_norm":
        from .consecutive import clip_of
        return clip_of(trace)
    if keyword == "precision":
        return _precision(trace)
    if keyword == "sampler_precision":
        return trace.recorded.sampler_dtype or _precision(trace)
    return getattr(trace.config, keyword)


def _quietly(phase_checks, trace, phase):
    """A neighbour its phase cannot run under explains nothing (a loss type refusing this batch's settings)."""
    try:
        return phase_checks(trace, phase)
    except Exception:  # noqa: BLE001 - a refused neighbour is not a fit
        return []
