"""Worked example: train the embedded tiny model with TRL's GRPOTrainer and the project's reward
functions for a few steps, capture two of them, and open them.

    python -m rookworld_debug.trl.example --out captures/demo            # 3 steps, captures steps 1 and 3
    rookworld-debug report --trace captures/demo/step-000003              # the HTML report of one of them

The batch alternates A: and P: prompts so both reward functions score every step (P: against the
dataset label, no engine needed; pass --reward-mode engine for Stockfish). The completion budget (160 tokens)
fits the task: the tiny model's completions end within ~110 tokens (P:) and ~60 (A:), so every completion
is scored whole (a budget they do not fit in cuts them all: no learning signal). About 2 s a step on a CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional, Sequence


def tiny_dataset(n_prompts: int = 4):
    """Alternating A:/P: prompts of the bundled sample, with their dataset completion as `label`."""
    from datasets import Dataset

    from rookworld_debug.data.loaders import load_bundled
    train = load_bundled(split="train")
    a = [s for s in train if s.task == "A"]
    p = [s for s in train if s.task == "P"]
    rows = [x for pair in zip(a, p) for x in pair][:n_prompts]
    return Dataset.from_dict({"prompt": [s.prompt for s in rows], "label": [s.completion for s in rows]})


# the tiny model's completions end within ~110 tokens (P:) and ~60 (A:): a budget they fit in, with room
MAX_COMPLETION_LENGTH = 160


def grpo_config(output_dir, *, max_steps: int = 3, seed: int = 0, num_generations: int = 4, prompts_per_step: int = 2,
                max_completion_length: int = MAX_COMPLETION_LENGTH, beta: float = 0.1, learning_rate: float = 1e-5,
                device: str = "cpu", **overrides):
    """A small, CPU-friendly GRPOConfig: fp32, no dropout, one generation batch per optimizer step, log every step.
    `device` 'cuda': TRL picks the GPU (accelerate) and trains under bf16 autocast (`bf16=True`), as users run it."""
    from trl import GRPOConfig
    kw = dict(output_dir=str(output_dir), per_device_train_batch_size=num_generations * prompts_per_step,
              num_generations=num_generations, max_steps=max_steps, max_completion_length=max_completion_length,
              temperature=1.0, beta=beta, learning_rate=learning_rate, logging_steps=1, report_to="none",
              save_strategy="no", use_cpu=device == "cpu", bf16=device.startswith("cuda"), disable_dropout=True, seed=seed, disable_tqdm=True,
              model_init_kwargs={"dtype": "float32"}, shuffle_dataset=False, dataloader_num_workers=0)
    kw.update(overrides)
    return GRPOConfig(**kw)


def make_trainer(output_dir, *, reward_mode: str = "dataset", dataset=None, **config_kw):
    """GRPOTrainer on the embedded tiny model (policy and reference loaded from its folder)."""
    from trl import GRPOTrainer

    from rookworld_debug.models import load_policy_and_reference
    from rookworld_debug.models.loading import TINY_DIR
    from rookworld_debug.trl.rewards import rookworld_reward_funcs
    tok = load_policy_and_reference("tiny").tokenizer            # pad = EOS, left padding (as the package uses it)
    return GRPOTrainer(model=str(TINY_DIR), reward_funcs=rookworld_reward_funcs(reward_mode),
                       args=grpo_config(output_dir, **config_kw), train_dataset=dataset or tiny_dataset(),
                       processing_class=tok)


def run(out_dir, *, steps: int = 3, capture: Optional[Sequence[int]] = (1, 3), reward_mode: str = "dataset",
        keep_weights: bool = False, **config_kw):
    """Train `steps` steps, capturing `capture` (None: no capture; `keep_weights`: with the weights the replay
    needs). Returns (trainer, StepCapture | None)."""
    from rookworld_debug.trl.capture import capture_steps
    out_dir = Path(out_dir)
    trainer = make_trainer(out_dir / "trainer", reward_mode=reward_mode, max_steps=steps, **config_kw)
    cap = capture_steps(trainer, capture, out_dir, keep_weights=keep_weights) if capture else None
    trainer.train()
    return trainer, cap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.trl.example", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="captures/demo", help="folder for the captured steps (step-NNNNNN/)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps to train (default 3)")
    ap.add_argument("--capture", default="1,3", help="comma-separated steps to capture (default 1,3)")
    ap.add_argument("--reward-mode", default="dataset", choices=("dataset", "engine"))
    ap.add_argument("--max-completion-length", type=int, default=MAX_COMPLETION_LENGTH)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    from rookworld_debug import StepTrace
    from rookworld_debug.errors import RookWorldError
    torch.set_num_threads(min(2, torch.get_num_threads()))
    try:
        steps = [int(s) for s in args.capture.split(",") if s.strip()]
        t0 = time.perf_counter()
        trainer, cap = run(args.out, steps=args.steps, capture=steps, reward_mode=args.reward_mode,
                           max_completion_length=args.max_completion_length, seed=args.seed)
    except (RookWorldError, ValueError) as err:
        print(f"example: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    logged = {d["step"]: d for d in trainer.state.log_history if "loss" in d}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "trl_log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    print(f"trained {trainer.state.global_step} TRL steps in {wall:.1f} s; captured {sorted(cap.paths)}")
    print(f"{'step':>4} {'captured':>8} {'capture s':>9} {'bytes':>8} {'TRL logged loss':>16} {'record loss':>14} "
          f"{'|Δ|':>8} {'max|ΔA|':>8}")
    for row in cap.cost_table():
        s = row["step"]
        line = f"{s:>4} {str(row['captured']):>8} {row['seconds']:>9.3f} {row['bytes']:>8}"
        if s in cap.paths:
            tr = StepTrace.load(cap.paths[s])          # what a notebook, panel or report opens
            lg = float(logged.get(s, {}).get("loss", math.nan))
            line += (f" {lg:>16.8g} {float(tr.loss.loss):>14.8g} {abs(lg - float(tr.loss.loss)):>8.1e}"
                     f" {tr.capture.advantages_recompute_diff:>8.1e}")
        print(line)
    for s, err in cap.errors.items():
        print(f"  capture of step {s} FAILED: {err}", file=sys.stderr)
    for s, p in sorted(cap.paths.items()):
        print(f"step {s}: {p}   (rookworld-debug report --trace {p})")
    return 1 if cap.errors else 0


if __name__ == "__main__":
    sys.exit(main())
