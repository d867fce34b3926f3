"""Setup phase: models, tokenizer, batch, engine, optimizer, provenance, and the step-0 invariants.

Shape legend: B prompts, N = B rows here (one dataset completion per prompt), T completion tokens.

The invariants are the check rookworld-trl's debug scripts lacked: before any update the
policy and the reference are the same weights in eval mode, so on the same tokens their log-probs are
bit-equal, every KL estimator is 0, the PPO ratio is 1, and no dropout is active. If any of these
fails, every later KL/ratio number would be an artefact, so the views show this table first.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Optional

import torch

from rookworld_debug.config import StepConfig
from rookworld_debug.data.loaders import Batch, load_bundled, load_file, load_heldout, load_hf, select_batch
from rookworld_debug.errors import ConfigError
from rookworld_debug.grpo.objective.params import Objective, resolve
from rookworld_debug.grpo.phases.generation import per_token_logps_and_entropy


@dataclass(frozen=True)
class Invariants:
    max_abs_logp_diff: float        # max |logπ − logπ_ref| over the dataset completions' tokens (must be 0)
    max_k3_kl: float                # max per-token k3 KL(π‖π_ref) on those tokens (must be 0)
    max_ratio_dev: float            # max |exp(logπ − logπ_old) − 1| between two forwards (must be 0)
    dropout_active: tuple           # names of modules with p > 0 that are in training mode (must be empty)
    dropout_config: dict            # the ORIGINAL config dropout values (reported, then zeroed)
    policy_training_mode: bool      # must be False: train() would re-enable dropout
    n_tokens: int                   # tokens the check ran on
    ok: bool
    failures: tuple                 # human-readable reasons when not ok


@dataclass(frozen=True)
class Setup:
    __transient__ = ("policy", "reference", "tokenizer", "engine", "optimizer", "objective", "objective_config")
    config: StepConfig
    policy: object                  # PreTrainedModel (trainable, eval mode, dropout 0)
    reference: object               # frozen copy
    tokenizer: object
    engine: object                  # chess.engine.Engine or None (reward_mode='dataset' or A:-only)
    optimizer: object               # torch.optim.AdamW over the policy
    provenance: dict                # model provenance + engine version/settings + dataset source
    batch: Batch                    # the B prompts of this step (explicit indices + hash)
    heldout: tuple                  # held-out Samples for before/after greedy eval
    invariants: Invariants
    seconds: float
    data_flags: tuple = ()          # malformed dataset records skipped (on_bad_sample='skip'), one per line
    objective: Optional[Objective] = None   # an objective resolved once (family, its settings, every knob) …
    objective_config: Optional[StepConfig] = None   # … for this config (a replaced config is resolved anew)


MAX_SKIP_FLAGS = 20


def load_samples(dataset: str, task: str, on_bad_sample: str = "error") -> tuple[list, list]:
    """(train samples, held-out samples) for 'bundled' | a local .txt/.jsonl path | 'hf:<name>'.
    Batch indices are positions in the train list; held-out prompts never enter a batch."""
    return load_samples_reported(dataset, task, on_bad_sample)[:2]


def load_samples_reported(dataset: str, task: str, on_bad_sample: str = "error") -> tuple[list, list, tuple]:
    """`load_samples` + the flags of the records skipped under ``on_bad_sample='skip'`` (empty otherwise)."""
    if dataset == "bundled":
        return load_bundled(split="train"), load_heldout(task), ()
    if dataset.startswith("hf:"):
        samples, report = load_hf(dataset[3:], with_report=True, on_bad_sample=on_bad_sample)
    else:
        samples, report = load_file(dataset, with_report=True, on_bad_sample=on_bad_sample)
    train = [s for s in samples if s.split != "heldout"]
    heldout = [s for s in samples if s.split == "heldout" and (task == "mixed" or s.task == task)]
    flags = ()
    if report.skipped:
        more = report.skipped - MAX_SKIP_FLAGS
        flags = (f"{report.skipped} malformed dataset record(s) skipped (on_bad_sample='skip')",
                 *report.notes[:MAX_SKIP_FLAGS], *([f"... and {more} more skipped"] if more > 0 else []))
    return train, heldout, flags


def _dropout_active(model) -> tuple:
    return tuple(name for name, m in model.named_modules()
                 if isinstance(m, torch.nn.Dropout) and m.p > 0 and m.training)


def check_invariants(policy, reference, tokenizer, prompts, completions, temperatures, dropout_config) -> Invariants:
    """Teacher-force the dataset completions through policy and reference; compare."""
    eos = tokenizer.eos_token or ""
    p = tokenizer(list(prompts), padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    c = tokenizer([x + eos for x in completions], padding=True, padding_side="right", add_special_tokens=False,
                  return_tensors="pt")
    args = (p["input_ids"], p["attention_mask"], c["input_ids"], c["attention_mask"], temperatures)
    # compared on the CPU: the reference may sit on another device (reference_device)
    logp, _ = (x.cpu() for x in per_token_logps_and_entropy(policy, *args))         # (N, T)
    logp_again, _ = (x.cpu() for x in per_token_logps_and_entropy(policy, *args))   # (N, T) "old" = a second forward
    ref, _ = (x.cpu() for x in per_token_logps_and_entropy(reference, *args))        # (N, T)
    mask = c["attention_mask"].bool()                                    # (N, T)
    d = (ref - logp)[mask]
    k3 = torch.exp(d) - d - 1
    ratio = torch.exp((logp - logp_again)[mask])
    inv = dict(max_abs_logp_diff=float(d.abs().max()) if d.numel() else 0.0,
               max_k3_kl=float(k3.max()) if k3.numel() else 0.0,
               max_ratio_dev=float((ratio - 1).abs().max()) if ratio.numel() else 0.0,
               dropout_active=_dropout_active(policy) + _dropout_active(reference),
               dropout_config=dict(dropout_config), policy_training_mode=bool(policy.training),
               n_tokens=int(mask.sum()))
    failures = []
    if inv["max_abs_logp_diff"] != 0.0:
        failures.append(f"policy and reference log-probs differ by up to {inv['max_abs_logp_diff']:.3g}")
    if inv["max_k3_kl"] != 0.0:
        failures.append(f"KL at step 0 is {inv['max_k3_kl']:.3g}, not 0")
    if inv["max_ratio_dev"] != 0.0:
        failures.append(f"ratio deviates from 1 by {inv['max_ratio_dev']:.3g} between two identical forwards")
    if inv["dropout_active"]:
        failures.append(f"dropout active in {len(inv['dropout_active'])} modules")
    if inv["policy_training_mode"]:
        failures.append("policy is in training mode")
    return Invariants(**inv, ok=not failures, failures=tuple(failures))


def n_positions(policy) -> int | None:
    """The model's context length (GPT-2: ``n_positions``), None when its config does not say."""
    cfg = getattr(policy, "config", None)
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _longest_prompt(tokenizer, prompts) -> int:
    if not len(prompts):                                  # tokenizers fail on an empty batch
        return 0
    return max(len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"])


def check_context(config: StepConfig, policy, tokenizer, prompts, heldout_prompts=()) -> None:
    """Every sequence the step will build must fit the model's context: ConfigError naming the field and
    n_positions BEFORE generation (torch would fail deep inside with a bare IndexError)."""
    ctx = n_positions(policy)
    if ctx is None:
        return
    p_batch = _longest_prompt(tokenizer, prompts)
    p_eval = max(p_batch, _longest_prompt(tokenizer, heldout_prompts))
    for name, p_len, what in (("max_new_tokens", p_batch, "the batch"),
                              ("eval_max_new_tokens", p_eval, "the batch and held-out")):
        new = getattr(config, name)
        if p_len + new > ctx:
            raise ConfigError(name, f"{new} new tokens after the longest prompt of {what} ({p_len} tokens) need "
                              f"{p_len + new} positions, but the model's context is n_positions={ctx}; use "
                              f"{name} ≤ {max(ctx - p_len, 0)}")


def check_inject(inject, s: Setup, config: StepConfig) -> None:
    """`run_step(inject=...)` rows must be valid text that fits the context with its prompt (+ EOS)."""
    n = len(s.batch.prompts) * config.num_generations
    for row, text in inject.items():
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < n:
            raise ConfigError("inject", f"row {row!r} is not a row index 0..{n - 1}")
        if not isinstance(text, str):
            raise ConfigError("inject", f"row {row}: completion must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConfigError("inject", f"row {row}: not valid Unicode text ({e.reason} at character {e.start}: "
                              f"{text[e.start]!r})") from None
    ctx = n_positions(s.policy)
    if ctx is None:
        return
    p_len = _longest_prompt(s.tokenizer, s.batch.prompts)
    for row, text in inject.items():
        t_len = len(s.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1      # + EOS
        if p_len + t_len > ctx:
            raise ConfigError("inject", f"row {row}: {t_len} completion tokens (with EOS) after a {p_len}-token "
                              f"prompt need {p_len + t_len} positions, but the model's context is n_positions={ctx}")


def load_setup(config: StepConfig, *, loaded=None, samples: tuple[list, list] | None = None, engine=None) -> Setup:
    """Load (or reuse) models, data and engine; pick the batch; check the step-0 invariants. The policy is
    the base model: a drifted start (warm-up steps, a checkpoint) is `grpo.multistep.start.setup`, one layer up."""
    from rookworld_debug.models import load_policy_and_reference
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    # data and engine first: a bad dataset or a missing Stockfish (EngineNotFound) fails in seconds,
    # before a possibly large model is loaded
    from rookworld_debug.models.devices import check_device
    check_device(config.device)       # a typo or a missing GPU: ConfigError before data, engine or model
    if config.reference_device != "same":
        check_device(config.reference_device, "reference_device")
    if samples is None:
        train, heldout_all, data_flags = load_samples_reported(config.dataset, config.task, config.on_bad_sample)
    else:
        (train, heldout_all), data_flags = samples, ()
    batch = select_batch(train, task=config.task, batch_size=config.batch_size, seed=config.seed,
                         indices=config.prompt_indices)
    heldout = tuple(heldout_all[: config.heldout_n])

    objective = resolve(config)                 # before loading anything: what the objective cannot run
    if config.reward_mode not in ("engine", "dataset", "rlvr", "rlvr_gt"):
        raise ConfigError("reward_mode", f"unknown {config.reward_mode!r}")
    needs_engine = config.reward_mode == "engine" and any(t == "P" for t in batch.tasks)
    engine_arg = engine
    if engine is None and needs_engine:
        from rookworld_debug.chess.engine import Engine
        engine = Engine(depth=config.engine_depth, multipv=config.engine_multipv, workers=config.engine_workers,
                        timeout=config.engine_timeout, on_failure=config.engine_on_failure)
    torch.manual_seed(config.seed)
    try:
        loaded = loaded or load_policy_and_reference(config.model, dtype=config.dtype, device=config.device,
                                                    reference_device=config.reference_device)
        check_context(config, loaded.policy, loaded.tokenizer, batch.prompts, [x.prompt for x in heldout])
    except BaseException:
        if engine is not None and engine is not engine_arg:     # ours: don't leave its processes running
            engine.close()
        raise
    policy, reference, tokenizer, prov = loaded
    from rookworld_debug.models.precision import set_autocast, step_precision
    set_autocast(config.autocast, policy, reference)   # every phase's forwards autocast the same way

    from rookworld_debug.grpo.phases.update import make_optimizer
    optimizer = make_optimizer(policy, config)
    temps = torch.tensor([config.sampling_for(t)[0] for t in batch.tasks])          # (B,)
    invariants = check_invariants(policy, reference, tokenizer, batch.prompts, batch.completions, temps,
                                  prov.dropout_original)
    provenance = {**(prov.to_dict() if hasattr(prov, "to_dict") else dict(prov)),
                  "dataset": config.dataset, "batch": batch.describe(),
                  "engine": None if engine is None else {"version": getattr(engine, "version", None),
                                                         "depth": config.engine_depth,
                                                         "multipv": config.engine_multipv, "threads": 1},
                  "precision": step_precision(policy, reference, config.sampling_autocast)}
    s = Setup(config=config, policy=policy, reference=reference, tokenizer=tokenizer, engine=engine,
              optimizer=optimizer, provenance=provenance, batch=batch, heldout=heldout,
              invariants=invariants, seconds=time.perf_counter() - t0, data_flags=data_flags, objective=objective,
              objective_config=config)
    return s


def check_settings(config) -> None:
    """ConfigError for what the config's objective cannot run (see `grpo.objective.params.resolve`)."""
    resolve(config)


# settings that choose how the session's models were LOADED: a reused session cannot change them
RELOAD_FIELDS = ("model", "dtype", "device", "init_policy")


def reuse_session(session: Setup, config: StepConfig) -> Setup:
    """`session` under `config`, the one place a reused session changes: what would need a reload is refused by
    name before any work; a precision (autocast) or reference device the config changes from the session's is
    applied to the models (what the config leaves alone keeps what the models' owner set, e.g. a policy-only bf16),
    each change named in provenance["session_changes"]; the precision recorded is what runs; the objective is
    resolved (checked) anew only for a changed config."""
    from rookworld_debug.models.precision import set_autocast, step_precision
    old = session.config
    for name in RELOAD_FIELDS:
        if getattr(old, name, None) != getattr(config, name, None):
            raise ConfigError(name, f"{getattr(config, name)!r}, but the session's models were loaded with "
                                    f"{getattr(old, name)!r}: load a new session (setup) to change it")
    changes = []
    if config.autocast != old.autocast:
        set_autocast(config.autocast, session.policy, session.reference)
        changes.append(f"autocast {old.autocast!r} → {config.autocast!r} on the session's models")
    if config.reference_device != old.reference_device and session.reference is not None:
        target = place_reference(session, config.reference_device)
        changes.append(f"reference moved to {target} (reference_device {config.reference_device!r})")
    provenance = {**session.provenance, "session_changes": changes,
                  "precision": step_precision(session.policy, session.reference, config.sampling_autocast)}
    return replace(session, config=config, provenance=provenance, objective=objective_of(session, config),
                   objective_config=config)


def place_reference(session: Setup, reference_device: str):
    """Move the session's reference to `reference_device` ("same": the policy's device); the device it is on."""
    from rookworld_debug.models.devices import check_device
    target = (next(session.policy.parameters()).device if reference_device == "same"
              else check_device(reference_device, "reference_device"))
    session.reference.to(target)
    return target


def objective_of(s: Setup, config: StepConfig) -> Objective:
    """`config`'s objective: the session's when it was resolved for this config, else resolved (checked) now (a
    caller that scores the session under another config)."""
    return s.objective if s.objective is not None and s.objective_config == config else resolve(config)
