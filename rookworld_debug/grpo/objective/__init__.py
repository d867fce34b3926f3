"""The GRPO loss: `loss.compute_loss` composes one loss type's row of the loss table (a per-token objective from
`terms`, an aggregation from `aggregation`) with the shared importance weights, KL estimators and masks, and
keeps every term per token, sequence and group. `params` holds its inputs as records (`Objective`, `LossBatch`,
`loss_batch` builds the latter from a rollout). Which rows exist is up to the objective families
(`grpo.families`): each registers its own loss types.
"""
