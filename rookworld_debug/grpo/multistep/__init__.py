"""More than one step: `loop.run_steps` (the run, its checkpoints and resume), `schedules` (β and learning-rate
schedules, the KL controller), `checkpoint` (the optimizer/scheduler state a checkpoint keeps, closed schema),
`drift` (a drifted start: warm-up steps or saved weights, cached) and `start.setup` (load + drifted start).
"""


def __getattr__(name):
    """The names of the old `rookworld_debug.grpo.multistep` module (now `multistep.loop`), with a
    DeprecationWarning."""
    import importlib
    loop = importlib.import_module(__name__ + ".loop")
    if name.startswith("__") or not hasattr(loop, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rookworld_debug.grpo import moved_warning
    moved_warning(f"{__name__}.{name}", f"{__name__}.loop.{name}")
    return getattr(loop, name)
