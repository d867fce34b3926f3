"""rookworld_debug: see one GRPO step of a RookWorld chess LM, phase by phase."""
__version__ = "0.1.0"
