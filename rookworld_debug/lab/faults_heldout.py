"""Held-out fault types: written after the diagnosis checks and their thresholds were frozen, each injected the
way a user's bug happens (a setting, a model wired wrong, a patched phase), and scored against the frozen checks.

Step faults run through `run_step` (faults.py's harness), TRL faults through TRL 1.16's GRPOTrainer (faults_trl's
harness); four of the TRL faults are GRPOConfig settings only.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses

from rookworld_debug.lab.fault_kinds import P_TASK, Fault
from rookworld_debug.lab.faults_trl import TRLFault


# ------------------------------------------------------------------------------------------ step injections
def _set(s, name, value):
    object.__setattr__(s, name, value)          # the Setup record is frozen; the bug rewires the live session


def _optimizer_over_copy(s):
    from rookworld_debug.grpo.phases.update import make_optimizer
    _set(s, "optimizer", make_optimizer(copy.deepcopy(s.policy), s.config))   # steps a copy, never the policy
    return contextlib.nullcontext()


def _optimizer_step_skipped(s):
    s.optimizer.step = lambda *a, **k: None     # a gradient-accumulation counter that never reaches its step
    return contextlib.nullcontext()


def _reference_is_policy(s):
    _set(s, "reference", s.policy)              # "ref_model = model": no frozen copy
    return contextlib.nullcontext()


def _advantages_flipped(s):
    from unittest import mock

    from rookworld_debug.grpo.phases import shared as phases
    orig = phases.family_advantages

    def flipped(family, rewards, config):       # mean − r instead of r − mean
        a = orig(family, rewards, config)
        return dataclasses.replace(a, advantages=-a.advantages)
    return mock.patch.object(phases, "family_advantages", flipped)


def _update_reads_negated_advantages(s):
    from unittest import mock

    from rookworld_debug.grpo.phases import update
    orig = update._micro_batch_terms

    def terms(policy, reference, rollout, advantages, *rest, **kw):
        negated = dataclasses.replace(advantages, advantages=-advantages.advantages) \
            if hasattr(advantages, "advantages") else -advantages
        return orig(policy, reference, rollout, negated, *rest, **kw)
    return mock.patch.object(update, "_micro_batch_terms", terms)


def _update_forward_bf16(s):
    from unittest import mock

    import torch

    from rookworld_debug.grpo.phases import update
    orig = update.per_token_logps_and_entropy

    def bf16(*a, **kw):                         # autocast switched on around the training forward only
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return orig(*a, **kw)
    return mock.patch.object(update, "per_token_logps_and_entropy", bf16)


def _sampler_temperature(s):
    from unittest import mock

    from rookworld_debug.grpo.phases import generation
    orig = generation.row_sampling

    def cooler(settings, rows_tasks):           # the generation config's temperature set apart from the trainer's
        temps, top_p, top_k = orig(settings, rows_tasks)
        return temps * 0.7, top_p, top_k
    return mock.patch.object(generation, "row_sampling", cooler)


def _mask_drops_eos(s):
    from unittest import mock

    from rookworld_debug.grpo.phases import generation
    orig = generation._cut_after_eos

    def cut(generated, eos_id, pad_id):         # the mask stops one token early: EOS is never trained
        ids, mask, has_eos = orig(generated, eos_id, pad_id)
        n = mask.sum(1)
        rows = has_eos.nonzero().flatten()
        mask = mask.clone()
        mask[rows, (n[rows] - 1).clamp(min=0)] = 0
        return ids, mask, has_eos
    return mock.patch.object(generation, "_cut_after_eos", cut)


HELDOUT_STEP_FAULTS = (
    Fault("optimizer_over_copy", frozenset({"optimizer_no_op"}), "the optimizer is built over a deep copy of the "
          "policy (it steps the copy)", base=P_TASK, patch=_optimizer_over_copy),
    Fault("optimizer_step_skipped", frozenset({"optimizer_no_op"}), "optimizer.step() never runs (an accumulation "
          "counter that never fires)", base=P_TASK, patch=_optimizer_step_skipped),
    Fault("reference_is_policy", frozenset({"reference_tracks_policy"}), "the reference is the policy object "
          "(one warm-up update before the step, so the fault can change it)",
          base={**P_TASK, "warmup_steps": 1, "warmup_lr": 1e-5}, patch=_reference_is_policy),
    Fault("advantages_flipped", frozenset({"update_against_advantages", "reward_task_diverge"}),
          "advantages computed as mean − r", base=P_TASK, patch=_advantages_flipped),
    Fault("update_negates_advantages", frozenset({"loss_path_mismatch", "update_against_advantages"}),
          "the update's loss reads −A (the record reads A)", base=P_TASK, patch=_update_reads_negated_advantages),
    Fault("update_forward_bf16", frozenset({"forward_mismatch"}), "bf16 autocast around the update's forward only",
          base=P_TASK, patch=_update_forward_bf16),
    Fault("sampler_temperature", frozenset({"sampler_trainer_mismatch", "temperature_not_applied"}),
          "the sampler samples at 0.7 × the temperature the trainer scores with", patch=_sampler_temperature),
    Fault("mask_drops_eos", frozenset({"pad_in_mask", "tokens_after_eos_trained", "sampler_trainer_mismatch"}),
          "the completion mask stops before EOS", patch=_mask_drops_eos),
    Fault("entropy_coef_negative", frozenset({"entropy_coef_negative", "objective_inverted"}),
          "entropy_coef = −0.5", config={"entropy_coef": -0.5}, base=P_TASK),
)


# ------------------------------------------------------------------------------------------ the seventh set's
def _grad_norm_in_bf16(s):
    from unittest import mock

    import torch

    def clip(parameters, max_norm, *args, **kw):  # the per-tensor norms and their norm taken in bfloat16
        params = [p for p in parameters if p.grad is not None]
        norms = [p.grad.detach().to(torch.bfloat16).norm() for p in params]
        total = torch.stack(norms).norm().float()
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        with torch.no_grad():
            for p in params:
                p.grad.mul_(coef)
        return total
    return mock.patch.object(torch.nn.utils, "clip_grad_norm_", clip)


REWARD_MAX_CHARS = 48          # the reward scorer's input budget, cut on the right (RookWorld A: completions run ~70)


def _reward_of_truncated_text(seed):
    """The RookWorld reward as a scorer that truncates its input on the right sees it: each completion cut to its
    first REWARD_MAX_CHARS characters before scoring (its end, where the answer is, dropped)."""
    from rookworld_debug.grpo.phases.rewards import builtin_breakdowns

    def scored(prompts, completions, labels=(), **kw):
        cut = [c[:REWARD_MAX_CHARS] for c in completions]
        return [b.total if b is not None else None
                for b in builtin_breakdowns(prompts, cut, labels, reward_mode="dataset", engine=None)]
    return {"rookworld_scorer": scored}, {"rookworld": 0.0, "rookworld_scorer": 1.0}


def _lm_head_untied(s):
    import torch

    from rookworld_debug.grpo.phases.update import make_optimizer
    head = s.policy.get_output_embeddings()     # the output head given its own copy of the embedding matrix
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    _set(s, "optimizer", make_optimizer(s.policy, s.config))    # built after, over both (two separate steps)
    return contextlib.nullcontext()


# the part of the seventh held-out set (`--only seventh`) in the project's own step, written and frozen with it; each
# a bug class reported against a public trainer, the source named beside it
SEVENTH_STEP_FAULTS = (
    # facebookresearch/fairscale issue (clip_grad_norm_ casts the partial norms to bf16 before reducing them),
    # NVIDIA-NeMo/Automodel and pytorch/torchtitan pull requests (the clip's norm taken in float32): with
    # max_grad_norm = 0.1 (both runs) the clip's global norm is taken of bf16 per-tensor norms, in bf16
    Fault("grad_norm_in_bf16", frozenset({"grad_norm_low_precision"}), "max_grad_norm = 0.1 (both runs); the clip's "
          "norm computed in bfloat16", base={"max_grad_norm": 0.1}, patch=_grad_norm_in_bf16),
    # allenai/reward-bench issue (long sequences must be truncated on the left) and a vLLM pull request (the
    # truncation side of scoring tasks): a reward scorer that truncates its input on the right drops the end of long
    # completions, where the answer is
    Fault("reward_input_truncated", frozenset({"reward_input_truncated"}), "the reward scores each completion cut "
          "to its first 48 characters (a scorer's input truncated on the right)", rewards=_reward_of_truncated_text),
    # paiml/entrenar issue (the tied weight's gradients not accumulated: the LM head and the embedding get separate
    # optimizer steps) and NVIDIA/Megatron-LM issue (LM head weights untied while training): the output head holds
    # its own copy of the embedding matrix, each trained on its half of the gradient
    Fault("lm_head_untied", frozenset({"tied_weights_untied"}), "the output head given its own copy of the tied "
          "embedding matrix before the optimizer is built", patch=_lm_head_untied),
)
# the seventh set's own-step healthy controls: the plain step, and the step over micro-batches of four rows
SEVENTH_STEP_CONTROLS = ({"name": "seventh-control-00"}, {"name": "seventh-control-01", "micro_batch_size": 4})


# ------------------------------------------------------------------------------------------ the eighth set's
def _adam_with_l2(s):
    import torch
    cfg = s.config                              # Adam's weight decay: λ·θ added to the gradient, through the moments
    _set(s, "optimizer", torch.optim.Adam(s.policy.parameters(), lr=cfg.lr, betas=tuple(cfg.adam_betas),
                                          eps=cfg.adam_eps, weight_decay=cfg.weight_decay))
    return contextlib.nullcontext()


def _clip_coefficient_unclamped(s):
    from unittest import mock

    import torch

    def clip(parameters, max_norm, *args, **kw):  # a hand-written clip: max_norm / norm applied, never capped at 1
        params = [p for p in parameters if p.grad is not None]
        total = torch.stack([p.grad.detach().norm() for p in params]).norm()
        coef = max_norm / (total + 1e-6)
        with torch.no_grad():
            for p in params:
                p.grad.mul_(coef)
        return total
    return mock.patch.object(torch.nn.utils, "clip_grad_norm_", clip)


def _eos_index_unguarded(s):
    from unittest import mock

    import torch

    from rookworld_debug.grpo.phases import generation

    def cut(generated, eos_id, pad_id):         # the first EOS's index by argmax: 0 where a row has no EOS
        is_eos = generated == eos_id
        has_eos = is_eos.any(1)
        mask = torch.arange(generated.shape[1], device=generated.device)[None] <= is_eos.int().argmax(1)[:, None]
        return generated.masked_fill(~mask, pad_id), mask.long(), has_eos
    return mock.patch.object(generation, "_cut_after_eos", cut)


# the part of the eighth held-out set (`--only eighth`) in the project's own step, written and frozen with it; each a
# bug class reported against a public trainer, the source named beside it
EIGHTH_STEP_FAULTS = (
    # flagos-ai/FlagGems issue and pull request (a fused Adam kernel applying the other weight-decay rule than the one
    # named: L2 through the moments versus decoupled), pytorch/pytorch pull requests (decoupled weight decay, AdamW):
    # with weight_decay = 0.1 (both runs) the step's optimizer is Adam whose decay is an L2 term added to the gradient
    Fault("adam_l2_weight_decay", frozenset({"weight_decay_not_decoupled"}), "weight_decay = 0.1 (both runs); the "
          "optimizer Adam with L2 weight decay (λ·θ through the moments), not AdamW's decoupled decay",
          base={"weight_decay": 0.1}, patch=_adam_with_l2),
    # DingfanChen/GS-WGAN issue (the clip coefficient applied without clamp(max=1.0): small gradients scaled up),
    # tinygrad/tinygrad pull request (clamp the grad-clip scale in llama) and a pytorch/pytorch issue (the clip
    # coefficient is clamped to 1): max_grad_norm = 5 (both runs), the gradient scaled to norm 5 whatever its norm
    Fault("clip_coefficient_unclamped", frozenset({"grad_clip_scales_up"}), "max_grad_norm = 5 (both runs); the "
          "clip multiplies the gradient by max_norm / norm without capping it at 1", base={"max_grad_norm": 5.0},
          patch=_clip_coefficient_unclamped),
    # huggingface/trl pull request (GRPO's completion mask: the first EOS's index defaults to the completion's length
    # where a row has none) and a billy-enrizky/openbrowser-ai pull request review (each completion's mask must come
    # from its first EOS, not the padded length): the mask cut at
    # argmax(ids == EOS), which is 0 for a row without EOS, so each truncated completion keeps its first token only
    Fault("eos_index_unguarded", frozenset({"truncated_rows_masked_to_first_token"}), "max_new_tokens = 64 (both "
          "runs); the completion mask through argmax(ids == EOS), 0 for truncated rows",
          base={"max_new_tokens": 64, "eval_max_new_tokens": 64}, patch=_eos_index_unguarded),
)
# the eighth set's own-step healthy controls: AdamW's decoupled weight decay, a binding clip over two optimizer passes,
# and completions cut at a short budget
EIGHTH_STEP_CONTROLS = ({"name": "eighth-control-00", "weight_decay": 0.1},
                        {"name": "eighth-control-01", "num_iterations": 2, "max_grad_norm": 0.1},
                        {"name": "eighth-control-02", "max_new_tokens": 64, "eval_max_new_tokens": 64})


# ------------------------------------------------------------------------------------------ TRL injections
def _trl_ref_is_policy(trainer):
    trainer.ref_model = trainer.model


def _trl_optimizer_over_copy(trainer):
    import torch
    shadow = copy.deepcopy(trainer.model)
    trainer.optimizer = torch.optim.AdamW(shadow.parameters(), lr=trainer.args.learning_rate)


HELDOUT_TRL_FAULTS = (
    TRLFault("trl_beta_negative", frozenset({"objective_inverted"}), "GRPOConfig beta = −0.1",
             config={"beta": -0.1}),
    TRLFault("trl_reward_weights_negative", frozenset({"objective_inverted"}), "GRPOConfig reward_weights = "
             "[−1, −1]", config={"reward_weights": [-1.0, -1.0]}),
    TRLFault("trl_epsilon_negative", frozenset({"objective_inverted"}), "GRPOConfig epsilon = −0.2",
             config={"epsilon": -0.2}),
    TRLFault("trl_generation_temperature", frozenset({"sampler_trainer_mismatch", "temperature_not_applied"}),
             "GRPOConfig generation_kwargs temperature 0.5 while the trainer scores at temperature 1",
             config={"generation_kwargs": {"temperature": 0.5}}),
    TRLFault("trl_reference_is_policy", frozenset({"reference_tracks_policy"}), "trainer.ref_model = trainer.model",
             patch=_trl_ref_is_policy),
    TRLFault("trl_optimizer_over_copy", frozenset({"optimizer_no_op"}), "trainer.optimizer built over a deep copy "
             "of the model", patch=_trl_optimizer_over_copy),
)

# the fault families: every type, old and held-out, in one of six
FAMILIES = {
    "log-probs and sampling": ("dropout", "temperature_not_applied", "position_ids", "sampler_bf16", "trl_dropout",
                               "update_forward_bf16", "sampler_temperature", "trl_generation_temperature"),
    "the reference": ("reference_other_weights", "reference_bf16", "trl_reference_other", "reference_is_policy",
                      "trl_reference_is_policy"),
    "the optimizer and accumulation": ("lr_too_large", "grad_clip_tiny", "kl_dominates", "trl_lr_too_large",
                                       "trl_grad_clip_tiny", "optimizer_over_copy", "optimizer_step_skipped",
                                       "update_negates_advantages", "trl_optimizer_over_copy"),
    "the reward": ("reward_constant", "reward_prompt_only", "reward_random", "reward_jitter", "std_floor_removed",
                   "reward_inf", "trl_reward_constant", "trl_unscorable", "advantages_flipped"),
    "data and masks": ("pad_in_mask", "all_truncated", "budget_short", "trl_truncation", "mask_drops_eos"),
    "the config": ("temperature_low", "entropy_bonus", "trl_temperature_low", "entropy_coef_negative",
                   "trl_beta_negative", "trl_reward_weights_negative", "trl_epsilon_negative"),
}
HELDOUT = frozenset(f.name for f in (*HELDOUT_STEP_FAULTS, *HELDOUT_TRL_FAULTS))


def family_of(name: str) -> str:
    return next((fam for fam, names in FAMILIES.items() if name in names), "other")


# ------------------------------------------------------------------------------------------ the report
def _top(r, k):
    return [c["code"] for c in (r.get("findings") or [])[:k]]


def _acc(rs) -> str:
    if not rs:
        return "— (no effective case)"
    h1 = sum(bool(set(_top(r, 1)) & set(r["accept"])) for r in rs)
    h3 = sum(bool(set(_top(r, 3)) & set(r["accept"])) for r in rs)
    return f"top-1 {h1}/{len(rs)} = {h1 / len(rs):.1%}, top-3 {h3}/{len(rs)} = {h3 / len(rs):.1%}"


def heldout_report(results: list[dict]) -> list[str]:
    """Held-out vs earlier fault types, leave-one-family-out accuracy and the confusion matrix (Markdown lines)."""
    eff = [r for r in results if r.get("kind") in ("step", "trl") and r.get("fault") is not None and r.get("effective")]
    new = [r for r in eff if r["fault"] in HELDOUT]
    old = [r for r in eff if r["fault"] not in HELDOUT]
    lines = ["", "Held-out fault types (written after the checks and their thresholds were frozen): "
             f"{len({r['fault'] for r in new})} types, {len(new)} effective cases — {_acc(new)}",
             f"Earlier fault types: {len({r['fault'] for r in old})} types, {len(old)} effective cases — {_acc(old)}",
             "", "Leave-one-family-out (each family's cases scored with the checks as frozen; no threshold is fitted "
             "to a family, so holding one out changes no check):", "",
             "| family | types (held-out) | all cases | held-out cases |", "| --- | --- | --- | --- |"]
    for fam in FAMILIES:
        rs = [r for r in eff if family_of(r["fault"]) == fam]
        hs = [r for r in rs if r["fault"] in HELDOUT]
        lines.append(f"| {fam} | {len({r['fault'] for r in rs})} ({len({r['fault'] for r in hs})}) | {_acc(rs)} | "
                     f"{_acc(hs)} |")
    codes = sorted({(_top(r, 1) or ["none"])[0] for r in new})
    lines += ["", "Confusion matrix of the held-out cases (fault type × first finding; ✓ = an accepted diagnosis):", "",
              "| fault | accepted | " + " | ".join(codes) + " |", "| --- | --- | " + " | ".join("---" for _ in codes) + " |"]
    for name in dict.fromkeys(r["fault"] for r in new):
        rs = [r for r in new if r["fault"] == name]
        cells = []
        for c in codes:
            n = sum((_top(r, 1) or ["none"])[0] == c for r in rs)
            cells.append("" if not n else f"{n}{' ✓' if c in rs[0]['accept'] else ''}")
        lines.append(f"| {name} | {', '.join(rs[0]['accept'])} | " + " | ".join(cells) + " |")
    return lines
