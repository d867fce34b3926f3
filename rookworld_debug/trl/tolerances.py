"""How close `rookworld-debug verify-capture`'s replayed update must land on the checkpoint after the step (read by
its argument parser and by the computation, neither of which imports the other at load)."""
from __future__ import annotations

import math

# ‖θ_replayed − θ_after‖₂ / ‖θ_after − θ_before‖₂ per layer. Measured on the tiny model (tests/
# test_verify_capture.py): the right pairing gives ≤ 0.001 (single elements can be off by 10 % of their update
# where Adam divides fp noise by √v ≈ ε; the max is shown, the L2 is gated), the previous step's checkpoints 0.9
RTOL = 0.05
ATOL = 1e-9          # absolute floor (L2) for layers the step did not move


def check_tolerances(rtol, atol) -> None:
    """ConfigError unless both tolerances are finite numbers ≥ 0 (NaN would pass every layer: `d ≤ NaN` is False,
    but a NaN tolerance is no check at all)."""
    from rookworld_debug.errors import ConfigError
    for name, v in (("--rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise ConfigError(name, f"a tolerance is a finite number ≥ 0, got {v!r}")
