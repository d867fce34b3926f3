"""What `rookworld-debug bench` reports: each variant's runs summarised (medians and minima), the ratios
between variants, the targets they are checked against, and the Markdown tables it prints.
"""
from __future__ import annotations

import math
import statistics

from rookworld_debug.lab.bench_measure import GPT2_124M
from rookworld_debug.lab.bench_variants import LABELS

TARGETS = {  # name -> (comparison, bound): the performance targets (docs/PERFORMANCE.md)
    "a/c": ("<=", 0.8), "b/c": ("<=", 1.5), "d/a": (">=", 5.0), "engine_speedup": (">=", 5.0),
    "widget_ms": ("<", 100.0), "peak_rss_gb_124m": ("<", 4.0), "peak_rss_124m_ours/trl": ("<=", 1.0),
    "e/c": ("<=", 3.0), "recorder_share": ("<=", 0.03),   # recorder_share: the target is on the 124M model
    "peak_rss_gb_124m_b": ("<", 4.0), "b/a_124m": ("<=", 2.0),
}


def _median(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return statistics.median(xs) if xs else math.nan


def summarize_variant(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    phase_names = list(dict.fromkeys(k for r in ok for k in r.get("phases", {})))
    out = {"runs": len(ok), "errors": [r["error"] for r in runs if "error" in r],
           "median_seconds": _median([r["seconds"] for r in ok]),
           "min_seconds": min([r["seconds"] for r in ok], default=math.nan),
           "seconds": [r["seconds"] for r in ok],
           "median_phases": {k: _median([r["phases"].get(k, math.nan) for r in ok]) for k in phase_names},
           "peak_rss_mb": max([r["peak_rss_mb"] for r in ok], default=math.nan),
           "peak_rss_delta_mb": max([r["peak_rss_delta_mb"] for r in ok], default=math.nan),
           "peak_rss_by_phase_mb": {k: max(r.get("peak_rss_by_phase_mb", {}).get(k, 0.0) for r in ok)
                                    for k in dict.fromkeys(k for r in ok for k in r.get("peak_rss_by_phase_mb", {}))},
           "maxrss_process_mb": max([r["maxrss_process_mb"] for r in ok], default=math.nan),
           "median_tokens_generated": _median([r.get("tokens_generated", math.nan) for r in ok]),
           "median_reward": _median([r.get("reward_mean", math.nan) for r in ok]),
           "median_prepare_seconds": _median([r.get("prepare_seconds", math.nan) for r in ok])}
    if any("peak_gpu_mb" in r for r in ok):           # CUDA: torch.cuda.max_memory_allocated of the timed step
        out["peak_gpu_mb"] = max(r.get("peak_gpu_mb", math.nan) for r in ok)
    for extra in ("seconds_core", "train_call_seconds", "trl_step_time", "capture_seconds", "held_bytes",
                  "write_one_step_seconds", "recorder_share", "log_steps", "arms", "branch_steps",
                  "one_step_seconds", "branch_seconds"):
        vals = [r[extra] for r in ok if extra in r]
        if vals:
            out[f"median_{extra}"] = _median(vals)
            out[f"min_{extra}"] = min(vals)
    eng = [r.get("engine") or {} for r in ok]
    if eng:
        out["engine_last_run"] = eng[-1]
    return out


def compute_ratios(v: dict, stat: str = "median") -> dict:
    """Ratios of the per-variant medians (stat='min': of the fastest runs, the least-disturbed estimate
    on a shared machine)."""
    sec = lambda k: v[k][f"{stat}_seconds"] if k in v else math.nan  # noqa: E731
    r = {"a/c": sec("a") / sec("c"), "b/c": sec("b") / sec("c")}
    d_core = v["d"].get(f"{stat}_seconds_core", math.nan) if "d" in v else math.nan
    r["d/a"] = d_core / sec("a")                    # same work: the manual loop's step without its post-update eval
    r["d_full/a"] = sec("d") / sec("a")
    r["d_full/b"] = sec("d") / sec("b")             # both with evaluation
    if "b" in v:
        no_eval = sum(x for k, x in v["b"]["median_phases"].items() if k not in ("baseline_eval", "evaluation"))
        r["b_without_eval/c"] = no_eval / sec("c")
    r["e/c"] = sec("e") / sec("c")
    r["b/a"] = sec("b") / sec("a")
    r["f/c"] = sec("f") / sec("c")             # wall clock: noise on a shared CPU; recorder_share is the measure
    r["k/c"] = sec("k") / sec("c")             # (b) without kept weights: b/c − k/c is what keeping them costs
    r["recorder_share"] = v["f"].get(f"{stat}_recorder_share", math.nan) if "f" in v else math.nan
    r.update(tool_ratios(v, stat))
    return r


def tool_ratios(v: dict, stat: str = "median") -> dict:
    """(g)–(j) against TRL's step (c) and, per arm / per branched step, against our instrumented step (b);
    (h) in seconds (it has no step to compare with)."""
    sec = lambda k: v[k][f"{stat}_seconds"] if k in v else math.nan  # noqa: E731
    extra = lambda k, x: v[k].get(f"{stat}_{x}", math.nan) if k in v else math.nan  # noqa: E731
    i_arms, j_arms, k = extra("i", "arms"), extra("j", "arms"), extra("j", "branch_steps")
    log_steps = extra("h", "log_steps")
    return {"g/c": sec("g") / sec("c"), "h_seconds": sec("h"),
            "h_seconds_per_1000_steps": sec("h") / log_steps * 1000 if log_steps else math.nan,
            "i/c": sec("i") / sec("c"), "i/(5·b)": sec("i") / (i_arms * sec("b")),
            "j/c": sec("j") / sec("c"), "j/(k·arms·b)": sec("j") / (k * j_arms * sec("b")),
            "j_branch/(k·arms·b)": extra("j", "branch_seconds") / (k * j_arms * sec("b"))}


def check_targets(result: dict) -> dict:
    vals = dict(result["ratios"])
    vals["engine_speedup"] = result.get("engine", {}).get("speedup", math.nan)
    vals["widget_ms"] = result.get("widget", {}).get("median_ms", math.nan)
    if result["settings"]["model"] == GPT2_124M:
        # the target is on OUR step (a, and b when run); TRL's peak is the yardstick, in the same run
        ours = max([v["peak_rss_mb"] for k, v in result["variants"].items() if k in ("a", "b")], default=math.nan)
        vals["peak_rss_gb_124m"] = ours / 1024
        vals["peak_rss_124m_ours/trl"] = ours / result["variants"].get("c", {}).get("peak_rss_mb", math.nan)
        vals["peak_rss_gb_124m_b"] = result["variants"].get("b", {}).get("peak_rss_mb", math.nan) / 1024
        vals["b/a_124m"] = vals.get("b/a", math.nan)
    out = {}
    for name, (op, bound) in TARGETS.items():
        x = vals.get(name, math.nan)
        met = None if not math.isfinite(x) else (x <= bound if op == "<=" else x >= bound if op == ">=" else x < bound)
        out[name] = {"target": f"{op} {bound:g}", "value": x, "met": met}
    return out


def _fmt(x, nd=2):
    return "—" if not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.{nd}f}"


def _load_note(result: dict) -> str:
    loads = [x for x in result.get("machine", {}).get("loadavg_1m_runs") or [] if isinstance(x, (int, float))]
    return f", load average (1 min) after the runs {min(loads):.1f}–{max(loads):.1f}" if loads else ""


def markdown(result: dict) -> str:
    s, v = result["settings"], result["variants"]
    lines = [f"**{s['model']}** ({result['model_info'].get('source', '')}), B={s['batch_size']}, "
             f"G={s['num_generations']}, max_new_tokens={s['max_new_tokens']}, engine depth {s['engine_depth']}, "
             f"{s['reps']} rep(s) after {s['warmup']} warm-up, {result['machine']['cpu_count']} CPU cores, "
             f"torch threads {s['threads']}, isolate={s['isolate']}" + _load_note(result), "",
             "| variant | median s | min s | phases (median s) | tokens | peak RSS MB (Δ step) |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    for k, d in v.items():
        phases = ", ".join(f"{p} {_fmt(x)}" for p, x in d["median_phases"].items())
        extra = f" (core {_fmt(d['median_seconds_core'])})" if "median_seconds_core" in d else ""
        lines.append(f"| ({k}) {LABELS[k]} | "
                     f"{_fmt(d['median_seconds'])}{extra} | {_fmt(d.get('min_seconds'))} | {phases} | "
                     f"{_fmt(d['median_tokens_generated'], 0)} | "
                     f"{_fmt(d['peak_rss_mb'], 0)} ({_fmt(d['peak_rss_delta_mb'], 0)}) |")
    lines += ["", "| ratio / measure | value (medians) | of min times | target | met |",
              "| --- | ---: | ---: | --- | --- |"]
    shown, rmin = set(), result.get("ratios_min", {})
    for name, t in result["targets"].items():
        shown.add(name)
        met = {True: "yes", False: "NO", None: "—"}[t["met"]]
        lines.append(f"| {name} | {_fmt(t['value'])} | {_fmt(rmin.get(name))} | {t['target']} | {met} |")
    for name, x in result["ratios"].items():
        if name not in shown:
            lines.append(f"| {name} | {_fmt(x)} | {_fmt(rmin.get(name))} | | |")
    tools = [k for k in "gij" if k in v]
    if tools:
        lines += ["", "(g), (i), (j) work on (b)'s step, saved once untimed; i/(5·b) is per arm and j/(k·arms·b) per "
                  "branched step (k steps × arms × 1 seed), against (b)'s step; j_branch counts the branches' "
                  "steps only. (h) has no step to compare with: seconds, and per 1,000 logged steps."]
    e = result.get("engine")
    if e:
        lines += ["", f"Engine ({e['set']}, {e['n_completions']} completions, depth {e['depth']}): cached+pool "
                  f"{_fmt(e['cached_pool_seconds'])} s ({e['cached_pool']['searches']} searches) vs uncached "
                  f"sequential {_fmt(e['uncached_sequential_seconds'])} s ({e['uncached_sequential']['searches']} "
                  f"searches) → {_fmt(e['speedup'], 1)}×; identical rewards: {e['identical_rewards']}."]
        for name, other in (result.get("engine_sets") or {}).items():
            if name != e["set"]:
                lines.append(f"Engine ({name}): {_fmt(other['cached_pool_seconds'])} s vs "
                             f"{_fmt(other['uncached_sequential_seconds'])} s → {_fmt(other['speedup'], 1)}×.")
    w = result.get("widget")
    if w:
        lines.append(f"Widget (loss_for, N={w['n']}, T={w['t']}): median {_fmt(w['median_ms'])} ms over "
                     f"{w['calls']} β/ε values (max {_fmt(w['max_ms'])} ms).")
    return "\n".join(lines)



def profile_markdown(result: dict) -> str:
    lines = [f"Profile of ({result['variant']}) {LABELS[result['variant']]}: {_fmt(result['seconds_profiled'])} s "
             "under the profiler", "", "phases: " + ", ".join(f"{k} {_fmt(x)}" for k, x in result["phases"].items()),
             "", "| operator | calls | self s | share |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| `{o['name']}` | {o['calls']} | {_fmt(o['self_s'], 3)} | {100 * o['share']:.1f} % |"
              for o in result["top_ops"]]
    return "\n".join(lines)


def _finite(obj):
    """Strict JSON: NaN/inf → None (the schema says 'null = not measured')."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj

