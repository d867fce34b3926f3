"""The lab: tools for the people who build this project, not for the people who debug a step.

- ``bench``: our step vs TRL's ``GRPOTrainer`` vs the seeds' loop (``rookworld-debug bench``);
- ``recorder_cost``: what the TRL flight recorder costs per held step;
- ``generate`` / ``games``: the embedded model's training data (``rookworld-debug generate-data``);
- ``train_tiny``: trains the embedded model (``rookworld-debug train-tiny``);
- ``measure``: its format/legality rates (``rookworld-debug measure``).

The library never imports from here (the import-linter contract in pyproject.toml puts the lab on top).
"""
