"""TRL integration: the project's rewards as `GRPOTrainer` reward functions, and a capture that saves
chosen steps of a live TRL run as `StepTrace` folders the notebooks, panels and reports open.

    from rookworld_debug.trl import rookworld_reward_funcs, capture_steps

The names load on first use, so that a command of this package (`trl-demo --help`, `verify-capture` on a bad
path) answers before torch and transformers are imported.
"""
import importlib

_HOME = {"StepCapture": "capture", "capture_steps": "capture", "step_dir": "capture",
         "TRLCapture": "record", "SUPPORTED_TRL": "record",
         "AReward": "rewards", "PReward": "rewards", "RewardCall": "rewards", "rookworld_reward_funcs": "rewards",
         "shared_engine": "rewards"}
__all__ = list(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value                     # loaded once
    return value


def __dir__():
    return sorted(__all__)
