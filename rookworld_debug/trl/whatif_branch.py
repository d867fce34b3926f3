"""k-step branches in TRL's GRPOTrainer and the whole TRL `whatif` (see `trl.whatif` for the method)."""
from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from rookworld_debug.errors import ConfigError
from rookworld_debug.whatif.branch import BranchRun
from rookworld_debug.whatif.overrides import sampling_fields, Arm
from rookworld_debug.trl.whatif import _LOGGED, TRLState, grpo_overrides, load_trl_state, one_step_arm, trl_self_check
from rookworld_debug.trl.whatif_pick import BranchPoint, is_run_folder, pick_branch  # noqa: F401 - the CLI's entry

# GRPOConfig fields a branch sets itself (where it writes, how long, what it logs)
_BRANCH_ARGS = {"save_strategy": "no", "logging_steps": 1, "report_to": "none", "disable_tqdm": True,
                "push_to_hub": False}


def _callbacks(seed: int, lr: Optional[float], on_step: Optional[Callable]):
    import torch
    from transformers import TrainerCallback

    from rookworld_debug.grpo.phases.shared import step_seed

    class SharedSeed(TrainerCallback):
        """Every arm samples step k with the same torch seed: step_seed(seed, k)."""
        def on_step_begin(self, args, state, control, **kw):
            torch.manual_seed(step_seed(seed, state.global_step))

        def on_step_end(self, args, state, control, **kw):
            if on_step is not None:
                on_step()

    class LearningRate(TrainerCallback):
        """The arm's learning rate from the branch point on (the checkpoint's scheduler restored the run's)."""
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
            for g in optimizer.param_groups:
                g["lr"] = lr
            if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
                lr_scheduler.base_lrs = [lr] * len(lr_scheduler.base_lrs)
    return [SharedSeed()] + ([LearningRate()] if lr is not None else [])


def grpo_args(st: TRLState, arm: Arm, steps: int, out_dir):
    from trl import GRPOConfig
    fields = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    kw = {k: v for k, v in dict(st.trace.capture.grpo_config).items() if k in fields and not k.startswith("_")
          and not k.endswith("hub_token")}
    if kw.get("steps_per_generation") is not None:
        kw.pop("generation_batch_size", None)     # derived from steps_per_generation in __post_init__
    kw.update(grpo_overrides(arm, tuple(fields)))
    kw.update(_BRANCH_ARGS, output_dir=str(out_dir), max_steps=st.trace.capture.global_step - 1 + steps)
    try:
        return GRPOConfig(**kw)
    except (TypeError, ValueError) as err:
        raise ConfigError(",".join(arm.overrides) or "grpo_config", f"arm {arm.name!r}: GRPOConfig refuses the "
                          f"branch's settings ({err})") from None


def trl_branch(st: TRLState, arms: Sequence[Arm], *, steps: int, seeds: int, trainer_factory: Callable,
               seed0: int = 0, on_step: Optional[Callable] = None) -> tuple:
    """BranchRun per (arm, seed): GRPOTrainer from --before for `steps` optimizer steps (module doc of trl.whatif)."""
    from transformers.trainer_callback import PrinterCallback
    start = st.trace.capture.global_step - 1
    out = []
    for arm in arms:
        for j in range(seeds):
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="whatif-trl-") as tmp:
                args = grpo_args(st, arm, steps, tmp)
                trainer = trainer_factory(args)
                trainer.remove_callback(PrinterCallback)       # the branch's log is its rows, not raw dicts on stdout
                lr = float(arm.overrides["lr"]) if "lr" in arm.overrides else None
                for cb in _callbacks(seed0 + j, lr, on_step):
                    trainer.add_callback(cb)
                trainer.train(resume_from_checkpoint=str(st.before))
                logs = [r for r in trainer.state.log_history if "loss" in r and int(r.get("step", -1)) > start]
            rows = tuple({"step": int(r["step"]), **{ours: _f(r.get(k)) for ours, k in _LOGGED.items()},
                          "heldout_reward_after": math.nan, "param_delta_norm": math.nan} for r in logs)
            out.append(BranchRun(arm.name, seed0 + j, rows, time.perf_counter() - t0))
    return tuple(out)


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def demo_factory(run_dir) -> Optional[Callable]:
    """The trainer factory of a trl-demo run folder (its demo.json), None for any other folder."""
    f = Path(run_dir) / "demo.json"
    if not f.is_file():
        return None
    meta = json.loads(f.read_text())
    n, mode = int(meta.get("n_prompts", 8)), str(meta.get("reward_mode", "dataset"))
    if mode not in ("dataset", "engine"):
        raise ConfigError("demo.json", f"reward_mode {mode!r} is not one of dataset/engine")

    def factory(args):
        from trl import GRPOTrainer

        from rookworld_debug.models import load_policy_and_reference
        from rookworld_debug.models.loading import TINY_DIR
        from rookworld_debug.trl.example import tiny_dataset
        from rookworld_debug.trl.rewards import rookworld_reward_funcs
        tok = load_policy_and_reference("tiny").tokenizer
        return GRPOTrainer(model=str(TINY_DIR), reward_funcs=rookworld_reward_funcs(mode), args=args,
                           train_dataset=tiny_dataset(n), processing_class=tok)
    return factory


def trl_whatif(capture, arms: Sequence[Arm], *, before, steps: int = 0, seeds: int = 1, symptoms: Sequence[str] = (),
               trainer_factory: Optional[Callable] = None, progress: Optional[Callable] = None,
               require_self_check: bool = True):
    """Self-check, one-step counterfactual and (steps ≥ 1, with a trainer factory) k-step GRPOTrainer branches
    of a TRL capture; the same `WhatIfResult` as `whatif.whatif`."""
    from rookworld_debug.whatif.run import SelfCheckError, WhatIfResult, judge
    from rookworld_debug.whatif.symptoms import default_symptoms, symptom
    t0 = time.perf_counter()
    tick = progress or (lambda kind, n=1: None)
    st = load_trl_state(capture, before)
    for a in arms:
        a.config(st.trace.config)
    if arms[0].overrides:
        arms = (Arm("unchanged", {}, "recorded"), *arms)
    from trl import GRPOConfig
    fields = tuple(f.name for f in dataclasses.fields(GRPOConfig))
    for a in arms:
        grpo_overrides(a, fields)
    ones = []
    for a in arms:
        if set(a.overrides) & set(sampling_fields()):
            continue                      # it changes the sampling: k-step branches only
        ones.append(one_step_arm(st, a))
        tick("arm")
    check = trl_self_check(st, ones[0])
    if check.passed is False and require_self_check:
        raise SelfCheckError(check)
    runs, chosen, verdicts, notes = (), (), (), []
    factory = trainer_factory or demo_factory(Path(before).parent)
    if steps and factory is None:
        notes.append("k-step branches of a TRL run need its trainer (trainer_factory; a trl-demo folder has its own): "
                     "only the one-step counterfactual ran")
    elif steps:
        runs = trl_branch(st, arms, steps=steps, seeds=seeds, trainer_factory=factory, on_step=lambda: tick("step"))
        sym = tuple(symptom(n, st.history) for n in symptoms) or default_symptoms(st.history)
        chosen, verdicts = judge(runs, arms, sym, pick=not symptoms)
    cap = st.trace.capture
    return WhatIfResult(source={"kind": "TRL capture", "path": str(capture), "step": cap.global_step,
                                "before": str(before), "after": str(st.after) if st.after else None},
                        config=dict(cap.grpo_config), arms=tuple(arms), self_check=check, one_step=tuple(ones),
                        branches=runs, symptoms=chosen, verdicts=verdicts, steps=steps if runs else 0,
                        seeds=seeds if runs else 0, seconds=time.perf_counter() - t0, notes=tuple(notes))
