"""More than one step: `loop.run_steps` (the run, its checkpoints and resume), `schedules` (β and learning-rate
schedules, the KL controller), `checkpoint` (the optimizer/scheduler state a checkpoint keeps, closed schema),
`drift` (a drifted start: warm-up steps or saved weights, cached) and `start.setup` (load + drifted start).
"""
