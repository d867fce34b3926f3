"""Helpers that keep the notebooks thin: papermill parameters → StepConfig, the summary.json every
report run writes, and an explicit, labelled way to let the policy drift from the reference before
tuning β (at step 0 π = π_ref, so KL ≡ 0 and β has no effect).

    config = config_from_params(globals())           # the notebook's parameters → StepConfig
    trace = run_step(config, session=s)
    write_summary(trace, run_dir)                      # run_dir/summary.json (+ run_dir/trace/)
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from rookworld_debug.config import StepConfig

__all__ = ["config_from_params", "write_summary", "summary_record", "drift_policy", "repo_root",
           "notebook_path"]


def repo_root() -> Path:
    """The repository (or source tree) holding this package: parent of the package folder."""
    return Path(__file__).resolve().parent.parent


def notebook_path(name: str = "01_grpo_step.ipynb") -> Path:
    """Absolute path of a shipped notebook: the package's own copy (``rookworld_debug/notebooks``: in a wheel
    a real folder, in a checkout a link to the top-level ``notebooks/``), else ``notebooks/`` beside it."""
    packaged = Path(__file__).resolve().parent / "notebooks" / name
    return packaged if packaged.is_file() else repo_root() / "notebooks" / name


def config_from_params(params: Mapping[str, Any], **overrides) -> StepConfig:
    """StepConfig from a notebook's namespace (or any mapping): every name that is a StepConfig field
    and is not None is used (None = keep the default), lists become tuples; other names are ignored.
    Aliases for sweeps: ``temperature`` / ``top_p`` set both tasks' values (p_/a_ fields given
    explicitly win). `overrides` win over everything. Invalid values raise ConfigError naming the field."""
    fields = set(StepConfig.field_names())
    kw: dict = {}
    for alias, targets in (("temperature", ("p_temperature", "a_temperature")), ("top_p", ("p_top_p", "a_top_p"))):
        if params.get(alias) is not None:
            kw.update({t: params[alias] for t in targets})
    kw.update({k: (tuple(v) if isinstance(v, list) else v) for k, v in params.items()
               if k in fields and v is not None and not k.startswith("_")})
    kw.update(overrides)
    return StepConfig(**kw)


def summary_record(trace, *, trace_path: Optional[Path] = None, params: Optional[Mapping] = None,
                   extra: Optional[Mapping] = None) -> dict:
    """What a report run records: config, provenance, per-phase timings, the headline metrics
    (`StepTrace.summary()`), counts, flags, step-0 invariants and the trace path."""
    inv = trace.setup.invariants
    metrics = dict(trace.summary())
    return {
        "config": trace.config.to_dict(),
        "params": dict(params or {}),
        "provenance": trace.setup.provenance,
        # run_step(session=s) reuses a loaded setup: its own load time is the Setup's `seconds`
        "timings": {**dict(trace.timings), "setup_load": float(getattr(trace.setup, "seconds", math.nan))},
        "metrics": metrics,
        "invariants": None if inv is None else {   # None: a TRL capture (GRPOTrainer checks none)
            "ok": bool(inv.ok), "failures": list(inv.failures), "max_abs_logp_diff": inv.max_abs_logp_diff,
            "max_k3_kl": inv.max_k3_kl, "max_ratio_dev": inv.max_ratio_dev, "n_tokens": inv.n_tokens},
        **({"trl_capture": _capture_summary(trace.capture)} if getattr(trace, "capture", None) is not None else {}),
        "counts": dict(trace.counts),
        "flags": list(trace.flags),
        "trace_path": None if trace_path is None else str(trace_path),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **dict(extra or {}),
    }


def _capture_summary(cap) -> dict:
    """Where a TRL-captured step came from and how its recompute compares with what TRL logged."""
    logged = cap.logged_metrics or {}
    return {"global_step": cap.global_step, "trl_version": cap.trl_version,
            "transformers_version": cap.transformers_version, "trl_loss": cap.trl_loss,
            "logged_loss": logged.get("loss"), "recomputed_loss": cap.recomputed_loss,
            "loss_recompute_diff": cap.loss_recompute_diff, "advantages_recompute_diff": cap.advantages_recompute_diff,
            "grad_norm": cap.grad_norm, "capture_seconds": cap.capture_seconds, "capture_bytes": cap.capture_bytes,
            "mapping_notes": list(cap.mapping_notes)}


def write_summary(trace, run_dir, *, params: Optional[Mapping] = None, save_trace: bool = True,
                  extra: Optional[Mapping] = None) -> Optional[Path]:
    """Save the trace to ``run_dir/trace/`` and write ``run_dir/summary.json`` atomically (the report
    runner's contract). ``run_dir`` None → nothing written, returns None."""
    if run_dir is None:
        return None
    from rookworld_debug.safeio import atomic_write_json
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_path = trace.save(run_dir / "trace") if save_trace else None
    return atomic_write_json(run_dir / "summary.json",
                             summary_record(trace, trace_path=trace_path, params=params, extra=extra))


def drift_policy(setup, config: StepConfig, *, steps: int = 0, lr: Optional[float] = None,
                 noise: float = 0.0, seed: int = 0) -> dict:
    """Move the setup's POLICY away from its frozen reference (in place), so that KL > 0 and β matters.

    - ``steps`` real GRPO updates (`sample_and_score` + `update`, a fresh AdamW at ``lr``); they move
      the policy only if the batch carries a gradient (some group with reward std > 0, or c_H > 0);
    - then, if ``noise`` > 0, a seeded Gaussian perturbation θ += noise·std(θ)·ε per tensor — a
      synthetic drift, for models whose batches carry no signal (e.g. the random-init tiny model).

    Returns a record {steps, lr, noise, updates: [...], max_abs_param_change, seconds}."""
    import torch

    from rookworld_debug.grpo.step import sample_and_score
    from rookworld_debug.grpo.phases.update import make_optimizer, update
    t0 = time.perf_counter()
    policy = setup.policy
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    record: dict = {"steps": int(steps), "lr": lr, "noise": float(noise), "updates": []}
    if steps > 0:
        cfg = config.replace(lr=lr) if lr is not None else config
        opt = make_optimizer(policy, cfg)
        for k in range(steps):
            ro, rw, adv, lo = sample_and_score(setup, cfg.replace(seed=cfg.seed + 1000 + k))
            up = update(policy, opt, ro, adv, lo, cfg, per_term_grads=False, reference=setup.reference)
            record["updates"].append({"loss": float(lo.loss), "reward": float(rw.metrics["reward"]),
                                      "frac_reward_zero_std": adv.frac_reward_zero_std,
                                      "grad_norm_pre_clip": up.grad_norm_pre_clip})
    if noise > 0:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in policy.parameters():
                scale = float(p.std()) if p.numel() > 1 else float(p.abs().mean())
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * (scale or 1.0))
    record["max_abs_param_change"] = max((float((p.detach() - before[n]).abs().max())
                                          for n, p in policy.named_parameters()), default=0.0)
    record["seconds"] = time.perf_counter() - t0
    if not math.isfinite(record["max_abs_param_change"]):
        from rookworld_debug.errors import NumericalError
        raise NumericalError("policy parameters became non-finite while drifting")
    return record
