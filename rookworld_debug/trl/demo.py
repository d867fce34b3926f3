"""`rookworld-debug trl-demo`: a TRL run that visibly goes wrong, recorded by the flight recorder.

    rookworld-debug trl-demo --out runs/demo           # 12 steps on the embedded tiny model, about a minute on a CPU
    rookworld-debug triage runs/demo                   # the curves, the trigger, the lead-up, the samples

How it goes wrong (on purpose, and said in the run's README): TRL's GRPOTrainer trains the tiny model with the
project's reward functions at a sane learning rate (1e-5); after step ``--jump-at`` − 2 a callback
multiplies the learning rate by ``--lr-factor`` (10^4) for the rest of the run, as a bad schedule or a unit
mistake would. The update of step ``--jump-at`` − 1 is huge, so at step ``--jump-at`` (whose metrics are
measured before its own update) the policy has moved far from the reference: the KL jumps by orders of magnitude, the entropy collapses and the reward falls. The flight
recorder (``keep_last=3``, the built-in triggers) writes the step where the triggers fire and the three held
steps before it into OUT/captures; OUT/trainer_state.json is TRL's log history, kept up to date every step.
The Trainer checkpoints saved after steps ``--jump-at`` − 2 and ``--jump-at`` − 1 (OUT/checkpoint-N, weights and
optimizer state) are what `rookworld-debug whatif OUT` branches from: the step before the jump, re-run with a fix.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

# the example's budget, which the tiny model's completions fit in: the run is healthy until the jump (with 48
# every completion is cut: no learning signal at all)
from rookworld_debug.trl.example import MAX_COMPLETION_LENGTH


def _callbacks(out: Path, jump_at: int, factor: float):
    from transformers import TrainerCallback

    class LRJump(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
            if state.global_step == jump_at - 2 and optimizer is not None:
                for g in optimizer.param_groups:
                    g["lr"] *= factor
                if lr_scheduler is not None:       # the constant schedule would reset it: scale its bases too
                    lr_scheduler.base_lrs = [lr * factor for lr in lr_scheduler.base_lrs]

    class StateWriter(TrainerCallback):
        """trainer_state.json at the top of OUT after every log: a run in progress can be triaged."""
        def on_log(self, args, state, control, **kw):
            if state.is_world_process_zero:
                state.save_to_json(str(out / "trainer_state.json"))

    return [LRJump(), StateWriter()]




def _save_at(steps):
    from transformers import TrainerCallback

    class SaveAt(TrainerCallback):
        """Trainer checkpoints (weights, AdamW, scheduler, RNG) after the chosen steps only: what a branch starts from."""
        def on_step_end(self, args, state, control, **kw):
            if state.global_step in steps:
                control.should_save = True
    return SaveAt()


def run_demo(out, *, steps: int = 12, jump_at: int = 8, lr_factor: float = 1e4, keep_last: int = 3, seed: int = 0,
             checkpoints: tuple = (), max_completion_length: int = MAX_COMPLETION_LENGTH, device: str = "cpu"):
    from rookworld_debug.trl.capture import capture_steps
    from rookworld_debug.trl.example import make_trainer, tiny_dataset
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(__doc__.split("How it goes wrong")[0] + "How it goes wrong" +
                                   __doc__.split("How it goes wrong")[1].replace("``--jump-at``", str(jump_at))
                                   .replace("``--lr-factor``", f"{lr_factor:g}"))
    trainer = make_trainer(out, max_steps=steps, learning_rate=1e-5, lr_scheduler_type="constant", seed=seed,
                           dataset=tiny_dataset(8), max_completion_length=max_completion_length, device=device)
    for cb in _callbacks(out, jump_at, lr_factor):
        trainer.add_callback(cb)
    if checkpoints:
        trainer.add_callback(_save_at(set(checkpoints)))
    _write_meta(out, trainer, steps=steps, jump_at=jump_at, lr_factor=lr_factor, seed=seed, checkpoints=checkpoints,
                device=device)
    cap = capture_steps(trainer, out_dir=out / "captures", keep_last=keep_last, triggers="default")
    trainer.train()
    return trainer, cap


def _write_meta(out: Path, trainer, **kw) -> None:
    """demo.json: how the run was made (a branch rebuilds its trainer from it; the jump step is read from it)."""
    import json
    a = trainer.args
    meta = {**kw, "checkpoints": sorted(kw.get("checkpoints") or ()), "lr_raised_after_step": kw["jump_at"] - 2,
            "n_prompts": len(trainer.train_dataset), "reward_mode": "dataset", "learning_rate": a.learning_rate,
            "beta": a.beta, "num_generations": a.num_generations, "max_completion_length": a.max_completion_length}
    (out / "demo.json").write_text(json.dumps(meta, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug trl-demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/trl-demo", help="the run folder (TRL output_dir; captures/ inside)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--jump-at", type=int, default=8, help="the step whose metrics jump (the LR is raised after step jump-at − 2)")
    ap.add_argument("--lr-factor", type=float, default=1e4)
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-completion-length", type=int, default=MAX_COMPLETION_LENGTH,
                    help=f"completion budget (default {MAX_COMPLETION_LENGTH}: the completions end; 48 cuts them all)")
    ap.add_argument("--device", default="cpu", help="'cpu' (default) or 'cuda': TRL trains on the GPU under bf16 "
                    "autocast, as its users run it")
    ap.add_argument("--no-checkpoints", action="store_true",
                    help="do not save the Trainer checkpoints after steps jump-at − 2 and jump-at − 1 (saved by "
                    "default: what `rookworld-debug whatif OUT` branches from; about 60 MB each)")
    ap.add_argument("--checkpoints-around-jump", action="store_true", help=argparse.SUPPRESS)   # the default now
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from rookworld_debug.errors import ConfigError
    if not 3 <= a.jump_at <= a.steps:
        raise ConfigError("--jump-at", f"needs 3 ≤ jump-at ≤ steps, got jump-at {a.jump_at}, steps {a.steps}")
    if not (math.isfinite(a.lr_factor) and a.lr_factor > 0):
        raise ConfigError("--lr-factor", f"the learning rate is multiplied by it: a finite number > 0, got {a.lr_factor}")
    if a.keep_last < 0:
        raise ConfigError("--keep-last", f"a number of held steps ≥ 0, got {a.keep_last}")
    from rookworld_debug.models.devices import check_device
    if check_device(a.device, "--device").type not in ("cpu", "cuda"):
        raise ConfigError("--device", f"TRL's demo runs on 'cpu' or 'cuda', got {a.device!r}")
    import torch
    torch.set_num_threads(min(2, torch.get_num_threads()))
    from tqdm.auto import tqdm
    with tqdm(total=1, desc="trl-demo (GRPOTrainer)", disable=None, file=sys.stderr) as bar:
        trainer, cap = run_demo(a.out, steps=a.steps, jump_at=a.jump_at, lr_factor=a.lr_factor,
                                keep_last=a.keep_last, seed=a.seed, max_completion_length=a.max_completion_length,
                                device=a.device,
                                checkpoints=() if a.no_checkpoints else (a.jump_at - 2, a.jump_at - 1))
        bar.update(1)
    print(f"trained {trainer.state.global_step} steps; captured {sorted(cap.paths)} "
          f"(why: {Path(a.out) / 'captures' / 'captures.json'})")
    out = shlex.quote(str(a.out))
    print(f"next: rookworld-debug triage {out}")
    if not a.no_checkpoints:
        print(f"then: rookworld-debug whatif {out} --set lr=1e-5 --steps 3   (branches from checkpoint-{a.jump_at - 2})")
    return 1 if cap.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
