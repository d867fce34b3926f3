"""What TRL's sampler did, read from the GRPOConfig a capture recorded: the settings that make it draw from another
distribution than the one the loss assumes.

TRL 1.16's GRPOTrainer builds its GenerationConfig from do_sample=True, `temperature`, `top_p`, `top_k`, `min_p` and
`repetition_penalty`, then applies `generation_kwargs` over them (`generation_kwargs.update(args.generation_kwargs)`),
so a key there overrides what the rest of the config says. Its loss scores the completions at `args.temperature`
on the full vocabulary. A setting of the sampler that the loss does not apply makes the rollout come from another
policy than the one the step trains:
  do_sample=False     every completion the argmax: a group's G completions are one sequence, σ = 0, A = 0;
  temperature in generation_kwargs ≠ GRPOConfig's: sampled at one temperature, scored at another;
  repetition_penalty ≠ 1, no_repeat_ngram_size, min_new_tokens / min_length (end-of-sequence suppressed),
  bad_words_ids, suppress_tokens, num_beams > 1: probabilities the loss never sees.
(top_k, top_p and min_p filter the same distribution the loss scores: TRL's design, not a mismatch.)
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from rookworld_debug.diagnosis import evidence as E
from rookworld_debug.diagnosis.context import current_step
from rookworld_debug.diagnosis.findings import Finding, Fix

# sampler settings the loss does not apply: key -> (its neutral value, what it does to the sampled distribution)
REWEIGHTING = {
    "repetition_penalty": (1.0, "divides the logit of every token already in the sequence by the penalty"),
    "no_repeat_ngram_size": (0, "forbids any n-gram the sequence already holds"),
    "min_new_tokens": (0, "forbids end-of-sequence before that many new tokens"),
    "min_length": (0, "forbids end-of-sequence before that total length"),
    "bad_words_ids": (None, "forbids the listed token sequences"),
    "suppress_tokens": (None, "forbids the listed tokens"),
    "num_beams": (1, "keeps the most likely beams instead of sampling"),
}


# the setting read from the run's own config names the mechanism that the replay's test of the chosen tokens (a
# warning, REPLAY_SCORE / 2) can only describe by its effect: it ranks just above that test
SETTING_SCORE = 51.0


def _sampler(trace) -> Optional[tuple[dict, dict, dict]]:
    """(the capture's GRPOConfig, the sampler's effective settings as TRL and generate() assemble them, the
    generation_kwargs that set them) of a TRL capture; None for any other step. generate() fills in the policy's own
    generation_config under every key TRL's GenerationConfig leaves unset (the reweighting keys here, TRL's own
    being repetition_penalty); generation_kwargs go over both."""
    cap = getattr(trace, "capture", None)
    config = getattr(cap, "grpo_config", None)
    if not isinstance(config, dict):
        return None
    gk = config.get("generation_kwargs") or {}
    gk = gk if isinstance(gk, dict) else {}
    model = _model_keys(trace)
    eff = {**model, "do_sample": True, "temperature": config.get("temperature", 1.0),
           "repetition_penalty": config.get("repetition_penalty", 1.0)}
    eff.update(gk)
    return config, eff, gk


def _model_keys(trace) -> dict:
    """The reweighting keys the policy's own generation_config sets that TRL's GenerationConfig does not."""
    model = getattr(getattr(trace, "capture", None), "generation_config", None)
    model = model if isinstance(model, dict) else {}
    return {k: v for k, v in model.items() if k in REWEIGHTING and k != "repetition_penalty"}


def _budget_override(trace, config: dict, gk: dict, step) -> list[Finding]:
    """generation_kwargs' max_new_tokens below GRPOConfig.max_completion_length: generate() stops there, so rows are
    cut short of the budget the run was configured with (an error where rows reach the override, else a warning)."""
    budget, cap = gk.get("max_new_tokens"), config.get("max_completion_length")
    if not isinstance(budget, int) or isinstance(budget, bool) or not isinstance(cap, int) or budget >= cap:
        return []
    lengths = trace.rollout.completion_mask.sum(1)
    at = int((lengths >= budget).sum())
    return [Finding(
        code="completion_cut_early", severity="error" if at else "warning",
        cause=f"The completions are cut at {_where('max_new_tokens', gk)} = {budget}, below GRPOConfig."
              f"max_completion_length = {cap}: TRL applies generation_kwargs over its own sampler settings, so "
              f"generate() stops every row at {budget} tokens; {at} of {lengths.numel()} rows reach it, cut "
              "unfinished, and their rewards score answers the configured budget would have let end.",
        evidence=(E.ev("generation_max_new_tokens", float(budget), _where("max_new_tokens", gk), "config"),
                  E.ev("max_completion_length", float(cap), "GRPOConfig.max_completion_length", "config"),
                  E.ev("rows_at_override", float(at), f"rows whose completion is {budget} tokens or longer")),
        fix=Fix("Remove 'max_new_tokens' from generation_kwargs (set the budget once, in max_completion_length).",
                grpo_config={"generation_kwargs": {k: v for k, v in gk.items() if k != "max_new_tokens"} or None}),
        alternatives=("all_truncated: a budget too small for the task reads the same from the lengths alone",),
        score=9.6 if at else 5.0, step=step)]


def _ids(v) -> set:
    return {v} if isinstance(v, int) and not isinstance(v, bool) else \
        {x for x in v if isinstance(x, int) and not isinstance(x, bool)} if isinstance(v, (list, tuple)) else set()


def _stop_ids(trace, gk: dict, step) -> list[Finding]:
    """generation_kwargs' eos_token_id holding ids the trainer does not count as an end (TRL 1.16 counts the
    policy's generation_config eos_token_id and the tokenizer's EOS): generate() stops on them, the completion mask
    does not end there (an error where rows end on one, else a warning)."""
    model = getattr(getattr(trace, "capture", None), "generation_config", None)
    trainer = _ids((model or {}).get("eos_token_id")) if isinstance(model, dict) else set()
    extra = sorted(_ids(gk.get("eos_token_id")) - trainer)
    if not extra or not trainer:
        return []
    ids = trace.rollout.completion_ids                                                              # (N, T)
    stopped = int(torch.isin(ids, torch.tensor(extra)).any(1).sum()) if ids.numel() else 0
    return [Finding(
        code="stop_token_not_trainer_eos", severity="error" if stopped else "warning",
        cause=f"{_where('eos_token_id', gk)} = {gk.get('eos_token_id')!r} stops generation on {extra} too, but the "
              f"trainer ends a completion only at {sorted(trainer)} (the policy's generation_config and the "
              f"tokenizer's EOS): {stopped} of {ids.shape[0]} rows hold one, so their mask runs past where generation "
              "stopped and they count as truncated.",
        evidence=(E.ev("extra_stop_ids", float(len(extra)), f"ids in {_where('eos_token_id', gk)} the trainer does not "
                       f"count as an end: {extra}", "config"),
                  E.ev("rows_with_one", float(stopped), "rows whose completion holds one of them")),
        fix=Fix("Declare every stop id where the trainer reads its EOS (the policy's generation_config.eos_token_id) "
                "instead of in generation_kwargs.",
                grpo_config={"generation_kwargs": {k: v for k, v in gk.items() if k != "eos_token_id"} or None},
                code_change=f"model.generation_config.eos_token_id = {sorted(trainer | set(extra))} before building "
                            "the trainer"),
        score=9.7 if stopped else 5.0, step=step)]


def declared_greedy(trace) -> bool:
    """A TRL capture whose GRPOConfig turns sampling off (`check_trl_generation` names it from the config)."""
    settings = _sampler(trace)
    return settings is not None and settings[1].get("do_sample") is False


def _where(key: str, gk: dict, model: Optional[dict] = None) -> str:
    if key in gk:
        return f"GRPOConfig.generation_kwargs[{key!r}]"
    if key in (model or {}):
        return (f"the policy's generation_config.{key} (its generation_config.json, which generate() applies where "
                "TRL's GenerationConfig leaves the key unset)")
    return f"GRPOConfig.{key}"


def _differs(value, neutral) -> bool:
    if value is None or value == neutral:
        return False
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return not math.isclose(float(value), float(neutral))
    return bool(value) if isinstance(value, (list, tuple)) else True


def check_trl_generation(trace) -> list[Finding]:
    settings = _sampler(trace)
    if settings is None:
        return []
    config, eff, gk = settings
    step = E.step_of(trace, current_step())
    uniq = trace.rollout.unique_per_group
    g = max(int(trace.config.num_generations), 1)
    same = sum(int(u) == 1 for u in uniq) if g > 1 else 0
    groups = E.ev("identical_groups", same, f"groups whose {g} completions are one and the same "
                  f"(of {len(uniq)} groups)", where="report: Rollout")
    out = []
    if eff.get("do_sample") is False and int(eff.get("num_beams") or 1) == 1:
        out.append(Finding(
            code="sampling_greedy", severity="error",
            cause=f"The completions were not sampled: {_where('do_sample', gk)} = False overrides TRL's do_sample="
                  f"True, so generate takes the argmax at every token; a group's {g} completions are one sequence, "
                  "their rewards equal and their advantages 0, and the step learns nothing.",
            evidence=(E.ev("do_sample", 0.0, f"{_where('do_sample', gk)} (TRL applies generation_kwargs over its "
                           "own sampler settings)", "config"), groups),
            fix=Fix("Remove 'do_sample' from generation_kwargs (TRL samples by default).",
                    grpo_config={"generation_kwargs": {k: v for k, v in gk.items() if k != "do_sample"} or None}),
            alternatives=("temperature_too_low: a very low temperature also makes a group's completions one",),
            score=9.8, step=step))
        return out
    out += _budget_override(trace, config, gk, step) + _stop_ids(trace, gk, step)
    t_loss = float(config.get("temperature", 1.0))
    t_gen = eff.get("temperature")
    if "temperature" in gk and t_gen is not None and not math.isclose(float(t_gen), t_loss):
        out.append(Finding(
            code="sampler_temperature_override", severity="error",
            cause=f"The sampler and the loss use different temperatures: {_where('temperature', gk)} = {t_gen:g} "
                  f"overrides GRPOConfig.temperature = {t_loss:g} for sampling only; TRL's loss divides the logits "
                  f"by {t_loss:g}, so the completions come from another distribution than the one the loss scores.",
            evidence=(E.ev("sampling_temperature", float(t_gen), _where("temperature", gk), "config"),
                      E.ev("loss_temperature", t_loss, "GRPOConfig.temperature: the loss's logits ÷ T", "config")),
            fix=Fix("Set the temperature once, in GRPOConfig.temperature, not in generation_kwargs.",
                    grpo_config={"temperature": float(t_gen),
                                 "generation_kwargs": {k: v for k, v in gk.items() if k != "temperature"} or None}),
            score=9.5, step=step))
    changed = {k: eff.get(k) for k, (neutral, _) in REWEIGHTING.items() if _differs(eff.get(k), neutral)}
    model = {k: v for k, v in _model_keys(trace).items() if k in changed and k not in gk}
    if changed:
        said = "; ".join(f"{_where(k, gk, model)} = {v!r} {REWEIGHTING[k][1]}" for k, v in changed.items())
        out.append(Finding(
            code="sampler_distribution_changed", severity="warning",
            cause="The sampler draws from another distribution than the policy the loss trains: " + said + ". TRL's "
                  "loss scores the completions with the policy's own probabilities and no correction for it, so "
                  "the update is off-policy by that much.",
            evidence=tuple(E.ev(k, float(v) if isinstance(v, (int, float)) else float(len(v or ())),
                                f"{_where(k, gk, model)}: {REWEIGHTING[k][1]}", "config") for k, v in changed.items()),
            fix=Fix("Sample from the policy itself: drop " + ", ".join(changed) + " (or accept the bias knowingly).",
                    grpo_config={k: REWEIGHTING[k][0] for k in changed if k not in gk and k not in model},
                    code_change="; ".join(f"model.generation_config.{k} = {REWEIGHTING[k][0]!r} before building the "
                                          "trainer" for k in model) or None),
            score=SETTING_SCORE, step=step))
    return out
