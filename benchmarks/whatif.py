"""What-if cost and acceptance measurements on this machine; JSON under docs/bench/.

    python benchmarks/whatif.py cost          # 10-step × 3-seed × 2-arm branch; 5-arm one-step counterfactual
    python benchmarks/whatif.py trl-demo      # trl-demo branched before its learning-rate jump
    python benchmarks/whatif.py group-size    # a G = 2 run branched to G = 8, next to the G′ curve's prediction
    python benchmarks/whatif.py wrong-checkpoint

Each part measures and writes what it measured; nothing here asserts a time. One thread (the machine is shared).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cfg(**kw):
    from rookworld_debug import StepConfig
    base = dict(reward_mode="dataset", batch_size=4, num_generations=4, max_new_tokens=64, eval_max_new_tokens=64,
                heldout_n=4, device="cpu", lr=1e-5, top_k_alternatives=1)
    return StepConfig(**{**base, **kw})


def cost(tmp: Path) -> dict:
    from rookworld_debug import run_step
    from rookworld_debug.lab.bench_tools import ONE_STEP_SETS
    from rookworld_debug.whatif import arms_from_sets, whatif
    cfg = _cfg()
    run_step(cfg).save(tmp / "step")
    t0 = time.perf_counter()
    five = whatif(tmp / "step", arms_from_sets([list(g) for g in ONE_STEP_SETS]))   # the same arms as bench's (i)
    one_step_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = whatif(tmp / "step", arms_from_sets([["lr=1e-4"]]), steps=10, seeds=3)
    branch_s = time.perf_counter() - t0
    return {"config": cfg.to_dict(),
            "one_step_5_arms": {"seconds_total": one_step_s, "self_check": five.self_check.passed,
                                "seconds_per_arm": [a.seconds for a in five.one_step],
                                "includes": "loading the model and start state, self-check, 5 arms (update + greedy "
                                            "on the step's prompts)", "target_s": 30},
            "branch_10x3x2": {"seconds_total": branch_s, "seconds_per_run": [b.seconds for b in res.branches],
                              "includes": "loading, self-check, one-step per arm, 2 arms × 3 seeds × 10 steps of "
                                          "run_step (held-out greedy every step)", "target_s": 300,
                              "verdicts": [v.to_dict() for v in res.verdicts]}}


def trl_demo(tmp: Path) -> dict:
    from rookworld_debug.trl.demo import run_demo
    from rookworld_debug.trl.whatif_branch import trl_whatif
    from rookworld_debug.whatif import Arm
    out = tmp / "demo"
    meta0 = json.loads((out / "demo.json").read_text()) if (out / "demo.json").is_file() else None
    if meta0 is None:
        t0 = time.perf_counter()
        jump_default = 8
        run_demo(out, checkpoints=(jump_default - 2, jump_default - 1))
        demo_s = time.perf_counter() - t0
    meta = json.loads((out / "demo.json").read_text())
    raised = int(meta["lr_raised_after_step"])               # the last step trained at the sane learning rate
    capture, before = out / "captures" / f"step-{raised + 1:06d}", out / f"checkpoint-{raised}"
    arms = (Arm("unchanged", {}), Arm("lr restored", {"lr": float(meta["learning_rate"])}),
            Arm("beta x10 only", {"beta": float(meta["beta"]) * 10}))
    t0 = time.perf_counter()
    res = trl_whatif(capture, arms, before=before, steps=3, seeds=3, symptoms=("kl_spike",))
    d = res.to_dict()
    return {"demo": meta, "demo_seconds": None if meta0 else demo_s, "branch_from": str(before),
            "capture": str(capture), "whatif_seconds": time.perf_counter() - t0, "self_check": d["self_check"],
            "verdict": d["verdict"], "one_step": {a["name"]: a["update"] for a in d["arms"]},
            "trajectories_kl": {a["name"]: a["trajectories"].get("kl") for a in d["arms"]}}


def group_size(tmp: Path) -> dict:
    from rookworld_debug import run_step
    from rookworld_debug.whatif import arms_from_sets, whatif
    cfg = _cfg(num_generations=2)
    run_step(cfg).save(tmp / "g2")
    t0 = time.perf_counter()
    res = whatif(tmp / "g2", arms_from_sets([["num_generations=8"]]), steps=6, seeds=4, symptoms=("reward_noise",))
    return {"config": cfg.to_dict(), "seconds": time.perf_counter() - t0, "group_size": res.extra.get("group_size"),
            "verdict": res.to_dict()["verdict"]}


def wrong_checkpoint(tmp: Path) -> dict:
    from rookworld_debug.trl.whatif_branch import trl_whatif
    from rookworld_debug.whatif import Arm, SelfCheckError
    out = tmp / "demo"
    meta = json.loads((out / "demo.json").read_text())
    raised = int(meta["lr_raised_after_step"])
    try:     # the checkpoint AFTER the step instead of the one before it
        trl_whatif(out / "captures" / f"step-{raised + 1:06d}", (Arm("unchanged", {}),),
                   before=out / f"checkpoint-{raised + 1}")
        return {"refused": False}
    except SelfCheckError as err:
        return {"refused": True, "first_diverging": err.check.first_diverging, "message": str(err)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=("cost", "trl-demo", "group-size", "wrong-checkpoint", "all"))
    ap.add_argument("--work", help="work folder (default: a temporary one; the trl-demo run is reused from it)")
    ap.add_argument("--out", default=str(REPO / "docs" / "bench"))
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="whatif-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    parts = ("cost", "trl-demo", "group-size", "wrong-checkpoint") if a.part == "all" else (a.part,)
    fns = {"cost": cost, "trl-demo": trl_demo, "group-size": group_size, "wrong-checkpoint": wrong_checkpoint}
    for p in parts:
        if p == "wrong-checkpoint" and not (work / "demo" / "demo.json").is_file():
            trl_demo(work)
        t0 = time.perf_counter()
        got = fns[p](work)
        got.update(part=p, wall_seconds=time.perf_counter() - t0, machine=platform.platform(),
                   cpu_threads=torch.get_num_threads(), date=time.strftime("%Y-%m-%d %H:%M"))
        f = Path(a.out) / f"whatif-{p}-{time.strftime('%Y%m%d')}.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(got, indent=1, default=str))
        print(f"{p}: {got['wall_seconds']:.1f} s → {f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
