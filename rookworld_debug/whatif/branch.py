"""k-step branches: from the saved state, k steps per arm with fresh rollouts, S seeds shared across arms.

Every (arm, seed) run starts from the same weights and AdamW moments (`state.restore`) and runs
`grpo.multistep.loop.run_steps` (the project's own step, k times) with the arm's configuration and seed s_j =
config.seed + j: step k of every arm samples with `step_seed(s_j, k)` on the same prompts, so arm and unchanged
arm form paired trajectories (`stats.verdict`). β and the learning rate are held at the arm's values over the
branch (constant schedules). On a Dask cluster each (arm, seed) run is one task that opens the saved state itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rookworld_debug.errors import ConfigError
from rookworld_debug.whatif.overrides import Arm
from rookworld_debug.whatif.state import SavedState, load_state, restore

# trajectory columns: the per-step table's, with TRL's metric names where the step's summary has them
TRAJECTORY = {
    "rollout_reward": "mean training reward of the N sampled completions (sampled rollout)",
    "heldout_reward_after": "greedy built-in reward on the held-out prompts after the step's update (held-out)",
    "kl": "raw KL(π‖π_ref), nats/token, token mean of the sampled rollout (TRL `kl`)",
    "entropy": "mean token entropy of the tempered policy on the sampled rollout",
    "grad_norm_pre_clip": "global L2 grad norm before clipping",
    "clip_ratio/region_mean": "fraction of tokens whose ratio left [1 − ε_low, 1 + ε_high] (TRL)",
    "reward_std": "std of the N sampled rewards",
    "param_delta_norm": "‖θ_after − θ_before‖₂ of the step",
}


@dataclass(frozen=True)
class BranchRun:
    """One arm × one seed: the branch's per-step values."""
    arm: str
    seed: int
    rows: tuple                         # one dict per step: "step" + TRAJECTORY columns
    seconds: float

    def series(self, metric: str) -> list:
        return [r.get(metric, math.nan) for r in self.rows]

    def to_dict(self) -> dict:
        from rookworld_debug.whatif.stats import _num
        return {"arm": self.arm, "seed": self.seed, "seconds": self.seconds,
                "rows": [{k: (_num(v) if isinstance(v, float) else v) for k, v in r.items()} for r in self.rows]}


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def seeds_for(config, n: int) -> tuple:
    if not isinstance(n, int) or n < 1:
        raise ConfigError("seeds", f"must be an integer ≥ 1, got {n!r}")
    return tuple(config.seed + j for j in range(n))


def run_arm_seed(state: SavedState, arm: Arm, seed: int, steps: int, *, on_step: Optional[Callable] = None) -> BranchRun:
    """k steps of one arm from the start state with sampling seed `seed` (module doc)."""
    import time
    from rookworld_debug.grpo.multistep.loop import run_steps
    from rookworld_debug.whatif.onestep import _set_optimizer
    t0 = time.perf_counter()
    cfg = arm.config(state.config).replace(seed=seed)
    restore(state)
    _set_optimizer(state.session.optimizer, cfg)
    rows = []

    def collect(row, trace):
        summ = trace.summary()
        vals = {k: _float(row.get(k, summ.get(k))) for k in TRAJECTORY}
        rows.append({"step": state.step + int(row["step"]), **vals})
        if on_step is not None:
            on_step()
    # the session as saved: each step applies what the arm changes (precision, the reference's device) to it
    run_steps(cfg, steps, session=state.session, keep_traces=False, on_step=collect)
    return BranchRun(arm.name, seed, tuple(rows), time.perf_counter() - t0)


def branch_job(spec: dict) -> dict:
    """One (arm, seed) run in a fresh process (a Dask task): opens the saved state itself."""
    import torch
    torch.set_num_threads(int(spec.get("threads", 1)))
    state = load_state(spec["path"], before=spec.get("before"), device=spec.get("device", "cpu"))
    arm = Arm(spec["arm"], dict(spec["overrides"]))
    return run_arm_seed(state, arm, int(spec["seed"]), int(spec["steps"])).to_dict()


def branch(state: SavedState, arms: Sequence[Arm], *, steps: int, seeds: int, on_step: Optional[Callable] = None,
           cluster=None) -> tuple:
    """BranchRun per (arm, seed), arms in order, seeds inner. `on_step()` after every step (progress bars)."""
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", f"must be an integer ≥ 1, got {steps!r}")
    for arm in arms:
        arm.config(state.config)                 # every override validated before the first run
    seed_list = seeds_for(state.config, seeds)
    if cluster is not None:
        return _on_cluster(state, arms, steps, seed_list, cluster, on_step)
    out = [run_arm_seed(state, arm, s, steps, on_step=on_step) for arm in arms for s in seed_list]
    restore(state)
    return tuple(out)


def _on_cluster(state, arms, steps, seed_list, cluster, on_step) -> tuple:
    try:
        import distributed
    except ImportError:
        raise ConfigError("cluster", "a Dask cluster needs dask[distributed] (pip install 'rookworld-debug[cluster]')"
                          ) from None
    try:
        client = cluster if isinstance(cluster, distributed.Client) else distributed.Client(cluster, timeout="30s")
    except Exception as err:  # noqa: BLE001 - any connection failure names the address
        raise ConfigError("cluster", f"cannot reach the Dask scheduler at {cluster!r} within 30 s: {err}") from None
    specs = [{"path": state.path, "before": state.before, "device": state.session.config.device, "arm": a.name,
              "overrides": dict(a.overrides), "seed": s, "steps": steps} for a in arms for s in seed_list]
    try:
        futs = client.map(branch_job, specs, pure=False)
        results = []
        for f in futs:
            d = f.result()
            rows = tuple({k: (v if k == "step" else _float(v)) for k, v in r.items()} for r in d["rows"])
            results.append(BranchRun(d["arm"], int(d["seed"]), rows, float(d["seconds"])))
            if on_step is not None:
                for _ in range(steps):
                    on_step()
        return tuple(results)
    finally:
        if client is not cluster:
            client.close()
