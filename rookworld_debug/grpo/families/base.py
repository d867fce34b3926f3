"""Moved: the objective-family interface is `rookworld_debug.grpo.registry` (importable from here, with a
DeprecationWarning, until rookworld_debug 0.2)."""
from rookworld_debug.grpo import moved_warning
from rookworld_debug.grpo.registry import (FAMILIES, WEIGHTINGS, Family, LossRule, checked,  # noqa: F401
                                           register)

moved_warning(__name__, "rookworld_debug.grpo.registry")
