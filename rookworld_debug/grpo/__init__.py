"""One GRPO step, opened phase by phase: pure functions over typed records.

Start at `step.run_step`: it reads top to bottom in the order the step runs. The rooms:

- `phases/`     the step's phases: setup (load, invariants), generation (sampling, decoding), rewards,
                advantages, scoring (teacher-forced log-probs), the loss for the record, the update (with
                μ inner iterations) and the post-update evaluation.
- `objective/`  the loss: `compute_loss`, its per-token terms, aggregations and parameters (TRL's tensor
                and metric names). The loss table is filled by the families.
- `families/`   the trainers whose steps this package opens, one family each behind one interface
                (`family_of(loss_type)`): TRL's GRPOTrainer, rookworld-trl's manual loop, rookworld-rlvr's mini.
- `multistep/`  several steps: the run loop, checkpoints, schedules, a drifted start.
- `signal/`     what the step's gradient signal is made of: noise scale, group-size sweep, sampler–trainer
                gap, entropy mechanism.
- `trace/`      the step's trace on disk: closed-schema serialization, shape checks, TRL captures.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# Modules that moved into the rooms above, importable from their old paths (with a DeprecationWarning naming the
# new one) until 0.2. The old `grpo.phases` and `grpo.multistep` modules became packages of the same name: their
# names are served by the packages' `__getattr__` (phases: `shared`; multistep: `loop`).
MOVED = {
    "advantages": "phases.advantages", "aggregation": "objective.aggregation", "captured": "trace.captured",
    "checkpoint_state": "multistep.checkpoint", "completion_text": "phases.completion_text",
    "decoding": "phases.decoding", "diagnostics": "signal.noise", "drift": "multistep.drift",
    "entropy_mechanism": "signal.entropy_mechanism", "evaluation": "phases.evaluation",
    "generation": "phases.generation", "group_size": "signal.group_size", "iterations": "phases.iterations",
    "loss": "objective.loss", "objective_params": "objective.params", "objectives": "objective.terms",
    "replay": "phases.replay", "rewards": "phases.rewards", "rlvr_baselines": "families.rlvr_mini.baselines",
    "rlvr_compare": "families.rlvr_mini.compare", "rlvr_loss": "families.rlvr_mini.loss",
    "rlvr_mini": "families.rlvr_mini.objective", "rlvr_model": "families.rlvr_mini.model",
    "rlvr_pitfalls": "families.rlvr_mini.pitfalls", "sampler_gap": "signal.sampler_gap",
    "schedules": "multistep.schedules", "scoring": "phases.scoring", "serialize": "trace.serialize",
    "setup": "phases.setup", "start": "multistep.start", "trace_check": "trace.check", "update": "phases.update",
}


def moved_warning(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path is removed in rookworld_debug 0.2", DeprecationWarning,
                  stacklevel=3)


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import rookworld_debug.grpo.<old>` → the module at its new path (the same module object)."""
    prefix = __name__ + "."

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.prefix) and fullname[len(self.prefix):] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = self.prefix + MOVED[spec.name[len(self.prefix):]]
        moved_warning(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass                                         # the new module is already executed


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
