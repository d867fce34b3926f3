"""How `rookworld-debug bench` measures: one timed step per call with its peak RSS sampled in a thread, the
worker processes that keep each variant's memory its own, the operator profile, and the extras (engine
cache + pool vs uncached sequential, the widget's loss recompute), plus the model folder every variant loads.
"""
from __future__ import annotations

import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rookworld_debug.lab.bench_variants import VARIANT_CLASSES, BenchSpec, prestart

GPT2_124M = "gpt2-124m"


def rss_mb() -> float:
    import psutil
    return psutil.Process().memory_info().rss / 2**20


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class RssSampler:
    """Peak RSS of this process while the block runs (sampled every `interval` s in a thread)."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.peak, self._stop = interval, 0.0, threading.Event()
        self.by_phase: dict[str, float] = {}      # phase → peak RSS MB sampled while it ran

    def _run(self):
        import psutil

        from rookworld_debug.grpo.phases.shared import PhaseTimer
        proc = psutil.Process()
        while not self._stop.is_set():
            rss, phase = proc.memory_info().rss / 2**20, PhaseTimer.current or "other"
            self.peak = max(self.peak, rss)
            self.by_phase[phase] = max(self.by_phase.get(phase, 0.0), rss)   # where the peak falls
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak = rss_mb()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())



def run_once(variant: str, spec: BenchSpec) -> dict:
    """Prepare (untimed), one timed step with RSS sampling, close. The result is JSON-able."""
    import torch
    torch.set_num_threads(spec.threads)
    v = VARIANT_CLASSES[variant](spec)
    try:
        t_prep = time.perf_counter()
        v.prepare()
        prep = time.perf_counter() - t_prep
        gc.collect()
        before = rss_mb()
        cuda = spec.device.startswith("cuda") and torch.cuda.is_available()
        if cuda:                       # the step's own high-water mark, kernels of the prepare finished
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with RssSampler() as mem:
            t0 = time.perf_counter()
            res = v.step()
            if cuda:
                torch.cuda.synchronize()   # the clock stops when the GPU is done, not when the launches are
            seconds = time.perf_counter() - t0
    finally:
        try:
            v.close()
        except Exception:  # a half-prepared variant; the step's own error is the one to report
            pass
    del v
    gc.collect()
    res.setdefault("seconds", seconds)
    res.update(wall_seconds=seconds, prepare_seconds=prep, rss_before_mb=before, peak_rss_mb=mem.peak,
               peak_rss_delta_mb=mem.peak - before, maxrss_process_mb=maxrss_mb(), peak_rss_by_phase_mb=mem.by_phase,
               loadavg_1m=os.getloadavg()[0])   # the machine's load right after the run (shared machines)
    if cuda:
        res["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20   # torch's allocator, this step only
    return res


def profile_variant(variant: str, spec: BenchSpec, top: int = 25) -> dict:
    """One untimed-prepare + one step of `variant` under torch.profiler (CPU, + CUDA when present):
    the step's phase times and the `top` operators by self time (docs/PERFORMANCE.md § Profile)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(spec.threads)
    v = VARIANT_CLASSES[variant](spec)
    try:
        v.prepare()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if spec.device.startswith("cuda") else [])
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            res = v.step()
        seconds = time.perf_counter() - t0
    finally:
        v.close()
    key = "self_cuda_time_total" if spec.device.startswith("cuda") else "self_cpu_time_total"
    ops = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    total = sum(getattr(e, key) for e in prof.key_averages()) or 1.0
    return {"variant": variant, "seconds_profiled": seconds, "phases": res.get("phases", {}),
            "generation_sub": res.get("generation_sub", {}),
            "top_ops": [{"name": e.key, "calls": e.count, "self_s": getattr(e, key) / 1e6,
                         "share": getattr(e, key) / total} for e in ops]}


# ------------------------------------------------------------------------------------------ workers
def _worker_main(variant: str, spec_path: str) -> int:
    """Line protocol on the ORIGINAL stdout: parent writes 'run' / 'quit'; worker answers one JSON line.
    Everything libraries print goes to stderr (fd 1 is redirected)."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = BenchSpec(**json.loads(Path(spec_path).read_text()))
    import torch  # noqa: F401  (import cost outside every timed region)
    proto.write(json.dumps({"ready": True, "rss_mb": rss_mb()}) + "\n")
    proto.flush()
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        try:
            out = run_once(variant, spec)
        except Exception as exc:  # report, keep serving
            import traceback
            out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        proto.write(json.dumps(out, default=_json_default) + "\n")
        proto.flush()
    return 0


def _json_default(x):
    try:
        return float(x)
    except Exception:
        return str(x)


class _ProcessWorker:
    def __init__(self, variant: str, spec_path: str):
        self.variant = variant
        self.p = subprocess.Popen([sys.executable, "-m", "rookworld_debug.lab.bench", "_worker", variant, spec_path],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._read()   # ready

    def _read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"bench worker {self.variant} died (exit {self.p.wait()}); see stderr above")
        return json.loads(line)

    def run(self) -> dict:
        self.p.stdin.write("run\n")
        self.p.stdin.flush()
        return self._read()

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        self.p.wait(timeout=60)


class _InProcessWorker:
    def __init__(self, variant: str, spec: BenchSpec):
        self.variant, self.spec = variant, spec

    def run(self) -> dict:
        try:
            return json.loads(json.dumps(run_once(self.variant, self.spec), default=_json_default))
        except Exception as exc:
            import traceback
            return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}

    def close(self):
        pass


# ------------------------------------------------------------------------------------------ extras
def engine_bench(prompts, completions, depth: int, multipv: int = 5, workers: int = 2, reps: int = 1) -> dict:
    """Score the same completions with (cache + pool, one batched call) vs (no cache, one process, one
    call per completion — rookworld-trl's manual debug loop's way). Fresh engines per repetition, alternating; medians."""
    from rookworld_debug.chess.engine import Engine
    from rookworld_debug.chess.rewards import score_p_batch
    fast, slow, stats = [], [], {}
    for _ in range(reps):
        with Engine(depth=depth, multipv=multipv, workers=workers, cache=True) as e:
            prestart(e)
            base = e.stats
            t0 = time.perf_counter()
            r_fast = [b.total for b in score_p_batch(prompts, completions, e)]
            fast.append(time.perf_counter() - t0)
            d = e.stats - base
            stats["cached_pool"] = {"searches": d.cache_misses, "requests": d.calls}
        with Engine(depth=depth, multipv=multipv, workers=1, cache=False) as e:
            t0 = time.perf_counter()
            r_slow = [score_p_batch([p], [c], e)[0].total for p, c in zip(prompts, completions)]
            slow.append(time.perf_counter() - t0)
            stats["uncached_sequential"] = {"searches": e.stats.cache_misses, "requests": e.stats.calls}
    same = all((a == b) or (math.isnan(a) and math.isnan(b)) for a, b in zip(r_fast, r_slow))
    f, s = statistics.median(fast), statistics.median(slow)
    return {"n_completions": len(completions), "depth": depth, "workers": workers, "reps": reps,
            "cached_pool_seconds": f, "uncached_sequential_seconds": s,
            "speedup": s / f if f > 0 and stats["uncached_sequential"]["searches"] else math.nan,
            "identical_rewards": same, **stats, "runs": {"cached_pool": fast, "uncached_sequential": slow}}


def engine_sets(spec: BenchSpec, rollout_prompts, rollout_completions) -> dict:
    """Completion sets for the engine benchmark: the (a) rollout's, and N distinct dataset P: samples
    (their own labels: well-formed, so every completion needs searches; no group repeats)."""
    from rookworld_debug.grpo.phases.setup import load_samples
    n = spec.batch_size * spec.num_generations
    train, _ = load_samples("bundled", "P")
    p_samples = [s for s in train if s.task == "P"][:n]
    sets = {"labels_distinct": ([s.prompt for s in p_samples], [s.completion for s in p_samples])}
    if rollout_completions:
        sets = {"rollout": (list(rollout_prompts), list(rollout_completions)), **sets}
    return sets


def widget_bench(n: int = 64, t: int = 128, calls: int = 20, seed: int = 0) -> dict:
    """The widget path: `loss_for` (no forward) for a new β/ε on an N×T rollout's tensors; median ms."""
    import torch

    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.phases.advantages import compute_advantages
    from rookworld_debug.grpo.step import loss_for
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (n,), generator=g)                                   # (N,)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()                                    # (N, T)
    logps = (-torch.rand(n, t, generator=g) * 3).masked_fill(mask == 0, 0)                      # (N, T)
    ref = (logps + 0.05 * torch.randn(n, t, generator=g)).masked_fill(mask == 0, 0)             # (N, T)
    g_size = 8 if n % 8 == 0 else 1
    rollout = _synthetic_rollout(logps, ref, mask, lengths == t, torch.rand(n, t, generator=g) * mask,
                                 torch.rand(n, t, generator=g) * 0.01 * mask, g_size)
    adv = compute_advantages(torch.rand(n, generator=g), g_size)
    base = StepConfig(num_generations=g_size, batch_size=n // g_size)
    grid = [(beta, eps) for beta in (0.0, 0.01, 0.04, 0.1, 0.2) for eps in (0.1, 0.2, 0.28, 0.4)][:calls]
    times = []
    loss_for(rollout, adv, base)  # first call imports/allocates
    for beta, eps in grid:
        cfg = base.replace(beta=beta, epsilon_low=eps, epsilon_high=eps)
        t0 = time.perf_counter()
        loss_for(rollout, adv, cfg)
        times.append((time.perf_counter() - t0) * 1000)
    return {"n": n, "t": t, "calls": len(times), "median_ms": statistics.median(times), "max_ms": max(times)}


# ------------------------------------------------------------------------------------------ model
def materialize_model(model: str, folder: Path) -> tuple[str, dict]:
    """A folder every variant (and TRL's reference reload) can load: the bundled tiny model as is, or a
    seeded random GPT-2 124M (GPT2Config()) / random tiny saved with its tokenizer."""
    import torch

    from rookworld_debug.models.loading import TINY_DIR
    if model == GPT2_124M:
        from transformers import GPT2Config, GPT2LMHeadModel

        from rookworld_debug.models import gpt2_tokenizer
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            m = GPT2LMHeadModel(GPT2Config())
        tok = gpt2_tokenizer()
        m.save_pretrained(folder)
        tok.save_pretrained(folder)
        n_params = sum(p.numel() for p in m.parameters())
        return str(folder), {"source": "random GPT2Config() (124M)", "parameters": n_params}
    if model == "tiny" and (TINY_DIR / "config.json").is_file():
        return str(TINY_DIR), {"source": "bundled rookworld_debug/models/tiny"}
    import warnings

    from rookworld_debug.models import load_policy_and_reference
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_policy_and_reference(model)
    loaded.policy.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return str(folder), {"source": loaded.provenance.source, "random_init": loaded.provenance.is_random_init}



def machine_info(spec: BenchSpec) -> dict:
    import torch
    import transformers
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "torch": torch.__version__,
            "transformers": transformers.__version__, "device": spec.device}
    try:
        import trl
        info["trl"] = trl.__version__
    except ImportError:
        info["trl"] = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["processor"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if spec.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info



def _synthetic_rollout(logps, ref, mask, truncated, entropy, full_kl, g: int):
    """A `Rollout` record around random (N, T) log-probs: what the loss reads, the rest empty (no model, no text)."""
    import torch

    from rookworld_debug.grpo.phases.generation import Rollout
    n, t = logps.shape
    ids = torch.zeros((n, t), dtype=torch.long)
    return Rollout(
        prompt_ids=torch.zeros((n, 1), dtype=torch.long), prompt_mask=torch.ones((n, 1), dtype=torch.long),
        completion_ids=ids, completion_mask=mask, per_token_logps=logps, ref_per_token_logps=ref,
        per_token_entropy=entropy, per_token_full_kl=full_kl, topk_ids=torch.zeros((n, t, 0), dtype=torch.long),
        topk_logps=torch.zeros((n, t, 0)), sampling_per_token_logps=logps, is_truncated=truncated,
        temperatures=torch.ones(n), unique_per_group=torch.zeros(n // g, dtype=torch.long),
        prompts=("",) * n, tasks=("P",) * n, completions=("",) * n, completion_tokens=((),) * n,
        topk_tokens=((),) * n, sampling={"P": (1.0, None, None)}, num_generations=g, max_new_tokens=t, seed=0,
        max_abs_logp_diff=float("nan"), logp_diff_flagged=False, counts={}, seconds=0.0, timings={})
