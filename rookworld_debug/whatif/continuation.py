"""The continuation of a recorded step: k steps of this package's trusted step from the step's recorded state — its
weights before the update, its optimizer's moments, its reference — on the step's own prompts and labels, in two
arms with shared seeds: the recorded bug re-applied each step (its fit, as the settings that reproduce it) against
the fix (the settings the loop declared). Each symptom is judged as `whatif` judges a branch: removed, not
removed, cannot tell, from the paired differences over S shared sampling seeds.

A bug is re-applied where its fit is a setting of this package's step: a declaration fit (the loop computes
another loss_type, KL estimator, reward scaling, β, …), a KL coefficient, a temperature, a learning-rate factor;
or a factor on the advantages or on the whole loss (a sign of the advantages or the rewards, a scale of the
advantages, of the loss or of its gradient), run as the declared objective with that factor (`recorded_bug`).
Any other fit (a grouping, a substituted input, a forward without the temperature) is not a setting here: `bug_arm`
says so and the one-step comparison (`diagnosis.replay.corrected`) is the answer.
"""
from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path
from typing import Callable, Optional

from rookworld_debug.diagnosis.replay.terms import near
from rookworld_debug.errors import ConfigError, TraceError
from rookworld_debug.grpo.registry import registered_for_now
from rookworld_debug.whatif.overrides import Arm
from rookworld_debug.whatif.recorded_bug import bug_settings, factor_of

# StepRecorder's keywords that name a StepConfig setting of the same meaning
KEYWORD_SETTING = {"loss_type": "loss_type", "beta": "beta", "epsilon": "epsilon", "scale_rewards": "scale_rewards",
                   "kl_estimator": "kl_estimator", "use_bias_correction_kl": "use_bias_correction_kl",
                   "mask_truncated_completions": "mask_truncated_completions",
                   "num_iterations": "num_iterations", "max_grad_norm": "max_grad_norm"}


@dataclasses.dataclass(frozen=True)
class Continuation:
    bug: Optional[Arm]              # the recorded bug as settings; None: not re-applicable (`why`)
    why: str
    steps: int = 0
    seeds: int = 0
    verdicts: tuple = ()            # stats.Verdict of the fix against the bug, per symptom
    branches: tuple = ()
    seconds_per_step: float = math.nan

    def to_dict(self) -> dict:
        return {"bug": None if self.bug is None else {"name": self.bug.name, "settings": dict(self.bug.overrides),
                                                       "source": self.bug.source},
                "why": self.why, "steps": self.steps, "seeds": self.seeds,
                "verdicts": [v.to_dict() for v in self.verdicts],
                "seconds_per_step": self.seconds_per_step if math.isfinite(self.seconds_per_step) else None}


def bug_arm(replay, config=None) -> tuple[Optional[Arm], str]:
    """(the recorded bug as settings, how it was read) from the replay's fits; (None, why) where no setting of this
    package's step reproduces it. With the step's `config`, a factor on the advantages or the loss is re-applied as
    an objective registered for the purpose: call it inside `registry.registered_for_now()`."""
    if replay is None:
        return None, "the step was not replayed"
    over = {KEYWORD_SETTING[d.keyword]: d.fitted for d in replay.declarations if d.keyword in KEYWORD_SETTING}
    over.update({k: d.fitted for d in replay.declarations if d.keyword == "temperature"
                 for k in ("p_temperature", "a_temperature")})
    first = replay.first_disagreement
    fit = (first.fit or {}) if first is not None else {}
    params = fit.get("params") or {}
    if first is not None and first.cause == "update_scaled" and "lr_factor" in params:
        over["lr_factor"] = float(params["lr_factor"])
    if first is not None and fit.get("kind") == "temperature" and "temperature" in params:
        over.update(p_temperature=float(params["temperature"]), a_temperature=float(params["temperature"]))
    kl = params.get("KL term (per unit β)") if fit.get("kind") == "terms" else None
    kl_terms = {"KL term (per unit β)", "the KL term's importance-ratio part (per unit β)"}
    if kl is not None and {k for k, v in params.items() if not near(v["fitted"], v["declared"])} <= kl_terms:
        over["beta"] = float(kl["fitted"])              # only the KL's coefficient is off: a β the step can take
    factor = factor_of(first) if not over and config is not None else None
    if factor is not None and (scaled := bug_settings(config, factor)) is not None:
        return Arm("the recorded bug", scaled, source=first.cause), \
            f"re-applied as the declared objective with {factor.what}"
    if not over:
        what = first.cause if first is not None and first.cause else "no fit"
        return None, (f"the recorded bug ({what}) is not a setting of this package's step nor a factor on its "
                      "advantages or loss (it is code): the one-step comparison is the answer")
    return Arm("the recorded bug", over, source=first.cause if first is not None else "declaration"), \
        "re-applied as " + ", ".join(f"{k} = {v!r}" for k, v in over.items())


def start_state(trace, folder, *, device: str = "cpu"):
    """A SavedState at the recorded step's start: the session of this package's step on the step's own prompts and
    labels, the recorded θ_before, reference and optimizer moments loaded into it."""
    from rookworld_debug.diagnosis.replay.update import load_recorded_state
    from rookworld_debug.diagnosis.replay.weights import weights_for
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.whatif.state import SavedState, snapshot
    w = weights_for(trace, folder)
    s = w.state
    if s is None or s.before is None or s.reference is None or w.tokenizer is None:
        raise TraceError(f"{folder}: the continuation starts from the recorded weights before the update and the "
                         f"reference's; this step keeps {'none' if s is None else 'not both'} ({w.source or w.why})")
    if s.optimizer not in ("AdamW", "") and s.optimizer_state:
        raise TraceError(f"{folder}: the recorded optimizer is {s.optimizer}; this package's step runs AdamW")
    tmp = Path(tempfile.mkdtemp(prefix="rookworld-continuation-"))
    batch = trace.setup.batch
    tasks = sorted(set(batch.tasks))
    if len(tasks) != 1:
        raise TraceError(f"{folder}: the continuation needs one task per batch; this one mixes {tasks}")
    with open(tmp / "batch.jsonl", "w") as fh:             # the step's own B prompts with their labels
        for p, label in zip(batch.prompts, batch.completions):
            fh.write(json.dumps({"text": p + label, "split": "train"}) + "\n")
    for name, model in (("reference", w.reference), ("policy", w.policy)):
        model.save_pretrained(tmp / name)
        w.tokenizer.save_pretrained(tmp / name)
    c, opt = trace.config, dict(s.optimizer_settings or {})
    adam = {k: v for k, v in (("lr", opt.get("lr")), ("weight_decay", opt.get("weight_decay")),
                              ("adam_eps", opt.get("eps")),
                              ("adam_betas", tuple(opt["betas"]) if opt.get("betas") else None)) if v is not None}
    config = c.replace(model=str(tmp / "reference"), init_policy=str(tmp / "policy"), init_optimizer=None,
                       dataset=str(tmp / "batch.jsonl"), task=tasks[0], batch_size=len(batch.prompts),
                       prompt_indices=tuple(range(len(batch.prompts))), reward_mode="dataset", device=device,
                       warmup_steps=0, heldout_n=0, **adam)
    session = setup(config)
    if s.optimizer_state:
        load_recorded_state(session.optimizer, [n for n, _ in session.policy.named_parameters()], s.optimizer_state)
    weights, moments = snapshot(session)
    grouped = sum(len(names) for names, _ in s.optimizer_groups)
    notes = (f"the recorded step's θ_before, reference and optimizer moments on its {len(batch.prompts)} prompts; "
             "each step of a branch samples anew with this package's step",)
    if grouped:             # this package's step holds one parameter group
        notes += (f"the recorded optimizer gave {grouped} parameters settings of their own (another parameter "
                  "group); both arms step them with the first group's settings",)
    return SavedState("recorded step", str(folder), config, 0, session, weights, moments, trace=None, notes=notes)


def continuation(trace, folder, replay, *, steps: int, seeds: int, on_step: Optional[Callable] = None
                 ) -> Continuation:
    """The two arms of the module doc over `steps` steps and `seeds` shared seeds; the bug and the fix judged on
    every symptom (whatif.symptoms.SYMPTOMS, no history: the paired difference decides)."""
    if steps < 1 or seeds < 1:
        raise ConfigError("--steps/--seeds", "the continuation needs --steps ≥ 1 and --seeds ≥ 1")
    with registered_for_now():              # a bug's own objective is this continuation's, not the process's
        bug, why = bug_arm(replay, trace.config)
        if bug is None:
            return Continuation(None, why)
        return _run(trace, folder, bug, why, steps, seeds, on_step)


def _run(trace, folder, bug: Arm, why: str, steps: int, seeds: int, on_step) -> Continuation:
    import time
    from rookworld_debug.whatif.branch import branch
    from rookworld_debug.whatif.run import judge
    from rookworld_debug.whatif.symptoms import SYMPTOMS, symptom
    state = start_state(trace, folder)
    if "lr_factor" in bug.overrides:               # a learning-rate factor is the rate the step really applied
        over = {k: v for k, v in bug.overrides.items() if k != "lr_factor"}
        bug = dataclasses.replace(bug, overrides={**over, "lr": state.config.lr * bug.overrides["lr_factor"]})
    arms = (bug, Arm("the fix", {}, source="declared"))
    for a in arms:
        a.config(state.config)                               # a fitted value this step cannot take: named now
    t0 = time.perf_counter()
    runs = branch(state, arms, steps=steps, seeds=seeds, on_step=on_step)
    per_step = (time.perf_counter() - t0) / (len(arms) * steps * seeds)
    _, verdicts = judge(runs, arms, tuple(paired_only(symptom(n)) for n in SYMPTOMS), pick=False)
    return Continuation(bug, why, steps, seeds, tuple(map(_unmoved, verdicts)), runs, per_step)


def _unmoved(v):
    """A symptom on which the bug and the fix agree on every seed is none of this bug's: nothing for the fix to
    remove (where `whatif` would say "not removed" of a change that moves nothing)."""
    from rookworld_debug.whatif.stats import VERDICTS
    if not v.fix_values or any(f != u for f, u in zip(v.fix_values, v.unchanged_values)):
        return v
    return dataclasses.replace(v, verdict=VERDICTS[3], reason=f"the bug and the fix give the same value on each of "
                               f"the {len(v.fix_values)} seed(s): the bug does not move it")


def paired_only(s):
    """`s` judged on the paired difference alone. An absolute rule (KL above 1 nat/token) marks a broken run; a few
    steps from one recorded state reach it in neither arm, so there it would say "absent in both" of a bug that
    plainly moves the quantity (a β too small lets the KL grow faster on every seed). Between the bug and the fix
    the question is which way, and by how much, the fix moves it."""
    return dataclasses.replace(s, threshold=None, definition=s.definition.split("; threshold:")[0] +
                               "; judged on the fix's paired difference from the bug over the shared seeds (a few "
                               "steps from one state: no run history and no absolute rule)")


def describe(c: Continuation) -> str:
    """The continuation's lines under the one-step comparison."""
    if c.bug is None:
        return f"continuation: not run: {c.why}"
    lines = [f"continuation: {c.steps} step(s) × {c.seeds} seed(s) per arm from the recorded state, the bug "
             f"{c.why} against the fix (the declared settings); {c.seconds_per_step:.1f} s per step", ""]
    lines += [f"  {v.symptom:18s} {v.verdict:12s} {v.reason}" for v in c.verdicts]
    return "\n".join(lines)
