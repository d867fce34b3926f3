"""`rookworld-debug run`: N GRPO steps (same phases as `step`) with a batch cursor, β/LR schedules,
checkpoints, a progress bar and a live one-line-per-step log; writes table.csv + summary.json.

Examples:
  rookworld-debug run --steps 20 --set lr=1e-5 --set reward_mode=dataset
  rookworld-debug run --steps 50 --mode fresh --beta-schedule warmup --beta-warmup-steps 10 \\
      --lr-schedule warmup_cosine --checkpoint-every 10 --out reports/run1
  rookworld-debug run --steps 50 --resume reports/run1/checkpoints/step_00020 --out reports/run1
  rookworld-debug run --steps 3 --keep-steps --out reports/run2 && rookworld-debug diagnose reports/run2/steps
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def format_step_line(row: dict, steps: int) -> str:
    """One line per step (a view over the table row)."""
    def f(x, spec):
        return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)
    return (f"step {row['step'] + 1:>{len(str(steps))}}/{steps} batch {row['batch_hash'][:10]} "
            f"ep {row['epoch']} cur {row['cursor']} β={f(row['beta'], '.4g')} lr={f(row['lr'], '.3g')} "
            f"greedy reward {f(row['reward_before'], '.3f')}→{f(row['reward_after'], '.3f')} "
            f"(Δ{f(row['delta_reward'], '+.3f')}, this batch) sampled={f(row['rollout_reward'], '.3f')} "
            f"KL={f(row['kl'], '.4g')} KL%grad={f(100 * row.get('kl_grad_share', math.nan), '.1f')} "
            f"|g|={f(row['grad_norm_pre_clip'], '.3g')}→{f(row['grad_norm_post_clip'], '.3g')} "
            f"{f(row.get('sec/total', math.nan), '.1f')}s" + ("" if row["updated"] else "  [UPDATE REFUSED]"))


def build_parser() -> argparse.ArgumentParser:
    from rookworld_debug.grpo.multistep.checkpoint import MODES       # light modules: --help without torch
    from rookworld_debug.grpo.multistep.schedules import BETA_KINDS, LR_KINDS
    from rookworld_debug.cli_step import KeysHelpParser
    p = KeysHelpParser(prog="rookworld-debug run", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, required=True, help="total number of steps N (also the LR schedule length)")
    p.add_argument("--config", help="YAML or JSON file with StepConfig fields")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one StepConfig field (repeatable), e.g. --set beta=0.05")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="overfit_single_batch (default: the same B prompts every step) or fresh (cursor over a "
                        "seeded shuffled order, wrapping)")
    p.add_argument("--beta-schedule", choices=BETA_KINDS, default=None, help="β per step (default constant)")
    p.add_argument("--beta-target", type=float, default=None, help="β after warmup / initial adaptive β "
                   "(default: config beta)")
    p.add_argument("--beta-warmup-steps", type=int, default=0, help="steps 0..K−1 use β = 0")
    p.add_argument("--target-kl", type=float, default=0.1, help="adaptive: target RAW KL (nats/token)")
    p.add_argument("--kl-horizon", type=float, default=10.0, help="adaptive: horizon in steps (β moves ≤ 0.2/h)")
    p.add_argument("--lr-schedule", choices=LR_KINDS, default=None, help="lr per step (default constant)")
    p.add_argument("--lr-warmup-steps", type=int, default=0)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--heldout-every", type=int, default=1, help="held-out greedy eval every K steps (and the last)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="K")
    p.add_argument("--checkpoint-dir", default=None, help="default: OUT/checkpoints")
    p.add_argument("--out", default="reports/run", help="folder for table.csv, per_prompt.csv, summary.json")
    p.add_argument("--resume", default=None, metavar="DIR", help="a checkpoint folder (…/step_00010)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (the per-step log still prints)")
    p.add_argument("--keep-steps", action="store_true", help="save every step's trace (with its weights, gradient "
                   "and optimizer state: ~120 MB a step on the embedded model) in OUT/steps/step-NNNNN, so that "
                   "`rookworld-debug diagnose OUT/steps` checks each step and what carries over between them")
    return p


def main(argv: list[str] | None = None) -> int:
    """`rookworld-debug run` (errors: one line, exit 2; see cli.run_guarded)."""
    from rookworld_debug.cli import run_guarded
    return run_guarded("run", _main, argv)


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rookworld_debug.errors import ConfigError, RookWorldError
    from rookworld_debug.safeio import check_input_file, check_output_dir
    out = check_output_dir(args.out, "--out")          # before the run (and torch): a bad --out must not cost N steps
    if args.config:
        check_input_file(args.config, "--config")
    if args.steps is not None and args.steps < 1:
        raise ConfigError("--steps", f"must be ≥ 1, got {args.steps}")
    from tqdm.auto import tqdm

    from rookworld_debug.cli_step import config_from_args
    from rookworld_debug.grpo.multistep.loop import BetaSchedule, LRSchedule, run_steps
    bar = None
    try:
        resuming = args.resume is not None
        config = config_from_args(args.config, args.overrides) if (args.config or args.overrides or not resuming) \
            else None
        beta = None if (resuming and args.beta_schedule is None) else BetaSchedule(
            kind=args.beta_schedule or "constant", target=args.beta_target, warmup_steps=args.beta_warmup_steps,
            target_kl=args.target_kl, horizon=args.kl_horizon)
        lr = None if (resuming and args.lr_schedule is None) else LRSchedule(
            kind=args.lr_schedule or "constant", warmup_steps=args.lr_warmup_steps, min_lr=args.min_lr)
        bar = None if args.no_progress else tqdm(total=args.steps, desc="GRPO steps", unit="step", file=sys.stderr)
        started = []

        def on_step(row, trace):
            if args.keep_steps:                 # 1-based like the log's "step k/N"
                trace.save(out / "steps" / f"step-{row['step'] + 1:05d}")
            line = format_step_line(row, args.steps)
            if bar is None:
                print(line, flush=True)
                return
            if not started:
                bar.update(row["step"])          # resumed runs start past 0
                started.append(True)
            bar.write(line, file=sys.stdout)
            bar.update(1)

        ckdir = args.checkpoint_dir or (str(out / "checkpoints") if args.checkpoint_every else None)
        result = run_steps(config, args.steps, mode=args.mode, beta_schedule=beta, lr_schedule=lr,
                           checkpoint_every=args.checkpoint_every, checkpoint_dir=ckdir, resume_from=args.resume,
                           on_step=on_step, heldout_every=args.heldout_every, keep_traces=False)
        if bar is not None:
            bar.close()
    except RookWorldError:
        if bar is not None:
            bar.close()
        raise                                  # one error line in cli.run_guarded
    result.save(out)
    s = result.summary()

    def g(k):
        v = s.get(k, math.nan)
        return "nan" if isinstance(v, float) and math.isnan(v) else (f"{v:.4g}" if isinstance(v, float) else v)
    print(f"summary: start {g('start_reward')} → end {g('end_reward')} (Δ {g('end_minus_start')}); "
          f"PosSteps={g('pos_steps')} NegSteps={g('neg_steps')}; mean Δ {g('mean_delta')} ± {g('mean_delta_ci95')}; "
          f"slope {g('slope')} ± {g('slope_ci95')}/step; best step {g('best_step')} ({g('best_reward')}), worst "
          f"{g('worst_step')} ({g('worst_reward')}); mean KL share of gradient {g('mean_kl_grad_share')}; "
          f"{g('seconds_per_step')} s/step")
    print(f"written: {out}/table.csv, {out}/per_prompt.csv, {out}/summary.json"
          + (f"; checkpoints: {', '.join(str(c) for c in result.checkpoints)}" if result.checkpoints else ""))
    return 0 if bool(result.table["updated"].all()) else 1


if __name__ == "__main__":
    sys.exit(main())
