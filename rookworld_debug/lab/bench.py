"""`rookworld-debug bench`: one GRPO step, four ways, on the same machine, model, prompts, seed and config.

Variants (``lab/bench_variants.py``; docs/PERFORMANCE.md says what each does and every setting that makes
them equivalent):

- a  ours, core step: generate → rewards → advantages → loss → update (the phase functions composed,
     no top-k alternatives, no per-term gradients, no evaluation; no policy scoring forward at μ = 1 —
     the old log-probs are the training forward's, as in TRL; the reference forward only if β ≠ 0);
- b  ours, the fully instrumented `run_step` (ref log-probs, entropy, exact KL, top-k, per-term
     gradients, greedy before/after evaluation on the batch and the held-out prompts);
- c  TRL `GRPOTrainer`, one optimizer step configured to do the same work as (a);
- d  a faithful re-implementation of one step of rookworld-trl's manual debug loop
     (`manual_grpo_debug.py`): per-prompt `generate`
     with `num_return_sequences=G`, per-sample log-prob prints, per-completion UNCACHED sequential
     Stockfish calls, per-sample forward/backward, greedy post-update evaluation.

Method. Each variant lives in its own worker process (`--isolate process`, the default), so its peak
RSS is its own. Every run starts from freshly loaded weights (from one saved folder) and a fresh
engine (empty cache); that preparation is not timed. Each worker does `--warmup` untimed runs, then
the parent asks the workers for runs in alternation a, b, c, d, a, b, … for `--reps` repetitions and
reports medians. RSS is sampled every 5 ms by a thread during the timed step (psutil), and the
kernel's high-water mark (`ru_maxrss`) of the worker is reported too. Stockfish's own processes are
not included (16 MB hash each). Measuring: ``lab/bench_measure.py``; summaries, ratios, targets and tables:
``lab/bench_report.py``.

And the diagnosis and what-if tools on (b)'s step, each in its own worker too (``lab/bench_tools.py``):

- g  `rookworld-debug diagnose` on (b)'s step saved to disk (load + every step check + the findings' JSON);
- h  `rookworld-debug diagnose` on a TRL run folder with a 10,000-step log (a KL runaway and jumps that fire);
- i  `rookworld-debug whatif` on the saved step with 5 arms (the one-step counterfactual);
- j  `rookworld-debug whatif` on the saved step with a fix, branched 3 steps per arm (1 seed).

(b)'s step is saved once, untimed, before the workers start. Ratios: g/c, i/c, j/c, i/(5·b) (per arm),
j/(k·arms·b) (per branched step); h in seconds and seconds per 1,000 logged steps.

Also measured: engine scoring of the same completions with cache + pool vs uncached sequential
(one search set per completion, as rookworld-trl's manual debug loop does), and the widget path (`loss_for` for a new β/ε).

Writes `reports/bench/bench-<model>-<timestamp>.json` (+ `latest-<model>.json`) atomically, and prints
a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from rookworld_debug import cliargs

from rookworld_debug.lab.bench_measure import (GPT2_124M, _InProcessWorker, _ProcessWorker, _worker_main,  # noqa: F401
                                               engine_bench, engine_sets, machine_info, materialize_model,
                                               profile_variant, run_once, widget_bench)
from rookworld_debug.lab.bench_report import (TARGETS, _finite, check_targets, compute_ratios,  # noqa: F401
                                              markdown, profile_markdown, summarize_variant)
from rookworld_debug.lab.bench_tools import BenchError, save_step
from rookworld_debug.lab.bench_variants import (LABELS, VARIANT_CLASSES, VARIANTS, BenchSpec,  # noqa: F401
                                                trl_config_kwargs)

SCHEMA = "rookworld_debug.bench/1"   # the JSON schema id (data written by any version stays readable)
SAVE_STEP_TIMEOUT_S = 3600           # deadline of the child that saves (b)'s step for (g), (i), (j)


# ------------------------------------------------------------------------------------------ CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rookworld-debug bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny",
                   help=f"'tiny' (default), '{GPT2_124M}' (random GPT2Config()), or a folder")
    p.add_argument("--batch-size", "-B", type=int, default=4)
    p.add_argument("--num-generations", "-G", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per variant (alternating)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per variant first")
    p.add_argument("--variants", default="abcd", help="subset of 'abcdefghijk' (e: + diagnostics, f: TRL + flight "
                   "recorder; g-j: diagnose a saved step, diagnose a 10,000-step log, what-if 5 arms, 3-step branch; "
                   "k: run_step without keeping the weights for the replay)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-depth", type=int, default=10)
    p.add_argument("--engine-workers", type=int, default=2)
    p.add_argument("--heldout-n", type=int, default=16, help="held-out prompts of (b)'s before/after eval")
    p.add_argument("--eval-max-new-tokens", type=int, default=196)
    p.add_argument("--threads", type=cliargs.threads, default=2)
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="rows per backward (same gradient, bounded memory); TRL gets per-device batch m, GA N/m")
    p.add_argument("--device", default="auto", help="'auto' (cuda if available, else cpu), 'cpu', 'cuda'")
    p.add_argument("--isolate", choices=("process", "none"), default="process",
                   help="one worker process per variant (clean peak RSS) or everything in this process")
    p.add_argument("--engine-reps", type=int, default=1, help="repetitions of the engine benchmark (0 = skip)")
    p.add_argument("--no-widget", action="store_true", help="skip the widget benchmark")
    p.add_argument("--profile", default=None, metavar="VARIANT",
                   help="instead of the benchmark: one step of VARIANT (a|b|c|d) under torch.profiler; "
                        "writes profile-<model>-<variant>-<stamp>.json and prints the top operators")
    p.add_argument("--widget-n", type=int, default=64)
    p.add_argument("--widget-t", type=int, default=128)
    p.add_argument("--out", default="reports/bench", help="folder for the JSON")
    p.add_argument("--json-only", action="store_true", help="print the JSON path only (no table)")
    return p


def _progress(label: str, variant: str, res: dict) -> dict:
    msg = res.get("error") or f"{res['seconds']:.2f} s, peak RSS {res['peak_rss_mb']:.0f} MB"
    print(f"[bench] {label} ({variant}): {msg}", file=sys.stderr, flush=True)
    return res


def _spec_from_args(args, model_dir: str, device: str) -> BenchSpec:
    return BenchSpec(model=args.model, model_dir=model_dir, batch_size=args.batch_size,
                     num_generations=args.num_generations, max_new_tokens=args.max_new_tokens, seed=args.seed,
                     engine_depth=args.engine_depth, engine_workers=args.engine_workers,
                     heldout_n=args.heldout_n, eval_max_new_tokens=args.eval_max_new_tokens,
                     threads=args.threads, device=device, micro_batch_size=args.micro_batch_size)


def _device(args) -> str:
    import torch
    return args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")


def _file_stem(started: str, model: str) -> tuple[str, str]:
    """(timestamp, model name) safe in a file name."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(model))[-40:]
    return started.replace(":", "").replace("-", ""), safe


def _with_saved_step(spec: BenchSpec, variants, tmp: str, isolate: str, threads: int) -> tuple[BenchSpec, dict]:
    """(g), (i), (j) read (b)'s step, saved here once, untimed, before any worker starts. With process isolation
    in a child process: a worker inherits its parent's memory high-water mark (ru_maxrss), so the parent stays lean."""
    if not set(variants) & set("gij"):
        return spec, {}
    folder = Path(tmp) / "saved-step"
    t0 = time.perf_counter()
    if isolate == "process":
        spec_path = Path(tmp) / "save-step-spec.json"
        spec_path.write_text(json.dumps(asdict(spec)))
        cmd = [sys.executable, "-m", "rookworld_debug.lab.bench", "_save_step", str(spec_path), str(folder)]
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, timeout=SAVE_STEP_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            raise BenchError(f"saving (b)'s step for (g), (i), (j) took over {SAVE_STEP_TIMEOUT_S} s") from None
        if rc != 0 or not (folder / "trace.json").is_file():
            raise BenchError(f"saving (b)'s step for (g), (i), (j) failed (exit {rc}); its error is above")
    else:
        import torch
        torch.set_num_threads(threads)
        save_step(spec, folder)
    seconds = time.perf_counter() - t0
    print(f"[bench] (b)'s step saved for (g), (i), (j) in {seconds:.1f} s (untimed)", file=sys.stderr, flush=True)
    return replace(spec, saved_step=str(folder)), {"saved_step": {
        "seconds": seconds, "what": "run_step of (b)'s config on fresh weights + StepTrace.save, untimed"}}


def _save_step_main(spec_path: str, folder: str) -> int:
    """The child that saves (b)'s step (`_with_saved_step`); what libraries print goes to stderr."""
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch
    spec = BenchSpec(**json.loads(Path(spec_path).read_text()))
    torch.set_num_threads(spec.threads)
    save_step(spec, folder)
    return 0


def run_bench(args) -> tuple[dict, Path]:
    import torch
    from rookworld_debug.safeio import atomic_write_json
    device = _device(args)
    variants = list(args.variants)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rookworld-bench-") as tmp:
        model_dir, model_info = materialize_model(args.model, Path(tmp) / "model")
        spec = _spec_from_args(args, model_dir, device)
        spec.step_config()  # validate before starting workers
        spec, saved = _with_saved_step(spec, variants, tmp, args.isolate, args.threads)
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(asdict(spec)))
        workers = {}
        try:
            for v in variants:
                workers[v] = (_ProcessWorker(v, str(spec_path)) if args.isolate == "process"
                              else _InProcessWorker(v, spec))
            warm = {v: [] for v in variants}
            for i in range(args.warmup):
                for v in variants:
                    warm[v].append(_progress(f"warm-up {i + 1}", v, workers[v].run()))
            runs = {v: [] for v in variants}
            for i in range(args.reps):
                for v in variants:   # alternating a, b, c, d, a, b, ...
                    runs[v].append(_progress(f"rep {i + 1}", v, workers[v].run()))
        finally:
            for w in workers.values():
                w.close()
    for v in variants:
        for r in runs[v] + warm[v]:
            if "error" in r:
                print(f"[bench] variant {v} failed: {r['error']}\n{r.get('traceback', '')}", file=sys.stderr)
    summary = {v: summarize_variant(runs[v]) for v in variants}
    result = {
        "schema": SCHEMA, "started": started, "command": "rookworld-debug bench " + " ".join(args.argv),
        "machine": machine_info(spec), "model_info": model_info,
        "settings": {**{k: getattr(args, k) for k in ("model", "batch_size", "num_generations", "max_new_tokens",
                                                      "reps", "warmup", "seed", "engine_depth", "engine_workers",
                                                      "heldout_n", "eval_max_new_tokens", "threads", "isolate",
                                                      "micro_batch_size")},
                     "device": device, "variants": variants, "step_config": spec.step_config().to_dict(),
                     "rss_method": "psutil RSS sampled every 5 ms during the timed step, per-variant worker "
                                   "process (isolate=process); maxrss = ru_maxrss of that worker",
                     "timing_method": "wall time of one step after an untimed prepare (fresh weights from the "
                                      "saved folder, fresh engine cache); (c) = on_step_begin→on_step_end"},
        **saved, "variants": summary, "ratios": compute_ratios(summary), "ratios_min": compute_ratios(summary, "min"),
        "descriptions": {v: VARIANTS[v] for v in variants},
        "runs": {v: [{k: x for k, x in r.items() if k not in ("completions", "prompts", "traceback")}
                     for r in runs[v]] for v in variants},
    }
    if args.engine_reps > 0:
        last_a = next((r for r in reversed(runs.get("a", [])) if "completions" in r), None)
        sets = engine_sets(spec, last_a["prompts"] if last_a else [], last_a["completions"] if last_a else [])
        result["engine_sets"] = {name: engine_bench(p, c, args.engine_depth, workers=args.engine_workers,
                                                    reps=args.engine_reps) for name, (p, c) in sets.items()}
        primary = next((n for n, e in result["engine_sets"].items() if math.isfinite(e["speedup"])),
                       next(iter(result["engine_sets"])))
        result["engine"] = {"set": primary, **result["engine_sets"][primary]}
    if not args.no_widget:
        torch.set_num_threads(args.threads)
        result["widget"] = widget_bench(args.widget_n, args.widget_t)
    result["targets"] = check_targets(result)
    result["total_seconds"] = time.perf_counter() - t_all
    result["machine"]["loadavg_1m_runs"] = [r.get("loadavg_1m") for v in variants for r in runs[v]]
    out_dir = Path(args.out)
    stamp, safe = _file_stem(started, args.model)
    path = atomic_write_json(out_dir / f"bench-{safe}-{stamp}.json", _finite(result))
    atomic_write_json(out_dir / f"latest-{safe}.json", _finite(result))
    return result, path


def run_profile(args) -> tuple[dict, Path]:
    """`--profile VARIANT`: the operator breakdown of one step, in this process (after one untimed warm-up
    step unless --warmup 0), same spec as the benchmark."""
    from rookworld_debug.safeio import atomic_write_json
    device = _device(args)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="rookworld-bench-") as tmp:
        model_dir, model_info = materialize_model(args.model, Path(tmp) / "model")
        spec, _ = _with_saved_step(_spec_from_args(args, model_dir, device), args.profile, tmp, "none", args.threads)
        for _ in range(args.warmup):
            run_once(args.profile, spec)
        prof = profile_variant(args.profile, spec)
    result = {"schema": SCHEMA + "#profile", "started": started,
              "command": "rookworld-debug bench " + " ".join(args.argv), "machine": machine_info(spec),
              "model_info": model_info, "settings": {**asdict(spec), "model_dir": None}, **prof}
    stamp, safe = _file_stem(started, args.model)
    path = atomic_write_json(Path(args.out) / f"profile-{safe}-{args.profile}-{stamp}.json", _finite(result))
    return result, path



def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        return _worker_main(argv[1], argv[2])
    if argv[:1] == ["_save_step"]:
        return _save_step_main(argv[1], argv[2])
    if argv[:1] == ["--render"]:   # re-summarise a saved JSON from its runs, rewrite it, print the table
        from rookworld_debug.safeio import atomic_write_json
        path = Path(argv[1])
        result = json.loads(path.read_text())
        _nan = lambda x: math.nan if x is None else x  # noqa: E731
        runs = {v: [{k: _nan(x) for k, x in r.items()} for r in rs] for v, rs in result["runs"].items()}
        result["variants"] = {v: summarize_variant(rs) for v, rs in runs.items()}
        result["ratios"] = compute_ratios(result["variants"])
        result["ratios_min"] = compute_ratios(result["variants"], "min")
        result["targets"] = check_targets(result)
        atomic_write_json(path, _finite(result))
        print(markdown(result))
        return 0
    args = build_parser().parse_args(argv)
    args.argv = argv
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.safeio import check_output_dir
    check_output_dir(args.out, "--out")         # before minutes of benchmarking (cli.run_guarded: exit 2)
    for flag, v, lo in (("--reps", args.reps, 1), ("--warmup", args.warmup, 0), ("--batch-size", args.batch_size, 1),
                        ("--num-generations", args.num_generations, 2), ("--threads", args.threads, 1)):
        if v is not None and v < lo:
            raise ConfigError(flag, f"must be ≥ {lo}, got {v}")
    if args.device != "auto":            # a device this machine lacks: one line, before any work
        from rookworld_debug.models.devices import check_device
        check_device(args.device, "--device")
    if args.profile is not None and args.profile not in VARIANTS:
        raise ConfigError("--profile", f"must be one of {''.join(VARIANTS)}, got {args.profile!r}")
    bad = sorted(set(args.variants) - set(VARIANTS))
    if not args.variants or bad or len(set(args.variants)) != len(args.variants):
        raise ConfigError("--variants", f"must be distinct letters of {''.join(VARIANTS)!r}, got {args.variants!r}")
    if args.profile:
        result, path = run_profile(args)
        print(path if args.json_only else profile_markdown(result) + f"\n\nJSON: {path}")
        return 0
    result, path = run_bench(args)
    if args.json_only:
        print(path)
    else:
        print(markdown(result))
        print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
