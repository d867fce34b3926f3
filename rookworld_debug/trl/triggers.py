"""Triggers for the flight recorder: when does a step of a TRL run deserve to be written?

A trigger is any callable ``(step, metrics, record) -> Firing | None``: ``metrics`` is the flat dict of
this step's numbers (TRL's logged metrics when the step logged, else the last value of each metric TRL
accumulated during the step, plus ``loss`` and ``grad_norm`` from the capture itself), ``record`` the
held raw record (tensors on the CPU). A firing says why: trigger name, value, threshold, and kind.

:class:`MetricTrigger` watches one metric in two forms, each optional:

* **absolute** — ``above``/``below`` a fixed threshold, edge-triggered: it fires on the step that crosses
  into the region, not again while the metric stays there (a run whose completions are always
  truncated would otherwise write every step);
* **relative** — a jump over its running median: ``direction · (value − median) > k · scale``, where the
  median and the scale (1.4826 · MAD, floored at ``floor``, in the metric's units) come from the previous
  ``window`` values (at least ``min_history`` of them). Robust to the slow drift of a healthy run, fires on
  a jump. After a firing a trigger is quiet for ``cooldown`` steps: a metric that stays up is one event.

:func:`default_triggers` is the built-in set (KL, entropy fall, reward drop, clip ratio, grad-norm spike,
zero-std groups, truncated completions, non-finite loss/gradient).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Firing:
    """Why a step was written: ``kind`` is "absolute", "relative", "non-finite", "named" or "lead-up"."""
    trigger: str
    value: float
    threshold: float
    kind: str
    detail: str = ""

    def to_dict(self) -> dict:
        def num(x):
            return x if isinstance(x, (int, float)) and math.isfinite(x) else repr(x)
        return {"trigger": self.trigger, "value": num(self.value), "threshold": num(self.threshold),
                "kind": self.kind, "detail": self.detail}


@dataclass
class MetricTrigger:
    """Fire on one metric crossing an absolute threshold or jumping over its running median (see module doc)."""
    name: str
    metric: str
    above: Optional[float] = None          # absolute: fire when value > above
    below: Optional[float] = None          # absolute: fire when value < below
    jump: Optional[float] = None           # relative: fire when direction·(value − median) > jump · scale
    direction: int = 1                     # +1 watches rises (KL, grad norm), −1 falls (entropy, reward)
    window: int = 20
    min_history: int = 5
    floor: float = 1e-6                    # lower bound of the scale, so a flat history does not fire on noise
    cooldown: int = 10                     # after a firing, this trigger stays quiet for this many steps
    history: deque = field(default_factory=deque, repr=False)
    beyond: bool = field(default=False, repr=False)   # inside the absolute region at the previous step
    quiet: int = field(default=0, repr=False)         # steps of cooldown left

    def __call__(self, step: int, metrics: dict, record=None) -> Optional[Firing]:
        value = metrics.get(self.metric)
        if value is None:
            return None
        value = float(value)
        if not math.isfinite(value):
            return None                    # non-finite values are the NonFiniteTrigger's
        fired = self._check(value)
        if self.quiet > 0:                 # one firing per episode: a metric that stays high is one event
            self.quiet -= 1
            fired = None
        elif fired is not None:
            self.quiet = self.cooldown
        self.history.append(value)
        while len(self.history) > self.window:
            self.history.popleft()
        return fired

    def _check(self, value: float) -> Optional[Firing]:
        was, crossed = self.beyond, None
        if self.above is not None and value > self.above:
            crossed = Firing(self.name, value, self.above, "absolute", f"{self.metric} crossed above {self.above:g}")
        elif self.below is not None and value < self.below:
            crossed = Firing(self.name, value, self.below, "absolute", f"{self.metric} crossed below {self.below:g}")
        self.beyond = crossed is not None
        if crossed is not None and not was:
            return crossed
        if self.jump is None or len(self.history) < self.min_history:
            return None
        med = statistics.median(self.history)
        scale = max(1.4826 * statistics.median(abs(x - med) for x in self.history), self.floor)
        threshold = med + self.direction * self.jump * scale
        if self.direction * (value - med) > self.jump * scale:
            word = "rose" if self.direction > 0 else "fell"
            return Firing(self.name, value, threshold, "relative",
                          f"{self.metric} {word} {abs(value - med) / scale:.1f} robust σ from its running median "
                          f"{med:.4g} over {len(self.history)} steps")
        return None


@dataclass
class NonFiniteTrigger:
    """Fire when the step's loss or gradient norm is NaN/inf."""
    name: str = "non_finite"
    metrics: tuple = ("loss", "grad_norm")

    def __call__(self, step: int, metrics: dict, record=None) -> Optional[Firing]:
        for m in self.metrics:
            v = metrics.get(m)
            if v is not None and not math.isfinite(float(v)):
                return Firing(self.name, float(v), math.inf, "non-finite", f"{m} is {v}")
        return None


def default_triggers() -> list:
    """The built-in triggers; thresholds are starting points for a GRPO run (see each one's detail)."""
    return [
        MetricTrigger("kl", "kl", above=1.0, jump=8.0, floor=0.01),
        MetricTrigger("entropy_fall", "entropy", jump=8.0, direction=-1, floor=0.02),
        MetricTrigger("reward_drop", "reward", jump=8.0, direction=-1, floor=0.05),
        MetricTrigger("clip_ratio", "clip_ratio/region_mean", above=0.3, jump=8.0, floor=0.02),
        MetricTrigger("grad_norm_spike", "grad_norm", jump=8.0, floor=0.1),
        MetricTrigger("frac_reward_zero_std", "frac_reward_zero_std", above=0.95),
        MetricTrigger("completions_clipped", "completions/clipped_ratio", above=0.9),
        NonFiniteTrigger(),
    ]


def run_triggers(triggers, step: int, metrics: dict, record) -> list[Firing]:
    """Every trigger's firing for this step; a trigger that raises is reported as a firing, not a crash."""
    out = []
    for trig in triggers:
        try:
            got = trig(step, metrics, record)
        except Exception as err:  # noqa: BLE001 - a user's trigger must not end their training run
            got = Firing(getattr(trig, "name", getattr(trig, "__name__", "trigger")), math.nan, math.nan,
                         "error", f"{type(err).__name__}: {err}")
        if isinstance(got, Firing):
            out.append(got)
        elif got:                          # a user callable may answer True / a string
            name = getattr(trig, "name", getattr(trig, "__name__", "user trigger"))
            out.append(Firing(name, math.nan, math.nan, "user", got if isinstance(got, str) else ""))
    return out


TriggerFn = Callable[[int, dict, object], Optional[Firing]]
