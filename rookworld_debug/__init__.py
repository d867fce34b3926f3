"""rookworld_debug: see one GRPO step of a RookWorld chess LM, phase by phase.

    from rookworld_debug import StepConfig, run_step
    trace = run_step(StepConfig(beta=0.05))
"""
__version__ = "0.1.0"

__all__ = ["StepConfig", "run_step", "run_steps", "StepTrace", "StepRecorder", "__version__"]

from rookworld_debug import settings as _settings  # noqa: E402  (no torch: the config's registry)


def _builtin_families() -> None:
    """The built-in objective families: importing them registers each (its losses, advantages and settings). The
    config and the family registry sit below the families, so this root module hands them this loader."""
    import rookworld_debug.grpo.families  # noqa: F401


_settings.when_first_used(_builtin_families)


def __getattr__(name):  # lazy: `import rookworld_debug` must not import torch/transformers
    if name == "StepConfig":
        from rookworld_debug.config import StepConfig
        return StepConfig
    if name in ("run_step", "StepTrace"):
        from rookworld_debug.grpo import step
        return getattr(step, name)
    if name == "StepRecorder":
        from rookworld_debug.record import StepRecorder
        return StepRecorder
    if name == "run_steps":
        from rookworld_debug.grpo.multistep.loop import run_steps
        return run_steps
    raise AttributeError(name)
