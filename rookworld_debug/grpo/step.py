"""ONE GRPO step, phase by phase. Read `run_step` top to bottom: it is the algorithm.

setup → generation (the sampled rows, and the greedy before-update rows in the same decoding loop) → rewards →
advantages → loss → baseline eval (the greedy rows' rewards) → diagnostics (optional, at the step's start) →
update → evaluation
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Optional

import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.errors import ConfigError, NumericalError
from rookworld_debug.grpo.objective.params import Objective
from rookworld_debug.grpo.registry import checked
from rookworld_debug.grpo.multistep.start import setup as setup_phase
from rookworld_debug.grpo.objective.loss import LossBreakdown
from rookworld_debug.grpo.phases.advantages import Advantages
from rookworld_debug.grpo.phases.evaluation import Evaluation, GreedyEval, evaluate_after, greedy_evals, greedy_prompts
from rookworld_debug.grpo.phases.generation import Rollout, loss_mask
from rookworld_debug.grpo.phases.iterations import run_iterations
from rookworld_debug.grpo.phases.rewards import Rewards
from rookworld_debug.grpo.phases.setup import Setup, check_context, check_inject, reuse_session
# loss_for is re-exported: views and notebooks import it from here
from rookworld_debug.grpo.phases.shared import PhaseTimer, loss_for, memory_advice, rows, sample_and_score  # noqa: F401
from rookworld_debug.grpo.phases.update import UpdateResult
from rookworld_debug.grpo.signal.noise import signal_noise, with_delta_ci
from rookworld_debug.grpo.trace import serialize
from rookworld_debug.grpo.trace.keep import StepWatch, keeps_weights, optimizer_steps
from rookworld_debug.grpo.trace.state import state_bytes
from rookworld_debug.metrics import term_balance, tiny_std_groups

__all__ = ["StepTrace", "run_step", "TRACE_VERSION"]

TRACE_VERSION = 2            # 2: records named by class name (1: "module:Class"; still read)
LOSS_PATH_TOLERANCE = 1e-5   # |loss(grad path) − loss(record)|, fp32 recompute noise is ~1e-7


@dataclass(frozen=True)
class StepTrace:
    """Every record of one step. `save`/`load` round-trip it without a model (views re-render from it)."""
    config: StepConfig
    setup: Setup
    before: GreedyEval                      # greedy on this step's B prompts, BEFORE the update
    before_heldout: Optional[GreedyEval]    # greedy on the fixed held-out prompts, BEFORE the update
    rollout: Rollout
    rewards: Rewards
    advantages: Advantages
    loss: LossBreakdown
    update: Optional[UpdateResult]          # None when the step refused to update (see flags)
    evaluation: Optional[Evaluation]
    timings: dict                           # phase -> seconds
    counts: dict                            # tokens, forwards, engine calls, cache hits...
    flags: tuple                            # every warning raised by any phase, in order
    version: int = TRACE_VERSION
    capture: Optional[object] = None        # rookworld_debug.trl.TRLCapture when the step was taken by TRL's GRPOTrainer
    iterations: tuple = ()                  # IterationRecord per PPO pass (μ = num_iterations); () = no update
    diagnostics: Optional[object] = None    # grpo.signal.noise.SignalNoise when config.diagnostics
    recorded: Optional[object] = None       # grpo.trace.recorded.RecordedStep when the user's own loop recorded it
    weights: str = ""                       # "state/": the replay's weights are kept beside trace.json
    kept: Optional[object] = None           # grpo.trace.state.RecordedState in memory (written to state/ by save)
    __transient__ = ("kept",)

    def __post_init__(self):
        if self.kept is not None and not self.weights:     # kept weights are saved beside the trace
            object.__setattr__(self, "weights", "state/")

    def save(self, path) -> Path:
        """Write `<path>/state/` (the kept weights, when the step kept them), `<path>/trace.safetensors` (tensors)
        and `<path>/trace.json` (everything else, last). Every writer of a step (run_step, a TRL capture, a
        StepRecorder) saves through here: the step is written to a temporary folder beside `path` and renamed into
        place (grpo.trace.folder), so a reader finds the step saved there before whole, this one whole, or no
        folder, never a mix, whatever interrupts the save. A folder that holds anything but a saved step is
        refused; a save the disk refuses (full, a size limit, a file in the way) is a SaveError naming `path`."""
        from rookworld_debug.grpo.trace.folder import save_whole
        return save_whole(Path(path), self._write, check=check_step_folder)

    def _write(self, folder: Path) -> None:
        from rookworld_debug.grpo.trace.state import write_recorded
        from rookworld_debug.safeio import atomic_write_json
        from safetensors.torch import save_file
        folder.mkdir(parents=True, exist_ok=True)          # save_whole made it, beside the step
        if self.kept is not None:
            write_recorded(folder, self.kept)
        # the file says state/ only when this save wrote it (a loaded trace holds no weights to write again)
        payload, tensors = serialize.encode(replace(self, weights="state/" if self.kept is not None else ""))
        save_file(tensors, str(folder / "trace.safetensors"))
        atomic_write_json(folder / "trace.json", payload)      # written last: its presence means complete

    @staticmethod
    def load(path) -> "StepTrace":
        """A saved step or TRL capture; TraceError names what is wrong with a folder that is neither,
        IncompatibleTraceError a capture from an unsupported TRL version."""
        from rookworld_debug.grpo.trace.check import check_trace
        trace = serialize.read_trace(path, "StepTrace", TRACE_VERSION)
        check_trace(trace, str(path))          # tensors whose shapes disagree: refused here, not in a view
        return trace

    def summary(self) -> dict:
        """Headline numbers (what reports and the per-step table show), each defined in `rookworld_debug.metrics.GLOSSARY`."""
        u, e, lo, r = self.update, self.evaluation, self.loss, self.rollout
        if self.config.freezes_old_logps and self.iterations:
            lo = self.iterations[-1].loss        # TRL logs the LAST optimizer step's metrics; μ = 1: the record
        lengths = r.completion_mask.sum(1).float()
        term = lengths[~r.is_truncated]                  # EOS-terminated completions (TRL *_terminated_length)
        bal = term_balance(lo, u)
        adv = self.advantages
        return {
            "reward_before": self.before.mean_reward if self.before else math.nan,   # None: TRL capture
            "reward_after": e.batch_after.mean_reward if e else math.nan,
            "delta_reward": e.delta_reward_batch if e else math.nan,
            "heldout_reward_before": self.before_heldout.mean_reward if self.before_heldout else math.nan,
            "heldout_reward_after": e.heldout_after.mean_reward if e and e.heldout_after else math.nan,
            "heldout_n": self.before_heldout.n if self.before_heldout else 0,
            "rollout_reward": self.rewards.metrics["reward"],
            "reward_std": self.rewards.metrics["reward_std"],
            "loss": float(lo.loss), "pg_loss": float(lo.pg_loss), "kl_loss": float(lo.kl_loss),
            "kl": lo.kl, "kl_share": bal.kl_value_share, "kl_grad_share": bal.kl_grad_share,
            "pg_grad_share": bal.pg_grad_share, "grad_cos_pg_kl": bal.grad_cos_pg_kl, "entropy": float(r.per_token_entropy[r.completion_mask.bool()].mean()),
            "grad_norm_pre_clip": u.grad_norm_pre_clip if u else math.nan,
            "grad_norm_post_clip": u.grad_norm_post_clip if u else math.nan,
            "frac_reward_zero_std": self.advantages.frac_reward_zero_std,
            "advantage_min": float(self.advantages.advantages.min()),
            "advantage_max": float(self.advantages.advantages.max()),
            **{k: v for k, v in lo.metrics.items() if k.startswith(("clip_ratio/", "rlvr/"))},
            "completions/mean_length": float(lengths.mean()),
            "completions/clipped_ratio": float(r.is_truncated.float().mean()),
            "completions/min_length": float(lengths.min()), "completions/max_length": float(lengths.max()),
            "completions/mean_terminated_length": float(term.mean()) if term.numel() else math.nan,
            "completions/min_terminated_length": float(term.min()) if term.numel() else math.nan,
            "completions/max_terminated_length": float(term.max()) if term.numel() else math.nan,
            "num_tokens": float(r.prompt_mask.sum() + r.completion_mask.sum()),
            "learning_rate": u.lr if u else math.nan,
            **{k: v for k, v in self.rewards.metrics.items() if k.startswith("rewards/")},
            "tiny_std_groups": len(tiny_std_groups(adv.group_std, adv.batch_std, self.config.tiny_std_fraction)),
            "format_valid": sum(self.rewards.format_valid) / max(len(self.rewards.format_valid), 1),
            "corr_adv_delta_logp": e.corr_adv_delta_logp if e else math.nan,
            "step0_invariants_ok": self.setup.invariants.ok if self.setup.invariants is not None else math.nan,
            "max_abs_logp_diff_recompute": r.max_abs_logp_diff,
        }


STEP_FILES = ("trace.json", "trace.safetensors", "state")


def check_step_folder(path: Path) -> None:
    """A step is saved into a new or empty folder, or over a saved step; never into a folder of other files."""
    from rookworld_debug.errors import DataError
    if path.exists() and not path.is_dir():
        raise DataError(f"save: {path} is a file; a step is saved to a folder")
    if path.is_dir():
        others = sorted(p.name for p in path.iterdir()
                        if p.name not in STEP_FILES and not _interrupted_write(p.name))
        if others:                                    # replacing the folder would delete them
            raise DataError(f"save: {path} holds other files ({', '.join(others[:3])}); a step needs a folder "
                            "of its own")


def _interrupted_write(name: str) -> bool:
    """The temporary file of an atomic rewrite of trace.json cut short (a TRL capture adds its cost so): the
    folder is still a saved step, replaced whole by the next save."""
    return name.startswith(".trace.json.") and name.endswith(".tmp")


def run_step(config: StepConfig, *, session: Optional[Setup] = None, reward_funcs: Optional[Mapping] = None,
             reward_weights: Optional[Mapping] = None, inject: Optional[Mapping[int, str]] = None) -> StepTrace:
    """One fully instrumented GRPO step, its phases in the order of the module docstring. Pass `session` (a Setup)
    to reuse loaded models/engine; `inject` = {row: text} to put chosen completions into the rollout (debugging
    "what if")."""
    timer = PhaseTimer()
    with timer("setup"):
        s = _setup_phase(config, session, inject)
    timer.advice = lambda phase: memory_advice(s, config, phase)
    batch, heldout = _greedy_batches(s)
    # generation → rewards → advantages → loss; the greedy before-update rows ride in the sampling loop
    rollout, rewards, advantages, loss, greedy = sample_and_score(
        s, config, reward_funcs=reward_funcs, reward_weights=reward_weights, inject=inject, timer=timer,
        greedy_prompts=greedy_prompts(batch, heldout))
    with timer("baseline_eval"):               # their rewards; the decoding was the generation phase's
        before, before_heldout = greedy_evals(s.policy, s.tokenizer, batch, heldout,
                                              max_new_tokens=config.eval_max_new_tokens,
                                              reward_mode=config.reward_mode, engine=s.engine, completions=greedy)
    flags = _step_flags(s, rollout, rewards, advantages, loss, config)
    diag = None
    if config.diagnostics:                     # at the step's start, before the update moves the policy
        with timer("diagnostics"):
            diag = _diagnostics_phase(s, rollout, advantages, loss, config, flags)
    with timer("update"):                      # μ passes × steps_per_generation optimizer steps (μ = 1: one)
        watch = StepWatch(s.policy, s.optimizer, reference=s.reference, tokenizer=s.tokenizer) \
            if keeps_weights(config.keep_weights, s.policy) else None
        try:
            iterations, upd = _update_phase(s, rollout, advantages, loss, config, flags)
        finally:                               # the session's optimizer keeps no hook of this step
            if watch is not None:
                watch.remove()
    kept = _kept(watch, iterations, whole_batch=(config.steps_per_generation or 1) == 1)
    evaluation = None
    if upd is not None:
        with timer("evaluation"):
            evaluation = _evaluation_phase(s, rollout, advantages, before, before_heldout, config, flags)
    if diag is not None:                       # the diagnostics' predictions next to what the update did
        diag = with_delta_ci(diag, evaluation, config.seed, iterations=iterations, mask=loss_mask(rollout, config))
    return StepTrace(config=config, setup=s, before=before, before_heldout=before_heldout, rollout=rollout,
                     rewards=rewards, advantages=advantages, loss=loss, update=upd, evaluation=evaluation,
                     timings=dict(timer.seconds), counts={**_counts(rollout, rewards, iterations, upd, evaluation),
                                                          "state/bytes": state_bytes(kept) if kept is not None else 0},
                     flags=tuple(flags), iterations=iterations, diagnostics=diag, kept=kept)


def _kept(watch, iterations, *, whole_batch: bool):
    """The weights kept for the replay (None when not kept): the first optimizer step's gradient and weights after
    it are the step's when that step trained on every row (`whole_batch`: steps_per_generation 1)."""
    if watch is None:
        return None
    first = iterations[0].updates[0] if iterations and iterations[0].updates else None
    return watch.close(clip_coef=first.clip_coef if first is not None else 1.0,
                       whole_batch=whole_batch)


def _setup_phase(config: StepConfig, session: Optional[Setup], inject) -> Setup:
    """The loaded models, data and engine (a reused `session` re-checked against the config's token limits)."""
    s = reuse_session(session, config) if session is not None else setup_phase(config)
    if session is not None:               # a reused session may meet new token limits: same check as setup
        check_context(config, s.policy, s.tokenizer, s.batch.prompts, [x.prompt for x in s.heldout])
    if inject:                            # before the evaluations and sampling, not after
        check_inject(inject, s, config)
    # what says whether the policy is still the loaded weights (the replay reloads them only then)
    return replace(s, provenance={**s.provenance, "optimizer_steps_before": optimizer_steps(s.optimizer)})


def _greedy_batches(s: Setup) -> tuple:
    """(batch, held-out) as (prompts, tasks, labels) for the greedy evaluations (held-out None when empty)."""
    batch = (s.batch.prompts, s.batch.tasks, s.batch.completions)
    heldout = ([x.prompt for x in s.heldout], [x.task for x in s.heldout], [x.completion for x in s.heldout]) \
        if s.heldout else None
    return batch, heldout


def _step_flags(s: Setup, rollout, rewards, advantages, loss, config: StepConfig) -> list:
    """Every flag raised before the update: invariants, data, the start, sampling, rewards, advantages, loss."""
    start = s.provenance.get("start") or {}
    return [*s.invariants.failures, *getattr(s, "data_flags", ()), *([start["note"]] if start.get("note") else []),
            *rollout.warnings, *rewards_flags(rewards), *advantages.flags,
            *zero_std_flags(advantages, rollout.prompts, rewards), *tiny_std_flags(advantages, config.tiny_std_fraction), *loss.flags]


def _diagnostics_phase(s: Setup, rollout, advantages, loss, config: StepConfig, flags: list):
    """Signal or noise at the step's start (None, with a flag, for a batch it cannot run on)."""
    try:
        diag = signal_noise(s.policy, rollout, advantages, loss, config)
    except (ConfigError, NumericalError) as err:   # the step goes on without them
        flags.append(f"signal-or-noise diagnostics skipped: {err}")
        return None
    if diag.noise.num_groups < 2:
        flags.append(f"signal or noise: {diag.noise.note}")
    return diag


def _evaluation_phase(s: Setup, rollout, advantages, before, before_heldout, config: StepConfig, flags: list):
    """The post-update evaluation (None, with a flag, when the updated weights cannot be evaluated)."""
    try:
        return evaluate_after(
            s.policy, s.reference, s.tokenizer, rollout, advantages, before, before_heldout,
            labels_per_row=rows(s.batch.completions, config.num_generations), batch_labels=s.batch.completions,
            heldout_labels=[x.completion for x in s.heldout], reward_mode=config.reward_mode, engine=s.engine,
            eval_max_new_tokens=config.eval_max_new_tokens, sampling_autocast=config.sampling_autocast,
            replay=s.objective.family.exact_sampler(config))   # a faulty sampler: no exact replay
    except NumericalError as err:              # e.g. lr=1e12 broke the weights: keep the trace and its flags
        flags.append(f"post-update evaluation failed: {err}")
        return None


def _update_phase(s: Setup, rollout, advantages, loss, config: StepConfig, flags: list) -> tuple:
    """(the inner iterations' records, the optimizer step TRL logs last — None when refused). A refusal (NaN/inf)
    and a loss that differs from the displayed record go into `flags`."""
    iterations, upd = (), None
    objective = s.objective                    # resolved for this config by the setup phase
    family = objective.family
    upd_config = checked(family, "update_config", family.update_config(config, loss), StepConfig, "a StepConfig") \
        if family.update_config is not None else config
    if upd_config is not config:               # e.g. the mini's controlled β: the update's own knobs
        objective = Objective.from_config(upd_config, family=family)
    try:
        iterations = run_iterations(s.policy, s.optimizer, rollout, advantages, upd_config, reference=s.reference,
                                    loss_record=loss, flags=flags, objective=objective)
        upd = iterations[0].updates[0] if len(iterations) == 1 and len(iterations[0].updates) == 1 \
            else iterations[-1].updates[-1]  # the optimizer step whose metrics TRL logs last
    except NumericalError as err:          # refuse to step on NaN/inf; the trace says why
        flags.append(f"update refused: {err}")
    first = iterations[0].updates[0] if iterations else None    # the only step compared with the record
    if first is not None and not math.isnan(first.loss_record_diff) and \
            not first.loss_record_diff <= LOSS_PATH_TOLERANCE:
        # the optimizer's loss (fresh grad forward) must equal the displayed record (rollout tensors)
        flags.append(f"loss used by the update differs from the displayed loss record by "
                     f"{first.loss_record_diff:.3g} (> {LOSS_PATH_TOLERANCE:g}): the views would not describe the step")
    return iterations, upd


def _counts(rollout, rewards, iterations, upd, evaluation) -> dict:
    """The step's work counts by phase (generation/, engine/, update/, evaluation/)."""
    return {**{f"generation/{k}": v for k, v in rollout.counts.items()},
            **{f"engine/{k}": v for k, v in rewards.engine_stats.items()},
            **{f"update/{k}": sum(u.counts.get(k, 0) for it in iterations for u in it.updates)
               for k in (upd.counts if upd else {})},
            "update/optimizer_steps": sum(len(it.updates) for it in iterations),
            **{f"evaluation/{k}": v for k, v in ((evaluation.replay if evaluation else None) or {}).items()}}


def rewards_flags(rewards: Rewards) -> list[str]:
    n = len(rewards.format_valid)
    bad = n - sum(rewards.format_valid)
    out = [f"{bad}/{n} completions malformed (format flags in the reward table)"] if bad else []
    out += list(getattr(rewards, "warnings", ()))     # e.g. a reward function returned ±inf (rows unscorable)
    unscorable = int(torch.isnan(rewards.rewards).sum())
    if unscorable:
        out.append(f"{unscorable}/{n} completions unscorable (every reward function returned None/NaN)")
    return out


def tiny_std_flags(adv: Advantages, fraction: float) -> list[str]:
    """Groups whose σ_g is tiny next to the batch's reward std: their advantages amplify small reward gaps."""
    g = adv.num_generations
    out = []
    for b in tiny_std_groups(adv.group_std, adv.batch_std, fraction):
        a = adv.advantages[b * g:(b + 1) * g]
        out.append(f"tiny-σ group p{b}: σ = {float(adv.group_std[b]):.3g} < {fraction:g} × batch σ "
                   f"{adv.batch_std:.3g}; advantages span {float(a.min()):+.2f}…{float(a.max()):+.2f} from a reward "
                   f"gap of {float(adv.rewards[b * g:(b + 1) * g].max() - adv.rewards[b * g:(b + 1) * g].min()):.3g}")
    return out


def zero_std_flags(adv: Advantages, prompts, rewards: Rewards) -> list[str]:
    """Name every zero-std group with its prompt and reward vector (the advantage record has the indices)."""
    g = adv.num_generations
    out = []
    for b in adv.zero_std_groups:
        vec = ", ".join(f"{float(x):.3g}" for x in rewards.rewards[b * g:(b + 1) * g])
        a = adv.advantages[b * g:(b + 1) * g]
        what = ("advantages 0, no PG signal" if float(a.abs().max()) <= 1e-6 else
                f"advantages {float(a[0]):+.3g} from the batch normalisation: a push with no reward difference")
        out.append(f"zero-std group {b}: {prompts[b * g]!r} rewards [{vec}] → {what}")
    if adv.zero_std_groups and len(adv.zero_std_groups) == adv.group_mean.numel():
        out.append("ALL groups zero-std: the policy-gradient term is exactly 0 this step")
    return out
