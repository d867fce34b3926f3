"""The fault-injection benchmark's TRL half: faults injected into TRL 1.16's GRPOTrainer runs of the tiny model
through its own GRPOConfig or a patched trainer; every step captured by the flight recorder and diagnosed as
`rookworld-debug diagnose RUN` would (the run's log so far + that step's capture)."""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

STEPS = 3
BASE = dict(max_completion_length=160, learning_rate=1e-5, beta=0.1, prompts_per_step=2, num_generations=4)


@dataclass(frozen=True)
class TRLFault:
    name: str
    accept: frozenset
    how: str
    config: dict = field(default_factory=dict)         # GRPOConfig overrides that ARE the fault
    patch: Optional[Callable] = None                    # (trainer) -> None, after construction
    reward: Optional[Callable] = None                   # replaces the reward functions
    base: dict = field(default_factory=dict)           # GRPOConfig settings shared with its fault-free twin


def _const(prompts, completions, **kw):
    return [0.5] * len(completions)


def _none_for_odd(prompts, completions, **kw):
    return [None if len(c) % 2 else len(c) / 100 for c in completions]


def _perturb_ref(trainer):
    import torch
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in trainer.ref_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * float(p.float().std() if p.numel() > 1 else 0.0))


TRL_FAULTS = (
    TRLFault("trl_truncation", frozenset({"all_truncated"}), "max_completion_length = 16",
             config={"max_completion_length": 16}),
    TRLFault("trl_lr_too_large", frozenset({"lr_too_large", "update_too_large", "non_finite"}),
             "learning_rate = 0.05", config={"learning_rate": 0.05}),
    TRLFault("trl_reward_constant", frozenset({"reward_ignores_completion"}), "the reward function returns a "
             "constant", reward=_const),
    TRLFault("trl_temperature_low", frozenset({"temperature_too_low"}), "temperature = 0.05",
             config={"temperature": 0.05}),
    TRLFault("trl_dropout", frozenset({"dropout_active"}), "model_init_kwargs sets dropout 0.1 (GPT-2's hub "
             "default) and disable_dropout = False (TRL's default)",
             config={"disable_dropout": False, "model_init_kwargs": {"dtype": "float32", "resid_pdrop": 0.1,
                                                                     "embd_pdrop": 0.1, "attn_pdrop": 0.1}}),
    TRLFault("trl_grad_clip_tiny", frozenset({"grad_clip_binding"}), "max_grad_norm = 1e-4",
             config={"max_grad_norm": 1e-4}),
    TRLFault("trl_unscorable", frozenset({"unscorable_rows"}), "the reward function returns None for some rows",
             reward=_none_for_odd),
    TRLFault("trl_reference_other", frozenset({"reference_not_start"}), "trainer.ref_model replaced by other "
             "weights (+5 % std noise)", patch=_perturb_ref),
)


def _reversed_rewards(prompts, completions, **kw):
    """The RookWorld reward of each row, returned in reverse order (a batched scorer that hands back its results
    in another order than it was given the rows)."""
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    cols = [f(prompts=prompts, completions=completions, **kw) for f in rookworld_reward_funcs("dataset")]
    return [sum(v for v in vals if v is not None) for vals in zip(*cols)][::-1]


class _LaggedReward:
    """The RookWorld reward of the PREVIOUS call's completions (an asynchronous scorer read one batch late); the
    first call scores its own."""

    def __init__(self):
        self.last = None
        self.__name__ = "lagged_rookworld_reward"

    def __call__(self, prompts, completions, **kw):
        from rookworld_debug.trl.rewards import rookworld_reward_funcs
        cols = [f(prompts=prompts, completions=completions, **kw) for f in rookworld_reward_funcs("dataset")]
        now = [sum(v for v in vals if v is not None) for vals in zip(*cols)]
        out, self.last = (self.last if self.last is not None and len(self.last) == len(now) else now), now
        return out


# written and frozen before the fits they need; each a bug class reported against a public trainer
SEALED_TRL_FAULTS = (
    TRLFault("trl_rewards_reversed", frozenset({"reward_rows_misaligned"}), "the reward function returns its "
             "values in reverse row order", reward=_reversed_rewards),
    TRLFault("trl_reward_lagged", frozenset({"reward_has_memory", "rewards_other_batch"}), "the reward function "
             "returns the previous batch's rewards", reward=_LaggedReward()),
    TRLFault("trl_greedy", frozenset({"sampling_greedy"}), "generation_kwargs = {'do_sample': False}: every "
             "completion the argmax", config={"generation_kwargs": {"do_sample": False}}),
)


def _generation_config_with_repeat_ban(trainer):
    """The policy's generation config as a checkpoint may ship it, with a no-repeat n-gram ban of 3: a key TRL's own
    sampling settings do not set, so generate() merges it in and samples with it."""
    trainer.model.generation_config.no_repeat_ngram_size = 3


def _rewards_rounded_to_bf16(prompts, completions, **kw):
    """The RookWorld reward of each row as a reward head run in bfloat16 returns it: rounded to bf16."""
    import torch
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    cols = [f(prompts=prompts, completions=completions, **kw) for f in rookworld_reward_funcs("dataset")]
    totals = [sum(v for v in vals if v is not None) for vals in zip(*cols)]
    return torch.tensor(totals, dtype=torch.float32).to(torch.bfloat16).float().tolist()


# the TRL part of the sixth held-out set (`--only sixth`), written and frozen with it; each a bug class reported against
# a public trainer, the source named beside it
SIXTH_TRL_FAULTS = (
    # TRL's GRPOTrainer (its generation config merged over the model's, which keeps every key TRL does not set):
    # a checkpoint's generation config with a no-repeat n-gram ban is applied to the sampling
    TRLFault("trl_checkpoint_generation_config_applied", frozenset({"sampler_distribution_changed"}), "the policy's "
             "generation config ships no_repeat_ngram_size = 3, a key TRL's sampling settings do not set",
             patch=_generation_config_with_repeat_ban),
    # OpenRLHF pull request (rewards promoted to at least FP32): a reward head run in bfloat16 returns rounded scores
    TRLFault("trl_rewards_bf16", frozenset({"rewards_rounded"}), "the reward function returns the RookWorld reward "
             "rounded to bfloat16", reward=_rewards_rounded_to_bf16),
)


def _high_entropy_mask_over_padding(self, entropies, mask, threshold: float):
    """TRL's high-entropy token mask as it was before padding was excluded: the quantile threshold taken over every
    position's entropy (the padding's included), the mask over the completion's tokens."""
    import torch
    cut = torch.quantile(entropies.detach().flatten().float(), threshold)
    return (entropies >= cut) & mask.bool()


def _entropy_mask_over_padding(trainer):
    import types
    trainer.get_high_entropy_mask = types.MethodType(_high_entropy_mask_over_padding, trainer)


# the TRL part of the seventh held-out set (`--only seventh`), written and frozen with it; each a bug class reported
# against a public trainer, the source named beside it
SEVENTH_TRL_FAULTS = (
    # huggingface/trl pull request (GRPO: honour every EOS id the generation declares; a completion that stopped on
    # a secondary EOS is trained past it and counted as truncated): the generation stops on '+' (id 43) as well as
    # the EOS (id 256; generation_kwargs), while the trainer cuts the completion mask at <|endoftext|> only
    TRLFault("trl_stop_token_not_eos", frozenset({"stop_token_not_trainer_eos", "tokens_after_eos_trained"}),
             "generation_kwargs eos_token_id = [256, 43]: generation stops on '+' too, the trainer's EOS is "
             "the tokenizer's (256) alone", config={"generation_kwargs": {"eos_token_id": [256, 43]}}),
    # huggingface/trl issue and pull request (the high-entropy threshold's quantile computed over the padding's
    # entropies too): top_entropy_quantile = 0.2 with the threshold taken over every position
    TRLFault("trl_entropy_quantile_counts_padding", frozenset({"entropy_mask_counts_padding"}), "top_entropy_quantile "
             "= 0.2 (both runs); the high-entropy threshold's quantile taken over the padding too",
             base={"top_entropy_quantile": 0.2}, patch=_entropy_mask_over_padding),
    # modelscope/ms-swift issue (max_completion_length not in effect) and TRL's generation_kwargs, merged over the
    # trainer's own sampling settings: a max_new_tokens there overrides max_completion_length, so completions are cut
    # at 48 tokens while the trainer's budget is 160
    TRLFault("trl_generation_budget_overridden", frozenset({"completion_cut_early"}), "generation_kwargs "
             "max_new_tokens = 48 under max_completion_length = 160",
             config={"generation_kwargs": {"max_new_tokens": 48}}),
)
# the seventh set's TRL healthy controls: the plain run, and the run with the high-entropy token mask
SEVENTH_TRL_HEALTHY = ({}, {"top_entropy_quantile": 0.2})


def _rescaled_loss(trainer, factor):
    """trainer._compute_loss returning its loss × factor(trainer, inputs) in training (a normaliser other than the
    one TRL divides by, applied to the same sum)."""
    import types
    orig = trainer._compute_loss

    def compute(self, model, inputs):
        loss = orig(model, inputs)
        return loss * factor(self, inputs) if self.model.training else loss
    trainer._compute_loss = types.MethodType(compute, trainer)


def _dr_grpo_normaliser_padded_width(trainer):
    """dr_grpo's constant normaliser B·L_max taken as B·T, T the padded width of the batch's completions (the longest
    completion in it): the loss × L_max / T."""
    _rescaled_loss(trainer, lambda self, inputs: self.max_completion_length / inputs["completion_ids"].size(1))


def _dapo_normaliser_whole_generation_batch(trainer):
    """dapo's token normaliser without the rescale to one accumulation window: each step's token sum divided by the
    completion tokens of the whole generation batch (steps_per_generation steps): the loss × GA / steps_per_generation."""
    _rescaled_loss(trainer, lambda self, inputs: self.current_gradient_accumulation_steps
                   / self.args.steps_per_generation)


# the TRL part of the eighth held-out set (`--only eighth`), written and frozen with it; each a bug class reported
# against a public trainer, the source named beside it
EIGHTH_TRL_FAULTS = (
    # a verl issue (seq-mean-token-sum-norm divides by loss_mask.shape[-1], "should ideally be constant") and verl pull
    # request (a constant loss_scale_factor), huggingface/trl pull requests (Dr. GRPO: the constant is
    # max_completion_length): loss_type = dr_grpo (both runs) with its normaliser the padded width of the batch
    TRLFault("trl_dr_grpo_normaliser_padded_width", frozenset({"dr_grpo_normaliser_not_constant"}), "loss_type = "
             "dr_grpo (both runs); the loss divided by B × the batch's padded completion width, not B × "
             "max_completion_length", base={"loss_type": "dr_grpo"}, patch=_dr_grpo_normaliser_padded_width),
    # huggingface/trl pull request (dapo/cispo/vespo mis-scaled by GA / steps_per_generation: num_items_in_batch spans
    # the generation batch) and the huggingface/trl issue it fixes (the DAPO loss and gradient accumulation):
    # loss_type = dapo, steps_per_generation = 2 (both runs), each step's tokens divided by the generation batch's
    TRLFault("trl_dapo_normaliser_spans_generation_batch", frozenset({"loss_scaled"}), "loss_type = dapo, "
             "steps_per_generation = 2 (both runs); the token normaliser the whole generation batch's, not one "
             "accumulation window's", base={"loss_type": "dapo", "steps_per_generation": 2},
             patch=_dapo_normaliser_whole_generation_batch),
    # NovaSky-AI/SkyRL pull requests (CISPO's importance-weight bounds defaulted to the PPO clip's 0.2, fixed to the
    # ScaleRL bounds 0 and 5) and an LLM360/Reasoning360 pull request (cispo clip ratios defaulted to 0.2): loss_type =
    # cispo (both runs) with epsilon_high left unset, so TRL caps the importance weight at epsilon = 0.2, below 1
    TRLFault("trl_cispo_cap_from_epsilon", frozenset({"cispo_cap_below_one"}), "loss_type = cispo (both runs); "
             "epsilon_high unset, the IS-weight cap falls back to epsilon = 0.2 (the twin: epsilon_high = 5)",
             config={"epsilon_high": None}, base={"loss_type": "cispo", "epsilon_high": 5.0}),
)
# the eighth set's TRL healthy controls: the plain run, two optimizer passes per generation, dapo over a generation
# batch of two steps, and cispo with the ScaleRL cap
EIGHTH_TRL_HEALTHY = ({}, {"num_iterations": 2}, {"loss_type": "dapo", "steps_per_generation": 2},
                      {"loss_type": "cispo", "epsilon_high": 5.0})


def run_trl(out: Path, seed: int, fault: Optional[TRLFault] = None, base: Optional[dict] = None):
    """Train STEPS steps capturing each (under `base`: GRPOConfig settings, the fault's own when it has some); returns
    (log rows, {step: capture folder})."""
    from rookworld_debug.diagnosis.runlog import rows_from_history
    from rookworld_debug.trl.capture import capture_steps
    from trl import GRPOTrainer

    from rookworld_debug.models import load_policy_and_reference
    from rookworld_debug.models.loading import TINY_DIR
    from rookworld_debug.trl.example import grpo_config, tiny_dataset
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    kw = {**BASE, **(base or (fault.base if fault else None) or {}), **(fault.config if fault else {})}
    funcs = [fault.reward] if fault and fault.reward else rookworld_reward_funcs("dataset")
    trainer = GRPOTrainer(model=str(TINY_DIR), reward_funcs=funcs, train_dataset=tiny_dataset(),
                          args=grpo_config(out, max_steps=STEPS, seed=seed, **kw),
                          processing_class=load_policy_and_reference("tiny").tokenizer)
    if fault and fault.patch:
        fault.patch(trainer)
    cap = capture_steps(trainer, list(range(1, STEPS + 1)), out / "captures", keep_weights=True)
    trainer.train()
    return rows_from_history(trainer.state.log_history), dict(cap.paths), dict(cap.errors)


def diagnose_steps(rows, paths) -> dict:
    """{step: ranked codes} from the log up to that step plus that step's capture and its replay (diagnose_path's
    view)."""
    from rookworld_debug.diagnosis.checks_run_invariants import check_captured_rewards, check_captured_weights
    from rookworld_debug.diagnosis.registry import diagnose_rows, diagnose_step, merge, rank, rank_run, replace_step
    from rookworld_debug.grpo.step import StepTrace
    out, secs, everything, traces = {}, [], [], {}
    for step in sorted(paths):
        t0 = time.perf_counter()
        traces[step] = StepTrace.load(paths[step])
        found = list(diagnose_rows([r for r in rows if r["step"] <= step]))
        found += [replace_step(f, step) for f in diagnose_step(traces[step], paths[step])[0]]   # with its replay
        found += check_captured_weights(traces) + check_captured_rewards(traces)   # the captures so far, as diagnose_path reads a run folder
        everything += found
        out[step] = [{"code": f.code, "severity": f.severity} for f in rank(merge(found))]
        secs.append(time.perf_counter() - t0)
    # the whole run as `diagnose RUN` reads it: one finding per code, its earliest step
    out["run"] = [{"code": f.code, "severity": f.severity, "step": f.step} for f in rank_run(merge(everything))]
    return out, secs


KEYS = ("loss", "reward", "kl", "entropy", "grad_norm", "completions/mean_length", "frac_reward_zero_std")


def trl_case(fault: Optional[TRLFault], seed: int, twins: dict, base: Optional[dict] = None) -> dict:
    """A TRL run of `fault` (None: a healthy run, under `base`), diagnosed step by step; a fault's run is compared
    with its twin (the same seed and base settings, no fault) to tell whether it changed anything."""
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="rookworld-faults-"))
    key = seed if fault is None or not fault.base else (seed, json.dumps(fault.base, sort_keys=True))
    try:
        if fault is not None and key not in twins:
            twins[key] = run_trl(tmp / "twin", seed, base=fault.base)[0]
        rows, paths, errors = run_trl(tmp / "run", seed, fault, base=base)
        per_step, secs = diagnose_steps(rows, paths)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    last = per_step.pop("run", [])
    rec = {"kind": "trl", "fault": fault.name if fault else None, "seed": seed, "findings": last,
           "per_step": {str(k): v[:3] for k, v in per_step.items()}, "capture_errors": {str(k): v for k, v in errors.items()},
           "diagnose_seconds": max(secs) if secs else math.nan, "seconds": time.perf_counter() - t0}
    if fault is None:
        return {**rec, "name": f"trl-control-{seed}", "errors": sum(c["severity"] == "error" for c in last)}
    twin = twins[key]
    diff = sorted({k for a, b in zip(rows, twin) for k in KEYS
                   if a.get(k) is not None and b.get(k) is not None
                   and not math.isclose(a[k], b[k], rel_tol=1e-6, abs_tol=1e-9)})
    first = next((int(s) for s, codes in sorted(per_step.items(), key=lambda kv: int(kv[0])) if any(c["code"] in fault.accept for c in codes[:3])),
                 None)
    return {**rec, "accept": sorted(fault.accept), "how": fault.how, "effective": bool(diff), "changed": diff,
            "first_named_step": first}


def main_json(rec) -> str:
    return json.dumps(rec, default=str)
