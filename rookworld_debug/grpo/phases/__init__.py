"""The phases of one GRPO step, one module each, in the order a step runs them: `setup` (load the models,
data and engine; step-0 invariants), `generation` (sampling, with `decoding` and `completion_text`), `rewards`,
`advantages`, `scoring` (teacher-forced per-token log-probs, entropy and exact KL), `shared` (what a step and a
warm-up step share: sample → score → the loss record), `update` (micro-batched backward and the optimizer step;
`iterations` for μ > 1) and `evaluation` (greedy and resampled after the update, with `replay`). Records stay on
the CPU; a phase that computes with a model crosses to its device and back once.
"""


def __getattr__(name):
    """The names of the old `rookworld_debug.grpo.phases` module (now `phases.shared`), with a DeprecationWarning."""
    import importlib
    shared = importlib.import_module(__name__ + ".shared")
    if name.startswith("__") or not hasattr(shared, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rookworld_debug.grpo import moved_warning
    moved_warning(f"{__name__}.{name}", f"{__name__}.shared.{name}")
    return getattr(shared, name)
