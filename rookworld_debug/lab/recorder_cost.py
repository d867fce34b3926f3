"""What the flight recorder costs: measured, not assumed.

    python -m rookworld_debug.lab.recorder_cost --model tiny --steps 6 --keep-last 4
    python -m rookworld_debug.lab.recorder_cost --model gpt2-124m --steps 3 --keep-last 2 --max-completion-length 64
    python -m rookworld_debug.lab.recorder_cost --keep-weights --model gpt2-124m --steps 2

`--keep-weights`: a capture of the last step with `keep_weights=True` instead: the seconds and bytes of its weight
snapshots, the size of its state/ on disk, and the replay of the written step (its wall time and each phase).

Runs TRL's GRPOTrainer with the flight recorder holding K steps and no trigger (so nothing is written while
training), then writes one held step. Reported, per step: the seconds the capture code itself spent
(copies, hooks, per-layer grad norms; `StepCapture.cost`, timed inside the hooks) against TRL's own step
time (`step_time` in its log), the bytes held per step, and the seconds to write one held step. The
share is the capture's own time over the step time: it does not see indirect effects (memory pressure),
which the wall time of a second, uncaptured run would (noisy on a shared CPU; `--compare` runs it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rookworld_debug import cliargs


def measure(model: str = "tiny", *, steps: int = 6, keep_last: int = 4, max_completion_length: int = 48,
            num_generations: int = 4, prompts_per_step: int = 2, compare: bool = False, threads: int = 2) -> dict:
    import torch
    from trl import GRPOTrainer

    from rookworld_debug.lab.bench import materialize_model
    from rookworld_debug.models import load_policy_and_reference
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import grpo_config, tiny_dataset
    from rookworld_debug.trl.rewards import rookworld_reward_funcs

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="recorder-cost-") as tmp:
        folder, info = materialize_model(model, Path(tmp) / "model")
        tok = load_policy_and_reference(folder).tokenizer

        def trainer():
            args = grpo_config(Path(tmp) / "run", max_steps=steps, num_generations=num_generations,
                               prompts_per_step=prompts_per_step, max_completion_length=max_completion_length,
                               gradient_checkpointing=False)
            return GRPOTrainer(model=folder, reward_funcs=rookworld_reward_funcs("dataset"), args=args,
                               train_dataset=tiny_dataset(2 * prompts_per_step), processing_class=tok)

        t = trainer()
        cap = capture_steps(t, out_dir=Path(tmp) / "captures", keep_last=keep_last)
        t0 = time.perf_counter()
        t.train()
        wall = time.perf_counter() - t0
        step_times = [float(d["step_time"]) for d in t.state.log_history if "step_time" in d]
        held = [c for s, c in sorted(cap.cost.items()) if c["captured"]]
        t1 = time.perf_counter()
        cap._write(cap._held[-1], [])             # one held step, written as a trigger would
        write_s = time.perf_counter() - t1
        res = {"model": model, "model_info": info, "steps": steps, "keep_last": keep_last,
               "max_completion_length": max_completion_length, "rows_per_step": num_generations * prompts_per_step,
               "threads": threads, "wall_seconds_captured_run": wall,
               "trl_step_seconds_median": statistics.median(step_times[1:] or step_times),
               "capture_seconds_per_step_median": statistics.median(c["seconds"] for c in held[1:] or held),
               "held_bytes_per_step_median": statistics.median(c["bytes"] for c in held),
               "write_one_step_seconds": write_s, "written_bytes": sum(
                   f.stat().st_size for f in (Path(tmp) / "captures").rglob("*") if f.is_file())}
        res["overhead_share"] = res["capture_seconds_per_step_median"] / res["trl_step_seconds_median"]
        if compare:
            t = trainer()
            t0 = time.perf_counter()
            t.train()
            res["wall_seconds_plain_run"] = time.perf_counter() - t0
        return res


def measure_kept(model: str = "tiny", *, steps: int = 2, max_completion_length: int = 48, num_generations: int = 4,
                 prompts_per_step: int = 2, threads: int = 2) -> dict:
    """A run of `steps` steps whose last is captured with its weights; then that step replayed."""
    import torch
    from trl import GRPOTrainer

    from rookworld_debug.diagnosis.replay import replay_path
    from rookworld_debug.lab.bench import materialize_model
    from rookworld_debug.models import load_policy_and_reference
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import grpo_config, tiny_dataset
    from rookworld_debug.trl.rewards import rookworld_reward_funcs

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="recorder-cost-") as tmp:
        folder, info = materialize_model(model, Path(tmp) / "model")
        tok = load_policy_and_reference(folder).tokenizer
        args = grpo_config(Path(tmp) / "run", max_steps=steps, num_generations=num_generations,
                           prompts_per_step=prompts_per_step, max_completion_length=max_completion_length,
                           gradient_checkpointing=False)
        t = GRPOTrainer(model=folder, reward_funcs=rookworld_reward_funcs("dataset"), args=args,
                        train_dataset=tiny_dataset(2 * prompts_per_step), processing_class=tok)
        cap = capture_steps(t, [steps], Path(tmp) / "captures", keep_weights=True)
        t.train()
        if cap.errors:
            raise RuntimeError(f"the capture failed: {cap.errors}")
        step_times = [float(d["step_time"]) for d in t.state.log_history if "step_time" in d]
        path = cap.paths[steps]
        t0 = time.perf_counter()
        rep = replay_path(path)
        replay_s = time.perf_counter() - t0
        state_bytes = sum(f.stat().st_size for f in (path / "state").rglob("*") if f.is_file())
        res = {"model": model, "model_info": info, "steps": steps, "captured_step": steps,
               "max_completion_length": max_completion_length, "rows_per_step": num_generations * prompts_per_step,
               "threads": threads, "trl_step_seconds": step_times[-1] if step_times else None,
               "capture_seconds_with_weights": cap.cost[steps]["seconds"],
               "capture_bytes_with_weights": cap.cost[steps]["bytes"], "state_bytes_on_disk": state_bytes,
               "replay_seconds": replay_s, "replay_phases": {p["phase"]: p["status"] for p in rep.phases()},
               "first_disagreement": None if rep.first_disagreement is None else rep.first_disagreement.to_dict()}
        res["capture_share_of_step"] = res["capture_seconds_with_weights"] / res["trl_step_seconds"] \
            if res["trl_step_seconds"] else None
        return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.lab.recorder_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' or 'gpt2-124m' (random GPT2Config(), GPT-2 BPE)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--keep-last", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=48)
    ap.add_argument("--threads", type=cliargs.threads, default=2)
    ap.add_argument("--compare", action="store_true", help="also time an uncaptured run (wall clock)")
    ap.add_argument("--keep-weights", action="store_true",
                    help="capture the last step with its weights and replay it (see above)")
    ap.add_argument("--json", default=None, help="write the result here")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    res = measure_kept(a.model, steps=a.steps, max_completion_length=a.max_completion_length, threads=a.threads) \
        if a.keep_weights else \
        measure(a.model, steps=a.steps, keep_last=a.keep_last, max_completion_length=a.max_completion_length,
                compare=a.compare, threads=a.threads)
    print(json.dumps(res, indent=1, default=str))
    if a.json:
        from rookworld_debug.safeio import atomic_write_json
        atomic_write_json(a.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
