"""The diagnosis and what-if tools priced by `rookworld-debug bench`: variants (g)–(j), each timed as the
command a user runs does its work (after its argument parsing), on (b)'s step.

The saved step (g, i, j read it) is one `run_step` of (b)'s configuration, saved with `StepTrace.save` once per
benchmark before any worker runs (untimed; `save_step`). Each variant's prepare() only points at it (h: writes
its log); step() is the timed work; the phases split it.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from rookworld_debug.errors import RookWorldError


class BenchError(RookWorldError, RuntimeError):
    """A benchmark's own preparation failed (the message says which and why)."""


ONE_STEP_SETS = (("beta=0.5",), ("lr=1e-4",), ("loss_type=grpo",), ("max_grad_norm=0.1",))   # + the unchanged arm
BRANCH_SETS = (("lr=1e-4",),)                                                                 # + the unchanged arm
BRANCH_STEPS, BRANCH_SEEDS = 3, 1
LOG_STEPS = 10_000


def _sets(sets) -> str:
    return " ".join(f"--set {' '.join(g)}" for g in sets)


TOOL_VARIANTS = {
    "g": "diagnose a saved step: what `rookworld-debug diagnose STEP --json` does on (b)'s step saved with "
         "StepTrace.save: StepTrace.load, every step check, the findings ranked and written as JSON",
    "h": f"diagnose a {LOG_STEPS:,}-step log: what `rookworld-debug diagnose RUN --json` does on a TRL output_dir "
         f"whose trainer_state.json holds {LOG_STEPS:,} log_history entries with TRL 1.16 GRPO metric names (KL and "
         "grad-norm jumps at 5 steps, a KL runaway over the second half): read and parse it, every run check, JSON",
    "i": f"one-step counterfactual, {len(ONE_STEP_SETS) + 1} arms: what `rookworld-debug whatif STEP "
         f"{_sets(ONE_STEP_SETS)}` does: load the saved start state, the self-check, then per arm (the unchanged arm "
         "first) restore the start, re-update the recorded rollout under the arm's settings and greedy-evaluate the "
         "step's prompts; whatif.json + whatif.html",
    "j": f"k-step branch, k = {BRANCH_STEPS}: what `rookworld-debug whatif STEP {_sets(BRANCH_SETS)} --steps "
         f"{BRANCH_STEPS} --seeds {BRANCH_SEEDS}` does: as (i) for {len(BRANCH_SETS) + 1} arms (unchanged, the fix), "
         f"then per arm {BRANCH_STEPS} run_steps from the saved state with fresh rollouts (held-out greedy every "
         "step), the verdicts, whatif.json + whatif.html",
}
TOOL_LABELS = {"g": "diagnose a saved step", "h": f"diagnose a {LOG_STEPS:,}-step log",
               "i": f"what-if: one step, {len(ONE_STEP_SETS) + 1} arms",
               "j": f"what-if: {BRANCH_STEPS}-step branch, {len(BRANCH_SETS) + 1} arms"}


def save_step(spec, folder) -> str:
    """One run_step of (b)'s configuration on freshly loaded weights, saved to `folder` (trace.json + tensors)."""
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import run_step
    from rookworld_debug.models import load_policy_and_reference
    cfg = spec.step_config()
    s = setup(cfg, loaded=load_policy_and_reference(spec.model_dir, dtype=cfg.dtype, device=cfg.device))
    try:
        run_step(cfg, session=s).save(folder)
    finally:
        if s.engine is not None:
            s.engine.close()
    return str(folder)


def _import_tools() -> None:
    """Import the tools untimed, as every variant's prepare() does for its own code."""
    import importlib
    for module in ("rookworld_debug.diagnosis", "rookworld_debug.whatif.run", "rookworld_debug.report.whatif_page"):
        importlib.import_module(module)


class _Tool:
    """prepare() (untimed) → step() (timed) → close(); a temporary folder for what the tool writes."""

    def __init__(self, spec):
        self.spec = spec

    def prepare(self):
        _import_tools()
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-tool-")
        self.step_dir = self.spec.saved_step
        if not self.step_dir:                    # run outside `bench` (a direct run_once): save it here
            self.step_dir = save_step(self.spec, Path(self.tmp.name) / "step")

    def close(self):
        if getattr(self, "tmp", None) is not None:
            self.tmp.cleanup()


def _diagnose_json(path) -> tuple[dict, list, int]:
    """What `rookworld-debug diagnose PATH --json` does after parsing: (phases, the findings' codes, JSON chars)."""
    from rookworld_debug.diagnosis import diagnose_path
    t0 = time.perf_counter()
    findings = diagnose_path(path)
    t1 = time.perf_counter()
    text = json.dumps({"path": str(path), "findings": [f.to_dict() for f in findings]}, indent=1, ensure_ascii=False)
    t2 = time.perf_counter()
    return {"diagnose_path": t1 - t0, "findings_json": t2 - t1}, [f.code for f in findings], len(text)


class DiagnoseStep(_Tool):
    """(g): the step checks on (b)'s saved step, loaded from disk."""

    def step(self) -> dict:
        phases, codes, size = _diagnose_json(self.step_dir)
        return {"phases": phases, "findings": codes, "json_chars": size}


class DiagnoseLog(_Tool):
    """(h): the run checks on a TRL output_dir with a LOG_STEPS-entry trainer_state.json (built untimed)."""

    def prepare(self):
        from rookworld_debug.lab.synthetic_log import log_history
        _import_tools()
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-log-")
        hist = log_history(LOG_STEPS, self.spec.seed, kl_runaway_from=LOG_STEPS // 2, trl_keys=True)
        self.run_dir = Path(self.tmp.name) / "run"
        self.run_dir.mkdir()
        (self.run_dir / "trainer_state.json").write_text(json.dumps(
            {"global_step": LOG_STEPS, "max_steps": LOG_STEPS, "logging_steps": 1, "log_history": hist}))

    def step(self) -> dict:
        phases, codes, size = _diagnose_json(self.run_dir)
        return {"phases": phases, "findings": codes, "json_chars": size, "log_steps": LOG_STEPS,
                "log_bytes": (self.run_dir / "trainer_state.json").stat().st_size}


class WhatIf(_Tool):
    """(i) and (j): `whatif` on the saved step, as the CLI calls it, then its page; phases from the result."""
    sets, steps, seeds = ONE_STEP_SETS, 0, 1

    def step(self) -> dict:
        from rookworld_debug.report.whatif_page import write
        from rookworld_debug.whatif import arms_from_sets, whatif
        out = Path(self.tmp.name) / "whatif-out"
        shutil.rmtree(out, ignore_errors=True)
        arms = arms_from_sets([list(g) for g in self.sets])
        t0 = time.perf_counter()
        res = whatif(self.step_dir, arms, steps=self.steps, seeds=self.seeds, device=self.spec.device)
        t1 = time.perf_counter()
        write(res.to_dict(), out)
        t2 = time.perf_counter()
        arm_s = sum(a.seconds for a in res.one_step)
        branch_s = sum(b.seconds for b in res.branches)
        phases = {"load_record_selfcheck": t1 - t0 - arm_s - branch_s, "one_step_arms": arm_s}
        if self.steps:
            phases["branch"] = branch_s
        phases["write_page"] = t2 - t1
        return {"phases": phases, "arms": len(res.arms), "branch_steps": self.steps, "seeds": res.seeds,
                "one_step_seconds": arm_s, "branch_seconds": branch_s, "self_check": res.self_check.passed,
                "verdicts": [f"{v.symptom}/{v.arm}: {v.verdict}" for v in res.verdicts]}


class WhatIfBranch(WhatIf):
    """(j): (i)'s path with one fix arm and BRANCH_STEPS-step branches."""
    sets, steps, seeds = BRANCH_SETS, BRANCH_STEPS, BRANCH_SEEDS


TOOL_CLASSES = {"g": DiagnoseStep, "h": DiagnoseLog, "i": WhatIf, "j": WhatIfBranch}
