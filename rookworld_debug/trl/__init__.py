"""TRL integration: the project's rewards as `GRPOTrainer` reward functions, and a capture that saves
chosen steps of a live TRL run as `StepTrace` folders the notebooks, panels and reports open.

    from rookworld_debug.trl import rookworld_reward_funcs, capture_steps
"""
from rookworld_debug.trl.capture import StepCapture, capture_steps, step_dir
from rookworld_debug.trl.record import SUPPORTED_TRL, TRLCapture
from rookworld_debug.trl.rewards import AReward, PReward, RewardCall, rookworld_reward_funcs, shared_engine

__all__ = ["StepCapture", "capture_steps", "step_dir", "TRLCapture", "SUPPORTED_TRL", "AReward", "PReward",
           "RewardCall", "rookworld_reward_funcs", "shared_engine"]
