"""The lab: the tools that build and measure the embedded model and benchmark the step (not needed to debug one).

- ``bench`` (+ ``bench_variants``, ``bench_measure``, ``bench_report``): our step vs TRL's ``GRPOTrainer`` vs
  rookworld-trl's manual debug loop (``rookworld-debug bench``);
- ``recorder_cost``: what the TRL flight recorder costs per held step;
- ``generate`` / ``games``: the embedded model's training data (``rookworld-debug generate-data``);
- ``train_tiny``: trains the embedded model (``rookworld-debug train-tiny``);
- ``measure``: its format/legality rates (``rookworld-debug measure``).

The library never imports from here (the import-linter contract in pyproject.toml puts the lab on top).
"""
