"""What if G were smaller? — the step's gradient from G′ < G completions per group.

Shape legend: B prompts, G generations per prompt, N = B·G rows, G′ the subsampled group size, P parameters.

Estimator: for each G′ and each of `draws` seeded draws, every group keeps G′ of its G completions (uniformly
without replacement, independently per group); the advantages are recomputed from the kept rewards with the
step's own advantage function (`advantages_from_config`, num_generations = G′: group means/stds of G′ rewards),
the loss is the step's loss on the kept B·G′ rows with ITS normalizers (Σ mask of the kept rows), and
g_{G′} = ∂loss/∂θ through the same forward as the full-G gradient g_G (log-probs at the step's start, old =
ℓ.detach(): ratio 1). Reported: cos(g_{G′}, g_G) and ‖g_{G′}‖ / ‖g_G‖ per draw, their mean and standard
deviation over the draws. Cosines near 1 at small G′: the extra completions barely changed the direction.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from rookworld_debug.errors import ConfigError


@dataclass(frozen=True)
class GroupSizeSweep:
    """cos(g_{G′}, g_G) against G′ (module doc)."""
    full_g: int                         # G
    sizes: tuple                        # the G′ values, ascending, each in [2, G − 1]
    draws: int                          # seeded subsample draws per G′
    cosines: torch.Tensor               # (len(sizes), draws) cos(g_{G′}, g_G); NaN when g_{G′} = 0
    norm_ratio: torch.Tensor            # (len(sizes), draws) ‖g_{G′}‖ / ‖g_G‖
    cos_mean: tuple                     # per G′: mean over the finite draws (NaN if none)
    cos_std: tuple                      # per G′: standard deviation (n − 1) over the finite draws (NaN if < 2)
    zero_signal_draws: tuple            # per G′: draws whose kept groups all had zero reward std (no PG signal)
    seed: int
    flags: tuple                        # human-readable problems (zero-std draws, a non-finite gradient)
    seconds: float


def default_sizes(g: int, max_sizes: int = 3) -> tuple:
    """G′ values to try: 2 … G − 1, at most `max_sizes` of them spread evenly (the smallest always in)."""
    sizes = list(range(2, g))
    if len(sizes) > max_sizes:
        step = (len(sizes) - 1) / (max_sizes - 1)
        sizes = sorted({sizes[round(i * step)] for i in range(max_sizes)})
    return tuple(sizes)


def check_sizes(sizes: Sequence[int], g: int) -> tuple:
    """The G′ values, validated: integers with 2 ≤ G′ < G (a group std needs 2; G′ = G is the step itself)."""
    out = tuple(sorted({int(s) for s in sizes}))
    bad = [s for s in out if not 2 <= s < g]
    if bad:
        raise ConfigError("group_sizes", f"G′ = {bad}: each must satisfy 2 ≤ G′ < G = {g} (G′ ≥ G is the full step; "
                          "G′ < 2 has no group std)")
    return out


def subsample_rows(num_prompts: int, g: int, g_sub: int, generator: torch.Generator) -> torch.Tensor:
    """(B·G′,) row indices: for each group, G′ of its G rows (uniform, without replacement), kept in TRL order
    (a group's rows consecutive, ascending)."""
    picks = [b * g + torch.randperm(g, generator=generator)[:g_sub].sort().values for b in range(num_prompts)]
    return torch.cat(picks)                                                 # (B·G′,)


def gram64(rows: torch.Tensor, chunk: int = 1 << 20) -> torch.Tensor:
    """(K, K) float64 Gram matrix rows·rowsᵀ of a (K, P) tensor, accumulated over chunks of P (no (K, P) float64
    copy). Why float64: ONE float32 reduction over P ≈ 5·10⁶ entries is off by ~1e-3 relative (measured 6.5e-4 on
    ‖Σ_b g_b‖ of the tiny model), while update() takes a norm of per-parameter norms (error ~1e-8)."""
    k, p = rows.shape
    out = torch.zeros(k, k, dtype=torch.float64, device=rows.device)
    for i in range(0, p, chunk):
        c = rows[:, i:i + chunk].to(torch.float64)                          # (K, chunk)
        out += c @ c.T
    return out


def _cos(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(cos(a, b), ‖a‖ / ‖b‖) in float64 over chunks (a float32 reduction over P is off by ~1e-3)."""
    gr = gram64(torch.stack([a, b]))                                        # (2, 2)
    na, nb = math.sqrt(float(gr[0, 0])), math.sqrt(float(gr[1, 1]))
    if na == 0 or nb == 0 or not (math.isfinite(na) and math.isfinite(nb)):
        return math.nan, (na / nb if nb > 0 else math.nan)
    return float(gr[0, 1]) / (na * nb), na / nb


def group_size_sweep(forward, rewards: torch.Tensor, config, full_grad: torch.Tensor, *,
                     sizes: Optional[Sequence[int]] = None, draws: int = 2, seed: int = 0) -> GroupSizeSweep:
    """cos(g_{G′}, g_G) for each G′ in `sizes` (default `default_sizes(G)`), `draws` seeded draws each.

    `forward`: the diagnostics' `GradForward` (one grad forward over the N rows, reused: one backward per draw);
    `rewards`: (N,) the step's summed rewards; `full_grad`: (P,) g_G on the same forward."""
    from rookworld_debug.grpo.registry import advantages_from_config
    t0 = time.perf_counter()
    g = config.num_generations
    n = rewards.shape[0]
    if g < 3:
        raise ConfigError("num_generations", f"G = {g}: no G′ with 2 ≤ G′ < G to compare with")
    sizes = check_sizes(default_sizes(g) if sizes is None else sizes, g)
    if draws < 1:
        raise ConfigError("draws", f"need ≥ 1 draw per G′, got {draws}")
    gen = torch.Generator().manual_seed(seed)
    flags = [] if bool(full_grad.any()) else ["the full-G gradient is 0 (no PG, KL or entropy signal): every cosine "
                                              "is undefined (NaN)"]
    cos = torch.full((len(sizes), draws), math.nan, dtype=torch.float64)   # (S, D)
    ratio = torch.full((len(sizes), draws), math.nan, dtype=torch.float64)  # (S, D)
    zero = []
    for i, gs in enumerate(sizes):
        cfg = config.replace(num_generations=gs)
        z = nan_draws = 0
        for d in range(draws):
            rows = subsample_rows(n // g, g, gs, gen)                       # (B·G′,)
            nan_draws += bool(torch.isnan(rewards[rows]).any())
            adv = advantages_from_config(rewards[rows], cfg)
            z += len(adv.zero_std_groups) == n // g
            grad = forward.grad(forward.loss(rows, adv.advantages, gs).loss)   # (P,)
            if not bool(torch.isfinite(grad).all()):
                flags.append(f"G′ = {gs}, draw {d}: non-finite gradient (a NaN reward or advantage); cosine NaN")
                continue
            cos[i, d], ratio[i, d] = _cos(grad, full_grad)
        zero.append(z)
        if nan_draws:
            flags.append(f"G′ = {gs}: {nan_draws}/{draws} draws kept an unscorable (NaN) reward; the advantage "
                         "function treats it as the step does")
        if z:
            flags.append(f"G′ = {gs}: {z}/{draws} draws kept only zero-std groups (no PG signal; only KL/entropy)")
    means, stds = [], []
    for i in range(len(sizes)):
        c = cos[i][torch.isfinite(cos[i])]
        means.append(float(c.mean()) if c.numel() else math.nan)
        stds.append(float(c.std()) if c.numel() > 1 else math.nan)
    return GroupSizeSweep(full_g=g, sizes=sizes, draws=draws, cosines=cos, norm_ratio=ratio, cos_mean=tuple(means),
                          cos_std=tuple(stds), zero_signal_draws=tuple(zero), seed=seed, flags=tuple(flags),
                          seconds=time.perf_counter() - t0)
