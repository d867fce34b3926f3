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
