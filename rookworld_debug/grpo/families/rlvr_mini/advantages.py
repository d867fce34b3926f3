"""rookworld-rlvr's mini's advantages as this package's `Advantages` record: its per-group baselines (group mean,
EMA, learned values, optional GAE; `baselines`), then ONE global normalisation over the batch."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

import torch

from rookworld_debug.errors import DataError
from rookworld_debug.grpo.families.rlvr_mini import baselines as rb
from rookworld_debug.grpo.phases.advantages import Advantages, as_rewards, finish_advantages, nanstd


def rlvr_advantages(rewards: Sequence[float] | torch.Tensor, num_generations: int, *,
                    baseline_type: str = "group_mean", values: Optional[torch.Tensor] = None,
                    use_gae: bool = False, gae_lambda: float = 0.95,
                    baseline_tracker: Optional[dict] = None) -> Advantages:
    """The mini's advantages as this package's Advantages record (method "rlvr_mini"). NaN rewards (unscorable)
    are set to the batch's valid mean before the baselines (the mini has no NaN) and get advantage 0; flagged.
    Non-finite `values` (the learned baseline's) are likewise set to their valid mean, so one NaN does not
    turn its group's baseline into NaN."""
    G = num_generations
    raw_r = as_rewards(rewards, G).to(torch.float64)                                  # (N,)
    if raw_r.numel() == 0:
        raise DataError("rlvr advantages: no rewards (an empty batch has no groups)")
    bad = ~torch.isfinite(raw_r)                                                        # (N,)
    r = _fill_valid_mean(raw_r)                                                         # (N,)
    if values is not None:
        values = torch.as_tensor(values).to(torch.float64).reshape(-1)                 # (N,)
        if values.shape != r.shape:
            raise DataError(f"rlvr advantages: {values.numel()} values for {r.numel()} rewards")
        values = _fill_valid_mean(values)
    raw, base = rb.raw_advantages(r, G, baseline_type, baseline_tracker, values, use_gae, gae_lambda)
    adv = rb.normalise(raw).masked_fill(bad, 0.0)                                          # (N,)
    grouped = r.view(-1, G)                                                             # (B, G)
    group_std = nanstd(grouped, dim=1, ddof=1) if G > 1 else torch.zeros(grouped.shape[0], dtype=r.dtype)
    std = raw.std() if raw.numel() > 1 else torch.zeros((), dtype=r.dtype)
    normalised = bool(std > rb.NORM_EPS)
    denom = (std + rb.NORM_EPS if normalised else torch.ones((), dtype=r.dtype)).expand(r.shape[0]).clone()
    gae = " + GAE(λ={:g}) over group members".format(gae_lambda) if use_gae and values is not None else ""
    formula = (f"rlvr mini: raw = r − b_g, {rb.BASELINE_FORMULAS[baseline_type]}{gae}; A = (raw − mean_batch)/"
               f"(std_batch(ddof=1) + 1e-8) {'applied' if normalised else 'skipped (std ≤ 1e-8)'}")
    rec = finish_advantages(torch.where(bad, torch.full_like(r, float("nan")), r), G, adv, base, group_std, denom,
                  torch.isclose(group_std, torch.zeros_like(group_std)).repeat_interleave(G),
                  normalization=formula, method="rlvr_mini", scale="batch", eps=rb.NORM_EPS, ddof=1, clip=None,
                  raw=raw_r)
    return replace(rec, flags=_zero_std_push_flags(rec, baseline_type))


def _fill_valid_mean(x: torch.Tensor) -> torch.Tensor:
    """(N,) `x` with its non-finite entries set to the mean of the finite ones (0 when none is finite)."""
    bad = ~torch.isfinite(x)
    fill = x[~bad].mean() if bool((~bad).any()) else torch.zeros((), dtype=x.dtype)
    return torch.where(bad, fill, x)


def _zero_std_push_flags(rec: Advantages, baseline_type: str) -> tuple:
    """Replace the generic 'no signal from zero-std groups' note by what the global normalisation did to them."""
    G = rec.num_generations
    out = [f for f in rec.flags if "zero reward std" not in f]
    pushed = [b for b in rec.zero_std_groups if float(rec.advantages[b * G:(b + 1) * G].abs().max()) > 1e-6]
    quiet = [b for b in rec.zero_std_groups if b not in pushed]
    if pushed:
        vals = ", ".join(f"p{b}: {float(rec.advantages[b * G]):+.3g}" for b in pushed)
        out.append(f"zero-std group(s) {pushed} get a NON-zero advantage from the global normalisation "
                   f"(baseline {baseline_type!r} does not centre each group): {vals} — a push with no reward "
                   "difference behind it")
    if quiet:
        out.append(f"groups {quiet} have zero reward std: advantage ≈ 0 (each group centred on its own mean)")
    return tuple(out)


def rlvr_advantages_from_config(rewards, config) -> Advantages:
    """`rlvr_advantages` with a StepConfig's knobs (rlvr_values='rewards': values = the rewards, as the mini's
    training script passes them)."""
    values = None
    if config.rlvr_values == "rewards":
        values = as_rewards(rewards, config.num_generations).to(torch.float64)
    return rlvr_advantages(rewards, config.num_generations, baseline_type=config.rlvr_baseline, values=values,
                           use_gae=config.rlvr_use_gae, gae_lambda=config.rlvr_gae_lambda)
