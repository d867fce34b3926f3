"""Advantages phase: rewards (N,) → per-completion advantages (N,), TRL-exact; the record every family fills.

Shape legend: B prompts, G generations per prompt (= num_generations), N = B·G rows. Row i belongs to
group i // G (TRL's RepeatSampler puts a prompt's G copies consecutively).

TRL (`GRPOTrainer._generate_and_score_completions`, `multi_objective_aggregation="sum_then_normalize"`):

    mean_g = nanmean(r over group g)                           # per group, for every scale_rewards
    std    = nanstd(r over group g)      if scale_rewards in ("group", "none")
             nanstd(r over the batch)    if scale_rewards == "batch"
    A      = r − mean_g
    A      = A / (std + 1e-4)            unless scale_rewards == "none"
    A      = nan_to_num(A, nan=0)        # NaN reward or < 2 valid rewards in the group → A = 0
    frac_reward_zero_std = mean(isclose(std, 0))   # per sample, with the std that scaled it

`nanstd` ignores NaNs and applies Bessel's correction (n−1); it is NaN when fewer than 2 values are valid.

±inf rewards (deliberate deviation from TRL): TRL would let one inf poison its whole group (group scaling:
mean inf → every advantage NaN → 0), the whole batch (scale_rewards="batch") or turn the group's other
advantages into ∓3.4e38 (scale_rewards="none": nan_to_num maps −inf to −max float). Here an infinite reward
is treated as unscorable, exactly like NaN/None: excluded from mean/std, advantage 0, row flagged. The
record's `rewards` keeps the inf so views show what the reward function returned.
`std_ddof=0` (population std) and `clip` are our extensions; the defaults reproduce TRL exactly.

Other families' advantages (rookworld-trl's manual variant, rookworld-rlvr's mini) live with their family
(grpo/families/) and return the same `Advantages` record, built by `finish_advantages`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from rookworld_debug.errors import ConfigError

SCALE_REWARDS = ("group", "batch", "none")


@dataclass(frozen=True)
class Advantages:
    """Per-completion advantages and everything needed to explain them."""
    advantages: torch.Tensor            # (N,) final advantages (after nan→0 and the optional clip)
    rewards: torch.Tensor               # (N,) input rewards (float; NaN = unscorable)
    group_mean: torch.Tensor            # (B,) nanmean of rewards per group
    group_std: torch.Tensor             # (B,) nanstd (ddof=std_ddof) of rewards per group (NaN if < 2 valid)
    denominator: torch.Tensor           # (N,) what A = (r − mean_g) was divided by (std + eps, clamped std, or 1)
    zero_std_groups: tuple              # group indices whose valid rewards are all equal (isclose(group_std, 0))
    frac_reward_zero_std: float         # TRL metric: fraction of samples whose scaling std isclose 0
    normalization: str                  # the exact formula used, human-readable
    method: str                         # "trl" or "manual"
    num_generations: int                # G
    scale_rewards: str                  # "group" | "batch" | "none" ("group" for manual)
    eps: float                          # ε added to the std (TRL) or the std clamp floor (manual)
    std_ddof: int                       # 1 = n−1 (TRL)
    clip: Optional[float]               # ±clip applied after normalisation (None = no clip)
    n_clipped_low: int                  # advantages clipped at −clip
    n_clipped_high: int                 # advantages clipped at +clip
    nan_reward_indices: tuple           # rows whose reward is NaN or ±inf (unscorable: advantage forced to 0)
    n_nonfinite_rewards: int            # NaN or ±inf rewards
    n_nan_advantages_zeroed: int        # advantages that were NaN before nan_to_num (→ 0)
    degenerate_groups: tuple            # groups with < 2 valid rewards (std undefined → advantages 0)
    batch_std: float                    # nanstd (ddof) of all rewards (TRL's `reward_std` metric)
    flags: tuple                        # human-readable warnings (empty when nothing is off)

    @property
    def B(self) -> int:
        return int(self.group_mean.shape[0])

    @property
    def grouped(self) -> torch.Tensor:
        """(B, G) view of the advantages."""
        return self.advantages.view(-1, self.num_generations)

    @property
    def metrics(self) -> dict:
        """TRL's logged keys for this phase: reward, reward_std, frac_reward_zero_std."""
        r = self.rewards
        return {"reward": float(torch.nanmean(r)) if r.numel() else float("nan"),
                "reward_std": self.batch_std,
                "frac_reward_zero_std": self.frac_reward_zero_std}


def nanstd(x: torch.Tensor, dim: Optional[int] = None, ddof: int = 1) -> torch.Tensor:
    """NaN-ignoring std with `ddof` (TRL's `trl.trainer.utils.nanstd` op-for-op when ddof=1; NaN when the
    number of valid values is ≤ ddof). dim=None reduces everything to a 0-dim tensor."""
    d = dim if dim is not None else tuple(range(x.dim()))
    mean = torch.nanmean(x, dim=d, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=d, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=d, keepdim=True)
    correction = count / (count - ddof)
    correction = torch.where(count > ddof, correction, torch.full_like(correction, float("nan")))
    variance = variance * correction
    std = torch.sqrt(variance)
    return std.squeeze(d) if dim is not None else std.reshape(())


def check_knobs(std_ddof: int, floor: tuple, clip: tuple) -> None:
    """ConfigError for a std ddof other than 0/1, a negative std floor (name, value) or a clip (name, value) that
    is neither None nor > 0."""
    if std_ddof not in (0, 1):
        raise ConfigError("std_ddof", f"must be 0 or 1, got {std_ddof!r}")
    if floor[1] < 0:
        raise ConfigError(floor[0], f"must be ≥ 0, got {floor[1]!r}")
    if clip[1] is not None and not clip[1] > 0:
        raise ConfigError(clip[0], f"must be > 0 or None, got {clip[1]!r}")


def as_rewards(rewards, num_generations: int) -> torch.Tensor:
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 1:
        raise ConfigError("num_generations", f"must be an integer ≥ 1, got {num_generations!r}")
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.to(torch.float32)
    r = r.detach().clone().reshape(-1)                                      # (N,)
    if r.numel() % num_generations != 0:
        raise ConfigError("num_generations", f"{r.numel()} rewards are not a whole number of groups of "
                          f"{num_generations}")
    return r


def unscorable_inf(r: torch.Tensor) -> torch.Tensor:
    """±inf → NaN (unscorable), so one inf cannot poison its group/batch; see the module docstring."""
    return r.masked_fill(torch.isinf(r), float("nan"))                     # (N,)


def finish_advantages(r, G, adv, group_mean, group_std, denom, is_std_zero, *, normalization, method, scale, eps, ddof,
            clip, raw=None) -> Advantages:
    """`r`: rewards as used (inf already → NaN); `raw`: the rewards as given (kept in the record)."""
    raw = r if raw is None else raw
    nan_before = torch.isnan(adv)                                           # (N,)
    adv = torch.nan_to_num(adv, nan=0.0)                                    # (N,) TRL: unscorable → 0
    n_lo = n_hi = 0
    if clip is not None:
        n_lo = int((adv < -clip).sum())
        n_hi = int((adv > clip).sum())
        adv = adv.clamp(-clip, clip)                                        # (N,)
    valid = ~torch.isnan(r)                                                 # (N,)
    n_valid = valid.view(-1, G).sum(1)                                      # (B,)
    zero_std = torch.isclose(group_std, torch.zeros_like(group_std))        # (B,)
    zero_std_groups = tuple(int(g) for g in torch.nonzero(zero_std).flatten())
    degenerate = tuple(int(g) for g in torch.nonzero(n_valid <= ddof).flatten()) if G > 1 else ()
    inf_idx = tuple(int(i) for i in torch.nonzero(torch.isinf(raw)).flatten())
    nan_idx = tuple(int(i) for i in torch.nonzero(~valid).flatten())      # NaN, None and inf rows
    n_nonfinite = int((~torch.isfinite(raw)).sum())
    batch_std = float(nanstd(r, ddof=ddof)) if r.numel() > 1 else float("nan")
    B = group_mean.shape[0]
    flags = []
    nan_only = [i for i in nan_idx if i not in inf_idx]
    if nan_only:
        flags.append(f"{len(nan_only)} NaN reward(s) at rows {nan_only}: advantage forced to 0")
    if inf_idx:
        flags.append(f"{len(inf_idx)} infinite reward(s) at rows {list(inf_idx)}: treated as unscorable "
                     "(excluded from mean/std, advantage 0)")
    if degenerate:
        flags.append(f"groups {list(degenerate)} have < {ddof + 1} valid rewards: std undefined, advantages 0")
    if zero_std_groups:
        which = "all groups" if len(zero_std_groups) == B else f"groups {list(zero_std_groups)}"
        flags.append(f"{which} have zero reward std: no policy-gradient signal from them")
    if n_lo or n_hi:
        flags.append(f"{n_lo + n_hi} advantage(s) clipped at ±{clip:g}")
    return Advantages(
        advantages=adv, rewards=raw, group_mean=group_mean, group_std=group_std, denominator=denom,
        zero_std_groups=zero_std_groups, frac_reward_zero_std=float(is_std_zero.float().mean()) if r.numel() else 0.0,
        normalization=normalization, method=method, num_generations=G, scale_rewards=scale, eps=float(eps),
        std_ddof=ddof, clip=clip, n_clipped_low=n_lo, n_clipped_high=n_hi, nan_reward_indices=nan_idx,
        n_nonfinite_rewards=n_nonfinite, n_nan_advantages_zeroed=int(nan_before.sum()),
        degenerate_groups=degenerate, batch_std=batch_std, flags=tuple(flags))


def compute_advantages(rewards: Union[torch.Tensor, Sequence[float]], num_generations: int, *,
                       scale_rewards: str = "group", eps: float = 1e-4, std_ddof: int = 1,
                       clip: Optional[float] = None) -> Advantages:
    """TRL-exact group-relative advantages of `rewards` (N,), grouped in consecutive blocks of `num_generations`.

    Defaults reproduce `GRPOTrainer` (sum_then_normalize, scale_rewards="group", ε=1e-4, Bessel std). `clip`
    (± after normalisation) and `std_ddof=0` are extensions. NaN rewards are allowed (unscorable) and get
    advantage 0, exactly as TRL's `nan_to_num`.
    """
    if scale_rewards is True:
        scale_rewards = "group"
    elif scale_rewards is False:
        scale_rewards = "none"
    if scale_rewards not in SCALE_REWARDS:
        raise ConfigError("scale_rewards", f"unknown value {scale_rewards!r}; expected one of {list(SCALE_REWARDS)}")
    check_knobs(std_ddof, ("adv_eps", eps), ("adv_clip", clip))
    G = num_generations
    raw = as_rewards(rewards, G)                                           # (N,)
    r = unscorable_inf(raw)                                                # (N,)
    grouped = r.view(-1, G)                                                 # (B, G)
    group_mean = torch.nanmean(grouped, dim=1)                              # (B,)
    mean_rep = group_mean.repeat_interleave(G, dim=0)                       # (N,)
    group_std = nanstd(grouped, dim=1, ddof=std_ddof) if G > 1 else torch.zeros_like(group_mean)  # (B,)
    if scale_rewards in ("group", "none"):
        std = group_std.repeat_interleave(G, dim=0)                         # (N,)
        std_name = f"std_g(ddof={std_ddof})"
    else:
        std = (nanstd(r, ddof=std_ddof).expand_as(r) if r.numel() > 1 else torch.zeros_like(r))  # (N,)
        std_name = f"std_batch(ddof={std_ddof})"
    adv = r - mean_rep                                                      # (N,)
    if scale_rewards != "none":
        denom = std + eps                                                   # (N,)
        adv = adv / denom                                                   # (N,)
        formula = f"A=(r-mean_g)/({std_name}+{eps:g})"
    else:
        denom = torch.ones_like(r)                                          # (N,)
        formula = "A=r-mean_g"
    formula += f", scale_rewards={scale_rewards}, NaN→0"
    if clip is not None:
        formula += f", clipped to ±{clip:g}"
    is_std_zero = torch.isclose(std, torch.zeros_like(std))                 # (N,) TRL's logging rule
    return finish_advantages(r, G, adv, group_mean, group_std, denom, is_std_zero, normalization=formula, method="trl",
                   scale=scale_rewards, eps=eps, ddof=std_ddof, clip=clip, raw=raw)
