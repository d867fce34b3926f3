"""rookworld-rlvr's "mini" (jorahn/rookworld-rlvr, pure PyTorch) as an objective family: its loss terms
(`objective`, golden-checked against the mini's own code), the step's loss with its KL controller and values
(`loss`), its baselines and advantages (`baselines`, `advantages`), the data-pipeline faults it can reproduce
(`pitfalls`), its model wrapper (`model`) and a side-by-side with TRL's objectives (`compare`). Registered by
`family.py`.
"""
