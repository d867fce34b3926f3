"""Start the debugged step from a DRIFTED policy (π ≠ π_ref), so KL > 0 and ratios ≠ 1 are real.

Two sources, applied in this order to a fresh Setup (the reference always stays the base `model`):

1. `init_policy`: weights from a `run_steps` checkpoint folder (policy.pt, optionally its optimizer.pt via
   `init_optimizer='checkpoint'`) or an HF model folder (config.json + weights); `init_optimizer` may also
   be a path to any optimizer.pt.
2. `warmup_steps` = k: k short GRPO steps on the step's own batch, with the same phase functions as
   `run_step` (generation → rewards → advantages → loss → one optimizer step; no greedy evals), sampling
   seeds `step_seed(seed, k)` as `run_steps`, learning rate `warmup_lr` (None = lr). The debugged step
   then continues from that policy AND its AdamW moments, like step k of a run.

Why warm-up at run time rather than a shipped drift checkpoint: the embedded tiny model is retrained
from time to time; a checkpoint would silently describe another base. The warm-up result is cached on
disk (`$ROOKWORLD_DEBUG_CACHE` or ~/.cache/rookworld_debug/drift/<key>/), keyed by every config field
that shapes it plus the base weights' sha256, so it is computed once per base/config and always
regenerable. Provenance (`Setup.provenance["start"]`) records the start: source, weights sha256 of the
start policy, the warm-up steps' metrics, and whether the cache was hit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from rookworld_debug.errors import CheckpointError, ConfigError, ModelLoadError
from rookworld_debug.safeio import check_fits, load_state_into, load_torch
from rookworld_debug.models.devices import cpu_state

# fields that do not shape the warm-up (eval sizes, the debugged step's own iteration/loss-view knobs)
# settings a warm-up does not read (it forces num_iterations = 1 and no steps_per_generation); warmup_steps is read
_KEY_IGNORES = ("heldout_n", "eval_max_new_tokens", "top_k_alternatives", "diagnostics", "keep_weights", "num_iterations",
                "steps_per_generation", "tiny_std_fraction", "engine_workers", "device")
CACHE_VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("ROOKWORLD_DEBUG_CACHE") or Path.home() / ".cache" / "rookworld_debug") / "drift"


def _sha(policy) -> str:
    from rookworld_debug.models import weights_sha256
    return weights_sha256(policy)


def load_policy_weights(policy, path) -> str:
    """Load a run_steps checkpoint's policy.pt or an HF folder's weights into `policy` (in place, so the
    optimizer keeps its parameters). Returns the kind of source."""
    path = Path(path).expanduser()
    if (path / "policy.pt").is_file():
        state, kind = load_torch(path / "policy.pt", "init_policy"), "run_steps checkpoint"
    elif (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM
        from rookworld_debug.models.custom_code import refuse_custom_code
        refuse_custom_code(path)
        try:
            state = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=False).state_dict()
        except Exception as err:      # noqa: BLE001 — any loader failure is reported with its path
            raise ModelLoadError(f"init_policy {path}: could not load the HF folder ({err})") from err
        kind = "HF folder"
    else:
        raise ModelLoadError(f"init_policy {path}: neither a run_steps checkpoint (policy.pt) nor an HF model "
                             "folder (config.json)")
    try:
        check_fits(policy, state, "init_policy", path)
        load_state_into(policy, state, "init_policy", path)
    except CheckpointError as err:
        raise CheckpointError(f"{err} (the base model is `{policy.config.model_type}`)") from None
    return kind


def load_optimizer_state(optimizer, config) -> str | None:
    if config.init_optimizer is None:
        return None
    path = Path(config.init_policy) / "optimizer.pt" if config.init_optimizer == "checkpoint" \
        else Path(config.init_optimizer).expanduser()
    if not path.is_file():
        raise ConfigError("init_optimizer", f"no optimizer state at {path}")
    load_state_into(optimizer, load_torch(path, "init_optimizer"), "init_optimizer", path)
    return str(path)


def warmup_key(config, base_sha: str, batch_hash: str) -> str:
    # batch_hash: the batch's content (prompts + labels), so regenerated data never hits a stale entry
    d = {k: v for k, v in config.to_dict().items() if k not in _KEY_IGNORES}
    blob = json.dumps({"v": CACHE_VERSION, "config": d, "base": base_sha, "batch": batch_hash,
                       "torch": torch.__version__},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def apply_start(s):
    """The Setup `s` with its policy/optimizer moved to the configured start; provenance['start'] says how."""
    c = s.config
    if c.init_policy is None and not c.warmup_steps and c.init_optimizer is None:
        return s
    base_sha = _sha(s.policy)
    info = {"base_weights_sha256": base_sha, "init_policy": c.init_policy, "init_policy_kind": None,
            "init_optimizer": None, "warmup_steps": c.warmup_steps, "warmup": [], "warmup_cache": None}
    if c.init_policy is not None:
        info["init_policy_kind"] = load_policy_weights(s.policy, c.init_policy)
    info["init_optimizer"] = load_optimizer_state(s.optimizer, c)
    if c.warmup_steps:
        info.update(_warmup_cached(s, warmup_key(c, _sha(s.policy), s.batch.batch_hash)))
    info["start_weights_sha256"] = _sha(s.policy)
    info["moved"] = info["start_weights_sha256"] != base_sha
    if not info["moved"]:
        info["note"] = ("the start policy did not move from the base (e.g. every warm-up group had zero reward "
                        "std and β·KL has no gradient at π = π_ref): KL and ratios stay at their step-0 values")
    return dataclasses.replace(s, provenance={**s.provenance, "start": info})


def _warmup_cached(s, key: str) -> dict:
    folder = cache_root() / key
    if (folder / "meta.json").is_file():
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if not isinstance(meta, dict) or not isinstance(meta.get("warmup"), list):
                raise CheckpointError(f"{folder / 'meta.json'}: no warm-up rows")
            if len(meta["warmup"]) != s.config.warmup_steps:
                raise CheckpointError(f"{folder / 'meta.json'}: {len(meta['warmup'])} warm-up steps, not "
                                      f"{s.config.warmup_steps}")
            policy = load_torch(folder / "policy.pt", "drift cache")
            optim = load_torch(folder / "optimizer.pt", "drift cache")
            check_fits(s.policy, policy, "drift cache", folder / "policy.pt")   # before anything is loaded
            load_state_into(s.optimizer, optim, "drift cache", folder / "optimizer.pt")  # torch checks first
            load_state_into(s.policy, policy, "drift cache", folder / "policy.pt")
            return {"warmup": meta["warmup"], "warmup_cache": f"hit {folder}"}
        except (CheckpointError, OSError, ValueError):
            pass                                      # a damaged entry is recomputed below
    rows = run_warmup(s)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(cpu_state(s.policy.state_dict()), folder / "policy.pt")
        torch.save(cpu_state(s.optimizer.state_dict()), folder / "optimizer.pt")
        tmp = folder / ".meta.json.tmp"
        tmp.write_text(json.dumps({"warmup": rows, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
        os.replace(tmp, folder / "meta.json")       # written last: its presence marks a complete entry
        where = f"computed, saved to {folder}"
    except OSError as err:
        where = f"computed, not cached ({err})"
    return {"warmup": rows, "warmup_cache": where}


def run_warmup(s) -> list:
    """k GRPO steps on the Setup's batch with run_step's own phases (no evals). Returns one metrics dict each."""
    from rookworld_debug.grpo.phases.shared import sample_and_score, step_seed
    from rookworld_debug.grpo.phases.update import update
    c = s.config
    lr = c.lr if c.warmup_lr is None else c.warmup_lr
    rows = []
    for k in range(c.warmup_steps):
        ck = c.replace(warmup_steps=0, num_iterations=1, steps_per_generation=None, seed=step_seed(c.seed, k), lr=lr)
        for group in s.optimizer.param_groups:
            group["lr"] = lr
        rollout, rewards, adv, loss = sample_and_score(dataclasses.replace(s, config=ck), ck)
        up = update(s.policy, s.optimizer, rollout, adv, loss, ck, per_term_grads=False, reference=s.reference)
        rows.append({"step": k, "lr": lr, "reward": float(rewards.rewards.nanmean()), "loss": float(loss.loss),
                     "kl": loss.kl, "grad_norm": up.grad_norm_pre_clip})
    for group in s.optimizer.param_groups:
        group["lr"] = c.lr                             # the debugged step's own learning rate
    return rows
