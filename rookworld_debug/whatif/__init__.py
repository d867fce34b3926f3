"""What if: branch a step or a run from its saved state, apply a fix, and measure whether it removes the symptom."""
