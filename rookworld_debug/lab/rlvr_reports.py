"""What rookworld-rlvr's "healthy" reports measure, on the embedded tiny model over a few steps.

The mini logs `clipped_frac` (rows whose SEQUENCE ratio to the REFERENCE, r_i = exp(Σ_t(ℓ − ℓ^ref)), is outside
[1 − ε, 1 + ε], whatever the sign of A) and `kl_div` (a sampled-token surrogate that can be negative). This runs
a few real `loss_type="rlvr_mini"` steps (the policy trains in place, the reference stays the base) and records,
per step, those numbers beside what they are made of: the mean per-token |ℓ − ℓ^ref|, the summed |s_i|, the
rows where the clip actually binds. Arms:

* `fp32`: policy and reference in fp32 (step 1: π = π_ref exactly);
* `policy_bf16`: the policy's forwards under bf16 autocast, the reference's in fp32 — the mini's own set-up
  (`use_bf16` for the policy log-probs, the reference in fp32): the two differ at step 1 already.

CLI: ``python -m rookworld_debug.lab.rlvr_reports --steps 4 --json out.json``.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import torch

from rookworld_debug.config import StepConfig


def _row(k: int, t) -> dict:
    lo, r = t.loss, t.rollout
    m = r.completion_mask.float()
    d = (r.per_token_logps - r.ref_per_token_logps) * m                                  # (N, T)
    s = d.sum(1)                                                                         # (N,)
    met = lo.metrics
    return {"step": k, "clipped_frac": met["rlvr/clipped_frac"], "clip_binding_frac": met["clip_ratio/region_mean"],
            "kl_div": met["rlvr/kl_div"], "kl_forward": met["rlvr/kl_forward"], "kl_reverse": met["rlvr/kl_reverse"],
            "k1_observation": met.get("rlvr/k1_observation", math.nan), "kl_coef": met["rlvr/kl_coef"],
            "ratio_mean": met["rlvr/ratio_mean"], "ratio_outliers": met["rlvr/ratio_outliers"],
            "mean_abs_token_logratio": float(d.abs().sum() / m.sum()), "mean_abs_seq_logratio": float(s.abs().mean()),
            "max_abs_seq_logratio": float(s.abs().max()), "mean_trained_tokens": float(m.sum(1).mean()),
            "reward_mean": float(torch.nanmean(t.rewards.rewards)),
            "grad_norm_pre_clip": t.update.grad_norm_pre_clip if t.update else math.nan}


def run(*, steps: int = 4, lr: float = 1e-5, policy_bf16: bool = False, seed: int = 0, batch_size: int = 4,
        num_generations: int = 4, max_new_tokens: int = 160, **overrides) -> list[dict]:
    """One arm: `steps` rlvr_mini steps on the same prompts, a new sample each step, the policy trained in place."""
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import run_step
    from rookworld_debug.models.precision import set_autocast
    cfg = StepConfig(loss_type="rlvr_mini", reward_mode="rlvr", task="mixed", batch_size=batch_size,
                     num_generations=num_generations, max_new_tokens=max_new_tokens, heldout_n=0,
                     eval_max_new_tokens=8, device="cpu", autocast="off", lr=lr, seed=seed, **overrides)
    s = setup(cfg)
    if policy_bf16:
        set_autocast("bf16", s.policy)           # the policy only: the reference keeps fp32
    rows = []
    for k in range(1, steps + 1):
        c = cfg.replace(seed=seed + k)
        t = run_step(c, session=replace(s, config=c))
        rows.append(_row(k, t))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = {"fp32": run(steps=a.steps, lr=a.lr), "policy_bf16": run(steps=a.steps, lr=a.lr, policy_bf16=True)}
    text = json.dumps(out, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
