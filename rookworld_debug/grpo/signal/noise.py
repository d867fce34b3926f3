"""Signal or noise: what one step's update is made of.

* :func:`per_group_grads` — g_b, the gradient of the step's loss restricted to group b's rows, with the
  batch's own normalizers (so Σ_b g_b = the step's gradient). One forward with grad, then one backward per
  group: ∂loss/∂ℓ and ∂loss/∂H are taken once, and group b's backward keeps only its rows of them (each
  row's loss term depends on its own log-probs only; the normalizers are constants of the mask).
* :func:`noise_scale` — the gradient noise scale of McCandlish et al. 2018 ("An Empirical Model of
  Large-Batch Training") across the B groups, with a bootstrap interval over groups.
* :func:`paired_bootstrap_ci` — a paired bootstrap interval of mean(after − before).

Estimators (every view states them):

* ḡ = (1/B) Σ_b g_b, the mean group gradient (the step's gradient is B·ḡ for the sum of groups);
* tr Σ̂ = Σ_b |g_b − ḡ|² / (B − 1), unbiased trace of the covariance of one group's gradient;
* |G|²_est = |ḡ|² − tr Σ̂ / B, unbiased estimate of the true mean gradient's squared norm;
* B_simple = tr Σ̂ / |G|²_est (groups per step at which SNR = 1), SNR = |G|²_est / (tr Σ̂ / B) = B / B_simple.

When |G|²_est ≤ 0 the between-group spread explains all of |ḡ|²: the step is indistinguishable from
noise at this B. Then ``pure_noise`` is True, SNR is reported as 0 and B_simple / groups_for_snr_1 as inf.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from rookworld_debug.grpo.signal.group_size import gram64   # the float64 Gram matrix (norms, cosines)


@dataclass(frozen=True)
class NoiseScale:
    """Gradient noise scale across B groups (definitions in the module doc)."""
    num_groups: int                     # B
    mean_grad: torch.Tensor             # (P,) ḡ
    mean_grad_sq: float                 # |ḡ|²
    trace_sigma: float                  # tr Σ̂ = Σ_b |g_b − ḡ|² / (B − 1)
    grad_sq: float                      # |G|²_est = |ḡ|² − tr Σ̂ / B
    b_simple: float                     # tr Σ̂ / |G|²_est (inf when pure noise)
    snr: float                          # |G|²_est / (tr Σ̂ / B) (0 when pure noise)
    groups_for_snr_1: float             # ceil(B_simple): groups per step at which SNR reaches 1 (inf when pure noise)
    pure_noise: bool                    # |G|²_est ≤ 0
    snr_ci: tuple                       # (low, high) bootstrap over groups (level in ci_level); NaN when B < 3 or n_boot = 0
    ci_level: float
    trustworthy: bool                   # B ≥ 8: tr Σ̂ has B − 1 degrees of freedom; with fewer the figure is loose
    note: str


def _gram_stats(gram: torch.Tensor) -> tuple[float, float, float]:
    """(|ḡ|², tr Σ̂, |G|²_est) from the B×B Gram matrix g_a·g_b (float64)."""
    b = gram.shape[0]
    mean_sq = float(gram.sum()) / b ** 2                                  # |ḡ|²
    trace_sigma = (float(torch.diagonal(gram).sum()) - b * mean_sq) / (b - 1)   # Σ|g_b|² − B|ḡ|², over B − 1
    return mean_sq, trace_sigma, mean_sq - trace_sigma / b


def _snr(b: int, trace_sigma: float, grad_sq: float) -> float:
    if grad_sq <= 0:
        return 0.0
    return grad_sq / (trace_sigma / b) if trace_sigma > 0 else math.inf


def noise_scale(per_group_grads: torch.Tensor, *, n_boot: int = 2000, seed: int = 0, level: float = 0.9,
                gram: Optional[torch.Tensor] = None) -> NoiseScale:
    """The noise-scale record of a (B, P) tensor of group gradients (see module doc). ``gram``: their float64
    Gram matrix when the caller has it (`gram64`)."""
    from rookworld_debug.errors import ConfigError
    g = per_group_grads.detach()
    if g.ndim != 2 or g.shape[0] < 2:
        raise ConfigError("per_group_grads", f"need a (B, P) tensor with B ≥ 2 groups, got shape {tuple(g.shape)}")
    check_bootstrap(n_boot, level, allow_zero=True)
    b = g.shape[0]
    if not bool(torch.isfinite(g).all()):
        from rookworld_debug.errors import NumericalError
        raise NumericalError("noise_scale: the group gradients hold NaN/inf (a non-finite loss or reward)")
    gram = gram64(g) if gram is None else gram                             # (B, B) float64
    mean_sq, trace_sigma, grad_sq = _gram_stats(gram)
    pure = grad_sq <= 0
    b_simple = math.inf if pure else trace_sigma / grad_sq
    ci = _snr_bootstrap(gram, n_boot, seed, level) if b >= 3 and n_boot > 0 else (math.nan, math.nan)
    trust = b >= 8
    note = ("pure noise at this batch: the spread between groups explains all of |ḡ|²" if pure else
            f"B = {b} groups: tr Σ̂ has {b - 1} degrees of freedom" + ("" if trust else "; the estimate is loose, "
                                                                                    "read the interval"))
    if b < 3 or n_boot == 0:
        note += ("; no interval: " + ("n_boot = 0 resamples" if n_boot == 0 else "a bootstrap over 2 groups "
                                      "has only 3 distinct resamples"))
    return NoiseScale(num_groups=b, mean_grad=g.mean(0), mean_grad_sq=mean_sq,
                      trace_sigma=trace_sigma, grad_sq=grad_sq, b_simple=b_simple, snr=_snr(b, trace_sigma, grad_sq),
                      groups_for_snr_1=math.inf if pure else float(math.ceil(b_simple)), pure_noise=pure,
                      snr_ci=ci, ci_level=level, trustworthy=trust, note=note)


def check_bootstrap(n_boot, level, *, allow_zero: bool = False) -> None:
    """ConfigError unless `n_boot` is an integer ≥ 1 (≥ 0 with `allow_zero`: no interval) and 0 < level < 1."""
    from rookworld_debug.errors import ConfigError
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < (0 if allow_zero else 1):
        raise ConfigError("n_boot", f"need an integer number of bootstrap resamples ≥ {0 if allow_zero else 1}, "
                                    f"got {n_boot!r}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ConfigError("level", f"the interval's level must lie strictly between 0 and 1, got {level!r}")


def noise_scale_skipped(num_groups: int, reason: str, level: float = 0.9) -> NoiseScale:
    """The noise-scale record of a batch it cannot be computed on (e.g. B = 1): every figure NaN, `note` says why."""
    nan = math.nan
    return NoiseScale(num_groups=num_groups, mean_grad=torch.empty(0), mean_grad_sq=nan, trace_sigma=nan, grad_sq=nan,
                      b_simple=nan, snr=nan, groups_for_snr_1=nan, pure_noise=False, snr_ci=(nan, nan),
                      ci_level=level, trustworthy=False, note=f"not computed: {reason}")


def _snr_bootstrap(gram: torch.Tensor, n_boot: int, seed: int, level: float) -> tuple[float, float]:
    """Percentile interval of the SNR when the B groups are resampled with replacement (on the Gram matrix:
    no (B, P) copies). Resamples that repeat one group only (tr Σ̂ = 0) count as SNR = inf."""
    gram = gram.cpu()                          # (B, B): resampled on the CPU, where its generator draws
    b = gram.shape[0]
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, b, (n_boot, b), generator=gen)                  # (n_boot, B)
    counts = torch.zeros(n_boot, b, dtype=gram.dtype).scatter_add_(1, idx, torch.ones_like(idx, dtype=gram.dtype))
    # a resample's Gram sums through its counts c: Σ_ij G[idx_i, idx_j] = cᵀGc, Σ_i G[idx_i, idx_i] = c·diag(G)
    mean_sq = torch.einsum("nb,bc,nc->n", counts, gram, counts) / b ** 2
    trace_sigma = (counts @ torch.diagonal(gram) - b * mean_sq) / (b - 1)
    grad_sq = mean_sq - trace_sigma / b
    snr = torch.where(grad_sq <= 0, torch.zeros_like(grad_sq),
                      torch.where(trace_sigma > 0, grad_sq / (trace_sigma / b).clamp_min(1e-300),
                                  torch.full_like(grad_sq, math.inf)))
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    q = torch.quantile(snr.clamp(max=1e300), torch.tensor([lo, hi], dtype=snr.dtype))
    return float(q[0]), float(q[1])


def paired_bootstrap_ci(before, after, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval (low, high) of mean(after − before), resampling the PAIRS with replacement.

    ``before``/``after``: equal-length sequences (the same prompts, greedy, before and after the update).
    Pairs with a NaN or ±inf on either side are dropped (an unscorable, flagged reward). Deterministic in ``seed``."""
    import numpy as np
    from rookworld_debug.errors import DataError
    check_bootstrap(n_boot, level)
    try:
        a = np.asarray(after, dtype=float)
        b = np.asarray(before, dtype=float)
    except (TypeError, ValueError) as err:
        raise DataError(f"paired_bootstrap_ci needs two sequences of numbers ({err})") from None
    if a.shape != b.shape or a.ndim != 1:
        raise DataError(f"paired_bootstrap_ci needs two equal-length 1-D sequences, got {b.shape} and {a.shape}")
    a, b = np.where(np.isfinite(a), a, np.nan), np.where(np.isfinite(b), b, np.nan)   # ±inf: unscorable, as NaN
    d = (a - b)[~(np.isnan(a) | np.isnan(b))]
    if d.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))                  # (n_boot, n)
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return (float(lo), float(hi))


class GradForward:
    """One forward WITH grad over all N rows at the step's start, shared by every gradient the diagnostics take
    (the per-group split, the G′ subsets): each is one backward through this graph (retain_graph).

    The forward runs row by row (N graphs, `parts`): a gradient is a backward through the graphs of the rows it
    reads only — a group's G rows, a G′ subset's B·G′ — where zeros on the other rows of one shared graph would
    cost as much as their gradients (a per-group gradient was 1 full backward; now 1/B of one)."""

    def __init__(self, policy, rollout, config):
        from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy
        from rookworld_debug.grpo.phases.generation import loss_mask
        from rookworld_debug.grpo.objective.params import Objective
        self.rollout, self.config = rollout, config
        self.params = [p for _, p in policy.named_parameters() if p.requires_grad]
        self.mask = loss_mask(rollout, config)                                          # (N, T)
        self.objective = Objective.from_config(config)
        self.need_entropy = self.objective.entropy_coef != 0 or self.objective.top_entropy_quantile < 1
        policy.train(False)                      # as update(): dropout off
        self.parts = [per_token_logps_and_entropy(
            policy, rollout.prompt_ids[r], rollout.prompt_mask[r], rollout.completion_ids[r], self.mask[r],
            rollout.temperatures[r], with_grad=True, entropy_grad=self.objective.entropy_coef != 0)
            for r in (slice(i, i + 1) for i in range(rollout.completion_ids.shape[0]))]        # (1, T) each
        self.logps = torch.cat([lp for lp, _ in self.parts])                                   # (N, T)
        self.entropy = torch.cat([h for _, h in self.parts])                                   # (N, T)

    def loss(self, rows: Optional[torch.Tensor], advantages: torch.Tensor, num_generations: int,
             old_per_token_logps: Optional[torch.Tensor] = None):
        """The step's loss record on `rows` (None = all N) with these advantages (len(rows),), the batch's
        normalizers recomputed for those rows (num_items_in_batch = their Σ mask)."""
        from rookworld_debug.grpo.phases.loss_inputs import loss_inputs
        sel = (lambda t: t) if rows is None else (lambda t: None if t is None else t[rows])
        # the rows' own graphs only (indexing the stacked tensor would reach every row's graph)
        logps, entropy = (self.logps, self.entropy) if rows is None else (
            torch.cat([self.parts[i][k] for i in rows.tolist()]) for k in (0, 1))             # (n, T) each
        if rows is not None:                           # the builder indexes (N,) advantages by rows: put these there
            advantages = advantages.new_zeros(self.mask.shape[0]).index_copy(0, rows.to(advantages.device), advantages)
        return loss_inputs(self.rollout, advantages, self.config, rows=rows, logps=logps,
                           old=sel(old_per_token_logps), entropy=entropy if self.need_entropy else None,
                           full_kl=None, objective=self.objective, mask=self.mask,
                           num_items_in_batch=float(sel(self.mask).sum()), num_generations=num_generations).loss()

    def grad(self, loss: torch.Tensor) -> torch.Tensor:
        """(P,) ∂loss/∂θ through the shared graph (kept for the next backward)."""
        if not loss.requires_grad:                # e.g. every advantage 0 and β = c_H = 0
            return torch.zeros(sum(p.numel() for p in self.params), device=self.params[0].device)
        gs = torch.autograd.grad(loss, self.params, retain_graph=True, allow_unused=True)
        return torch.cat([(x if x is not None else torch.zeros_like(p)).reshape(-1) for x, p in zip(gs, self.params)])


def per_group_grads(policy, rollout, advantages, config, *, old_per_token_logps: Optional[torch.Tensor] = None,
                    num_generations: Optional[int] = None, forward: Optional[GradForward] = None) -> torch.Tensor:
    """(B, P) gradients of the step's loss, one row per group (see module doc); Σ over rows = the gradient
    of the whole batch's loss. P = the trainable parameters of ``policy``, flattened in named order.
    ``forward``: a GradForward to reuse (one forward for every diagnostic)."""
    from rookworld_debug.models.devices import model_device, on_device
    g = num_generations or config.num_generations
    n_rows = rollout.completion_ids.shape[0]
    if g < 1 or n_rows % g or advantages.advantages.shape != (n_rows,):
        from rookworld_debug.errors import ConfigError
        raise ConfigError("num_generations", f"{n_rows} rollout rows do not form groups of G = {g} with one advantage "
                                             f"each (advantages {tuple(advantages.advantages.shape)})")
    dev = model_device(policy)                 # the records cross to the model's device (no-op when already there)
    rollout, advantages, old_per_token_logps = (on_device(x, dev) for x in (rollout, advantages, old_per_token_logps))
    fw = forward or GradForward(policy, rollout, config)
    rec = fw.loss(None, advantages.advantages, g, old_per_token_logps)
    outs = [t for t in (fw.logps, fw.entropy) if t.requires_grad]
    if not outs:                                   # no gradient anywhere (e.g. every advantage 0, β = c_H = 0)
        return torch.zeros((fw.logps.shape[0] // g, sum(p.numel() for p in fw.params)), device=fw.params[0].device)
    ups = torch.autograd.grad(rec.loss, outs, retain_graph=True, allow_unused=True)     # ∂loss/∂ℓ, ∂loss/∂H
    n = fw.logps.shape[0]
    rows = []
    for b in range(n // g):                        # group b's rows through their own graphs only
        pairs = [(o, u[i:i + 1]) for i in range(b * g, (b + 1) * g)
                 for o, u in zip([t for t in fw.parts[i] if t.requires_grad], ups) if u is not None]
        grads = torch.autograd.grad([o for o, _ in pairs], fw.params, grad_outputs=[u for _, u in pairs],
                                    retain_graph=True, allow_unused=True) if pairs else [None] * len(fw.params)
        rows.append(torch.cat([(x if x is not None else torch.zeros_like(p)).reshape(-1)
                               for x, p in zip(grads, fw.params)]))
    return torch.stack(rows)                                                # (B, P)


@dataclass(frozen=True)
class SignalNoise:
    """The step's signal-or-noise diagnostics (StepConfig.diagnostics), on the sampled rollout at the start of
    the step (the first optimizer step's gradient; μ > 1 passes are not decomposed)."""
    step_grad_norm: float               # ‖Σ_b g_b‖ (float64 from the Gram matrix) = the first optimizer step's
                                        #   grad norm before clipping (UpdateResult.grad_norm_pre_clip, to ~1e-5: row-by-row forwards round differently)
    group_grad_norms: torch.Tensor      # (B,) ‖g_b‖: each group's share of the step's gradient
    group_cos_step: torch.Tensor        # (B,) cos(g_b, Σ_b g_b)
    group_cos: torch.Tensor             # (B, B) cos(g_a, g_b)
    group_weights: torch.Tensor         # (B,) the group's share of Σ_i |per_seq_loss_i| (normalizers included)
    noise: NoiseScale                   # across the B groups (McCandlish et al. 2018)
    delta_reward_ci: tuple              # (low, high) paired bootstrap 95 % of greedy after − before, this batch
    delta_reward_heldout_ci: tuple      # the same on the held-out prompts ((nan, nan) without them)
    n_boot: int
    seconds: float
    group_size: Optional[object] = None  # grpo.signal.group_size.GroupSizeSweep: cos(g_{G′}, g_G) vs G′ (None: G < 3)
    entropy: Optional[object] = None    # grpo.signal.entropy_mechanism.EntropyMechanism: −η·Cov vs measured ΔH, clips
    gap: Optional[object] = None        # grpo.signal.sampler_gap.SamplerTrainerGap: sampler vs trainer log-probs
    seconds_parts: dict = field(default_factory=dict)   # {"forward+groups", "group_size", "entropy+gap"}: s


def sampler_label(config) -> str:
    """How the sampling loop ran (the sampler side of the gap)."""
    if config.sampling_autocast == "bf16":
        return "bf16 autocast (sampling_autocast='bf16')"
    return "bf16 autocast (autocast on CUDA)" if config.autocast == "bf16" else f"as the model (autocast={config.autocast!r})"


def signal_noise(policy, rollout, advantages, loss_record, config, *, n_boot: int = 2000,
                 group_size_draws: int = 2) -> "SignalNoise":
    """Per-group gradients at the step's start, their noise scale, the G′ sweep, the entropy-mechanism prediction
    and the sampler–trainer gap — all on ONE grad forward. The measured entropy change and the Δreward intervals
    are added after the update and the evaluation by :func:`with_delta_ci`."""
    import time
    from rookworld_debug.grpo.signal.entropy_mechanism import entropy_mechanism
    from rookworld_debug.grpo.signal.group_size import group_size_sweep
    from rookworld_debug.grpo.signal.sampler_gap import TRL_IS_CAP, sampler_trainer_gap
    from rookworld_debug.models.devices import model_device, on_device
    t0 = time.perf_counter()
    dev = model_device(policy)                 # the records cross to the model's device here; the result comes back
    rollout, advantages, loss_record = (on_device(x, dev) for x in (rollout, advantages, loss_record))
    fw = GradForward(policy, rollout, config)
    g = per_group_grads(policy, rollout, advantages, config, forward=fw)                  # (B, P)
    step = g.sum(0)                                                                      # (P,)
    gram = gram64(g)                                                                     # (B, B) float64
    norms = torch.diagonal(gram).clamp_min(0).sqrt()                                     # (B,)
    step_norm = float(gram.sum().clamp_min(0).sqrt())                                    # ‖Σ_b g_b‖
    cos = gram / (norms[:, None] * norms[None, :]).clamp_min(1e-300)                     # (B, B)
    cos_step = gram.sum(1) / (norms * step_norm).clamp_min(1e-300)                       # (B,)
    per_seq = loss_record.per_seq_loss.detach()                                          # (N,) row terms
    weights = per_seq.abs().reshape(-1, config.num_generations).sum(1)                   # (B,)
    weights = weights / weights.sum().clamp_min(1e-30)
    ns = noise_scale(g, n_boot=n_boot, seed=config.seed, gram=gram) if g.shape[0] >= 2 else noise_scale_skipped(
        g.shape[0], "the noise scale compares groups and this batch has one prompt (batch_size = 1); the per-group "
                    "gradient, entropy-mechanism and sampler-gap diagnostics still ran")
    t1 = time.perf_counter()
    sweep = group_size_sweep(fw, advantages.rewards, config, step, draws=group_size_draws, seed=config.seed) \
        if config.num_generations >= 3 else None
    t2 = time.perf_counter()
    logps, ent = fw.logps.detach(), fw.entropy.detach()                                  # (N, T) trainer, θ_0
    em = entropy_mechanism(logps, ent, advantages.advantages, fw.mask, config.lr)
    cap = config.vllm_importance_sampling_clip_max or TRL_IS_CAP     # C of the truncated weights
    gap = sampler_trainer_gap(rollout.sampling_per_token_logps, logps, fw.mask, cap=cap, sampler=sampler_label(config),
                              trainer="fp32 teacher-forced forward at the step's start (the diagnostics' grad forward)")
    del fw
    nan = (math.nan, math.nan)
    t3 = time.perf_counter()
    return on_device(SignalNoise(step_grad_norm=step_norm, group_grad_norms=norms.float(), group_cos_step=cos_step.float(),
                       group_cos=cos.float(), group_weights=weights,
                       noise=replace(ns, mean_grad=torch.empty(0)),   # ḡ (P,) is not kept in the trace
                       delta_reward_ci=nan, delta_reward_heldout_ci=nan, n_boot=n_boot, seconds=t3 - t0,
                       group_size=sweep, entropy=em, gap=gap,
                       seconds_parts={"forward+groups": t1 - t0, "group_size": t2 - t1, "entropy+gap": t3 - t2}),
                     "cpu")


def with_delta_ci(sn: "SignalNoise", evaluation, seed: int, *, iterations=(),
                  mask: Optional[torch.Tensor] = None) -> "SignalNoise":
    """`sn` after the update: the paired bootstrap intervals of the greedy Δreward (batch and held-out) and, given
    the loss `mask` (N, T), the measured entropy change on the sampled tokens (after the whole update: the
    evaluation's forward; after one optimizer step: the next inner pass's grad forward when μ > 1) with each inner
    pass's clip events (`iterations`: the step's IterationRecords)."""
    if sn.entropy is not None and mask is not None:
        from rookworld_debug.grpo.signal.entropy_mechanism import with_measured
        first = None
        if len(iterations) > 1 and len(iterations[0].updates) == 1 and iterations[1].updates:
            first = torch.cat([u.per_token_entropy for u in iterations[1].updates])    # (N, T) at θ_1
        after = getattr(evaluation, "per_token_entropy_after", None)                   # (N, T) or None
        sn = replace(sn, entropy=with_measured(sn.entropy, mask, after, first, [it.loss for it in iterations]))
    if evaluation is None:
        return sn
    batch = paired_bootstrap_ci(evaluation.batch_before.rewards.tolist(), evaluation.batch_after.rewards.tolist(),
                                n_boot=sn.n_boot, seed=seed)
    held = (paired_bootstrap_ci(evaluation.heldout_before.rewards.tolist(), evaluation.heldout_after.rewards.tolist(),
                                n_boot=sn.n_boot, seed=seed)
            if evaluation.heldout_before is not None and evaluation.heldout_after is not None else (math.nan, math.nan))
    return replace(sn, delta_reward_ci=batch, delta_reward_heldout_ci=held)
