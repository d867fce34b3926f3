"""`TRLCapture` lives in `rookworld_debug.grpo.trace.captured` (the core deserializes it, and the core must not import
the TRL layer); this name is kept for code written against it. Traces written with the old record name
(`rookworld_debug.trl.record:TRLCapture`) still open: `grpo.trace.serialize` maps it to the same class."""
from rookworld_debug.grpo.trace.captured import (CAPTURE_FORMAT, SUPPORTED_TRL, TRLCapture, check_compatible,  # noqa: F401
                                           trl_minor)

__all__ = ["CAPTURE_FORMAT", "SUPPORTED_TRL", "TRLCapture", "check_compatible", "trl_minor"]
