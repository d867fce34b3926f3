"""The one-step counterfactual: the recorded rollout, updated again under each arm's configuration.

Shape legend: B prompts, G generations, N = B·G rows, T completion tokens.

No generation per arm: every arm starts from the same weights and AdamW moments (`state.restore`), takes the
recorded rollout, recomputes the advantages from the recorded rewards under its own settings (scale_rewards,
loss_type='manual'...), and runs the update with the project's own phases (`grpo.phases.iterations.run_iterations`:
μ passes × steps per generation). Measured after the update, on the same rows and prompts for every arm:

- update size: ‖θ_after − θ_start‖₂ and, per layer, ‖Δθ_l‖₂ / ‖θ_l‖₂ (update-to-weight ratio);
- KL after: token mean over the mask of the k3 estimate exp(d) − d − 1, d = logπ_ref − logπ_after, on the
  sampled tokens (the rollout's ref log-probs);
- ratio after: r = exp(logπ_after − logπ_start) per token: its mean and max over the mask, and the fraction of
  tokens outside [1 − ε_low, 1 + ε_high] (what the next pass's clip would see);
- Δlog-prob: masked token mean of logπ_after − logπ_start; Pearson(advantage, per-row mean Δlogp);
- greedy before/after on the same B prompts (built-in reward, mean over prompts; completions that changed).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from rookworld_debug.errors import ConfigError, NumericalError
from rookworld_debug.whatif.overrides import sampling_fields, Arm
from rookworld_debug.whatif.state import SavedState, restore


@dataclass(frozen=True)
class Recorded:
    """The step every arm re-updates: its rollout and what was computed from it."""
    rollout: object                     # grpo.phases.generation.Rollout (N rows)
    rewards: object                     # grpo.phases.rewards.Rewards
    advantages: object                  # grpo.phases.advantages.Advantages (the recorded ones)
    loss: object                        # grpo.objective.loss.LossBreakdown (the recorded record)
    before: object                      # grpo.phases.evaluation.GreedyEval: greedy on the B prompts at the start
    regenerated: bool                   # True: sampled again from the step's seed (checkpoint source)


@dataclass(frozen=True)
class OneStepArm:
    """One arm's update of the recorded rollout and what it did (module doc for each number)."""
    name: str
    overrides: dict
    loss: float                         # the loss the update's grad path computed (first optimizer step)
    grad_norm_pre_clip: float           # first optimizer step
    grad_norm_post_clip: float
    lr: float
    optimizer_steps: int
    param_delta_norm: float             # ‖θ_after − θ_start‖₂ over all optimizer steps
    update_to_weight: dict              # layer -> ‖Δθ_l‖₂ / ‖θ_l‖₂
    kl_after: float                     # k3 token mean vs the reference, after the update
    ratio_mean: float                   # masked token mean of exp(logπ_after − logπ_start)
    ratio_max: float
    frac_outside_clip: float            # tokens with r ∉ [1 − ε_low, 1 + ε_high]
    delta_logp_mean: float              # masked token mean of logπ_after − logπ_start
    corr_adv_delta_logp: float          # Pearson(A, per-row mean Δlogp)
    entropy_after: float                # masked token mean of the tempered policy's entropy after
    greedy_before: float                # mean built-in reward of greedy completions on the B prompts, start
    greedy_after: float                 # same prompts, after this arm's update
    greedy_changed: int                 # prompts whose greedy completion changed
    seconds: float
    refused: Optional[str] = None       # the update refused (NumericalError): why
    first_update: Optional[object] = field(default=None, repr=False)   # UpdateResult of the first optimizer step

    def to_dict(self) -> dict:
        from rookworld_debug.whatif.stats import _num
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("first_update",)}
        out["update_to_weight"] = {k: _num(v) for k, v in self.update_to_weight.items()}
        return {k: (_num(v) if isinstance(v, float) else v) for k, v in out.items()}


def recorded(state: SavedState) -> Recorded:
    """The trace's rollout, or (checkpoint source) the step sampled again from its seed at the start state."""
    from rookworld_debug.grpo.phases.evaluation import greedy_evals, greedy_prompts
    from rookworld_debug.grpo.phases.shared import sample_and_score
    s, c = state.session, state.config
    batch = (s.batch.prompts, s.batch.tasks, s.batch.completions)
    if state.trace is not None:
        t = state.trace
        return Recorded(t.rollout, t.rewards, t.advantages, t.loss, t.before, False)
    # exactly as run_step samples: the greedy rows (batch + held-out) ride in the same decode loop
    heldout = ([x.prompt for x in s.heldout], [x.task for x in s.heldout], [x.completion for x in s.heldout]) \
        if s.heldout else None
    restore(state)
    rollout, rewards, adv, loss, greedy = sample_and_score(s, c, greedy_prompts=greedy_prompts(batch, heldout))
    before, _ = greedy_evals(s.policy, s.tokenizer, batch, heldout, max_new_tokens=c.eval_max_new_tokens,
                             reward_mode=c.reward_mode, engine=s.engine, completions=greedy)
    return Recorded(rollout, rewards, adv, loss, before, True)


def check_same_rollout(arm: Arm) -> None:
    bad = sorted(set(arm.overrides) & set(sampling_fields()))
    if bad:
        raise ConfigError(",".join(bad), f"arm {arm.name!r}: {bad} shape the sampling, so the one-step counterfactual "
                          "on the recorded rollout cannot change them; branch k steps instead (--steps k)")


def run_arm(state: SavedState, rec: Recorded, arm: Arm) -> OneStepArm:
    """Restore the start, update the recorded rollout under the arm's config, measure (module doc)."""
    from rookworld_debug.grpo.families import advantages_from_config
    from rookworld_debug.grpo.phases.iterations import run_iterations
    from rookworld_debug.grpo.phases.setup import reuse_session
    from rookworld_debug.grpo.phases.shared import loss_for
    check_same_rollout(arm)
    t0 = time.perf_counter()
    cfg = arm.config(state.config)
    restore(state)
    s = reuse_session(state.session, cfg)      # the arm's precision and reference placement, applied to the models
    _set_optimizer(s.optimizer, cfg)
    adv = rec.advantages if not arm.overrides else advantages_from_config(rec.rewards.rewards, cfg)
    loss = rec.loss if not arm.overrides else loss_for(rec.rollout, adv, cfg)
    flags: list = []
    try:
        its = run_iterations(s.policy, s.optimizer, rec.rollout, adv, cfg, reference=s.reference, loss_record=loss,
                             flags=flags)
    except NumericalError as err:
        return _refused(arm, str(err), rec, time.perf_counter() - t0)
    ups = [u for it in its for u in it.updates]
    return _measure(state, rec, arm, cfg, adv, ups, time.perf_counter() - t0)


def _set_optimizer(optimizer, cfg) -> None:
    """The arm's AdamW hyper-parameters on the restored moments (load_state_dict brought back the saved ones)."""
    for g in optimizer.param_groups:
        g.update(lr=cfg.lr, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay)


def _refused(arm: Arm, why: str, rec: Recorded, seconds: float) -> OneStepArm:
    nan = math.nan
    return OneStepArm(arm.name, dict(arm.overrides), nan, nan, nan, nan, 0, nan, {}, nan, nan, nan, nan, nan, nan,
                      nan, rec.before.mean_reward, nan, 0, seconds, refused=why)


def update_to_weight(policy, start: dict) -> tuple[float, dict]:
    """(‖θ − θ_start‖₂, {layer: ‖Δθ_l‖₂ / ‖θ_start,l‖₂})."""
    from rookworld_debug.grpo.phases.update import layer_name
    d2: dict = {}
    w2: dict = {}
    for name, p in policy.named_parameters():
        if name not in start:
            continue
        layer = layer_name(name)
        d2[layer] = d2.get(layer, 0.0) + float((p.detach() - start[name]).pow(2).sum())
        w2[layer] = w2.get(layer, 0.0) + float(start[name].pow(2).sum())
    ratios = {k: math.sqrt(d2[k]) / math.sqrt(w2[k]) if w2[k] > 0 else math.nan for k in d2}
    return math.sqrt(sum(d2.values())), ratios


def _measure(state, rec: Recorded, arm: Arm, cfg, adv, ups, seconds: float) -> OneStepArm:
    from rookworld_debug.grpo.phases.evaluation import _pearson, greedy_evals
    from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy
    s, r = state.session, rec.rollout
    t0 = time.perf_counter()
    with torch.no_grad():                    # measured against the records, on the CPU
        logps, ent = (x.cpu() for x in per_token_logps_and_entropy(
            s.policy, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, r.temperatures))  # (N, T)
    m = r.completion_mask.to(logps.dtype)                                                      # (N, T)
    msum = m.sum().clamp(min=1)
    dl = (logps - r.per_token_logps) * m                                                       # (N, T)
    ratio = torch.exp(dl) * m                                                                  # (N, T)
    on = m.bool()
    out = (ratio < 1 - cfg.epsilon_low) | (ratio > 1 + cfg.epsilon_high)
    kl = math.nan
    if r.ref_per_token_logps is not None:
        d = (r.ref_per_token_logps - logps) * m                                                 # (N, T)
        kl = float(((torch.exp(d) - d - 1) * m).sum() / msum)
    per_row = dl.sum(1) / m.sum(1).clamp(min=1)                                                # (N,)
    batch = (s.batch.prompts, s.batch.tasks, s.batch.completions)
    after, _ = greedy_evals(s.policy, s.tokenizer, batch, None, max_new_tokens=cfg.eval_max_new_tokens,
                            reward_mode=cfg.reward_mode, engine=s.engine)
    delta, layers = update_to_weight(s.policy, state.weights)
    first = ups[0]
    return OneStepArm(
        arm.name, dict(arm.overrides), first.loss, first.grad_norm_pre_clip, first.grad_norm_post_clip, first.lr,
        len(ups), delta, layers, kl, float(ratio[on].mean()), float(ratio[on].max()),
        float((out & on).sum() / on.sum().clamp(min=1)), float(dl.sum() / msum),
        _pearson(adv.advantages.to(per_row.dtype), per_row), float((ent * m).sum() / msum),
        rec.before.mean_reward, after.mean_reward,
        sum(a != b for a, b in zip(after.completions, rec.before.completions)),
        seconds + time.perf_counter() - t0, first_update=first)


def one_step(state: SavedState, arms, *, rec: Optional[Recorded] = None, on_arm=None) -> tuple:
    """(Recorded, (OneStepArm per arm)). `on_arm(i, result)` after each arm (progress bars)."""
    for arm in arms:
        check_same_rollout(arm)
        arm.config(state.config)            # a bad override fails before any arm runs
    rec = rec or recorded(state)
    out = []
    for i, arm in enumerate(arms):
        out.append(run_arm(state, rec, arm))
        if on_arm is not None:
            on_arm(i, out[-1])
    restore(state)
    return rec, tuple(out)
