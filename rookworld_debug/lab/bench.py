"""`rookworld-debug bench`: one GRPO step, four ways, on the same machine, model, prompts, seed and config.

Variants (see docs/PERFORMANCE.md for what each does and every setting that makes them equivalent):

- a  ours, core step: generate → rewards → advantages → loss → update (the phase functions composed,
     no top-k alternatives, no per-term gradients, no evaluation; no policy scoring forward at μ = 1 —
     the old log-probs are the training forward's, as in TRL; the reference forward only if β ≠ 0);
- b  ours, the fully instrumented `run_step` (ref log-probs, entropy, exact KL, top-k, per-term
     gradients, greedy before/after evaluation on the batch and the held-out prompts);
- c  TRL `GRPOTrainer`, one optimizer step configured to do the same work as (a);
- d  a faithful re-implementation of the seeds' `manual_grpo_debug.py` step: per-prompt `generate`
     with `num_return_sequences=G`, per-sample log-prob prints, per-completion UNCACHED sequential
     Stockfish calls, per-sample forward/backward, greedy post-update evaluation.

Method. Each variant lives in its own worker process (`--isolate process`, the default), so its peak
RSS is its own. Every run starts from freshly loaded weights (from one saved folder) and a fresh
engine (empty cache); that preparation is not timed. Each worker does `--warmup` untimed runs, then
the parent asks the workers for runs in alternation a, b, c, d, a, b, … for `--reps` repetitions and
reports medians. RSS is sampled every 5 ms by a thread during the timed step (psutil), and the
kernel's high-water mark (`ru_maxrss`) of the worker is reported too. Stockfish's own processes are
not included (16 MB hash each).

Also measured: engine scoring of the same completions with cache + pool vs uncached sequential
(one search set per completion, as the seeds did), and the widget path (`loss_for` for a new β/ε).

Writes `reports/bench/bench-<model>-<timestamp>.json` (+ `latest-<model>.json`) atomically, and prints
a Markdown table.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = "rookworld_debug.bench/1"   # a data schema id: unchanged by the move to lab/
VARIANTS = {
    "a": "ours: core step (generate → rewards → advantages → loss → update)",
    "b": "ours: run_step, fully instrumented (ref, entropy, KL, top-k, per-term grads, before/after eval)",
    "c": "TRL GRPOTrainer: one step, same work as (a)",
    "d": "seeds' manual_grpo_debug loop (per-prompt generate, per-sample fwd/bwd, uncached sequential engine)",
    "e": "ours: run_step + signal-or-noise diagnostics (StepConfig.diagnostics: per-group backward passes, "
         "noise scale, G' curve, entropy mechanism, sampler-trainer gap)",
    "f": "TRL GRPOTrainer as (c) with the flight recorder holding K steps (capture_steps keep_last, nothing written)",
}
TARGETS = {  # name -> (comparison, bound) as in issues 8 and 18
    "a/c": ("<=", 0.8), "b/c": ("<=", 1.5), "d/a": (">=", 5.0), "engine_speedup": (">=", 5.0),
    "widget_ms": ("<", 100.0), "peak_rss_gb_124m": ("<", 4.0), "peak_rss_124m_ours/trl": ("<=", 1.0),
    "e/c": ("<=", 3.0), "recorder_share": ("<=", 0.03),   # issue 30 (recorder_share: the target is on 124M)
    "peak_rss_gb_124m_b": ("<", 4.0), "b/a_124m": ("<=", 2.0),
}
LABELS = {"a": "ours, core step", "b": "ours, run_step (instrumented)", "c": "TRL GRPOTrainer",
          "d": "seeds' manual_grpo_debug loop", "e": "ours, run_step + diagnostics",
          "f": "TRL GRPOTrainer + flight recorder (held, not written)"}
GPT2_124M = "gpt2-124m"
# two legal positions no RookWorld prompt contains: searching them starts every pool worker untimed
_PRESTART_FENS = ("7k/8/8/8/8/8/8/K7 w - - 0 1", "6k1/8/8/8/8/8/8/K7 w - - 0 1")


def prestart(engine):
    """Start all of an Engine's pool processes now (the pool grows lazily on first use), so process
    start-up is not timed; only two K-vs-K positions enter the cache."""
    engine.analyse_many(list(_PRESTART_FENS[: max(1, engine.workers)]))
    return engine


@dataclass
class BenchSpec:
    """Everything a worker needs; JSON round-trips to the worker processes."""
    model: str = "tiny"
    model_dir: str = ""                 # the saved folder every variant loads (set by the parent)
    batch_size: int = 4
    num_generations: int = 8
    max_new_tokens: int = 128
    seed: int = 0
    engine_depth: int = 10
    engine_workers: int = 2
    heldout_n: int = 16
    eval_max_new_tokens: int = 196
    threads: int = 2
    device: str = "cpu"
    micro_batch_size: int | None = None  # rows per backward (same gradient); TRL: per-device batch + GA
    step_overrides: dict = field(default_factory=dict)   # extra StepConfig fields

    def step_config(self):
        from rookworld_debug.config import StepConfig
        return StepConfig(model=self.model_dir, task="P", batch_size=self.batch_size,
                          num_generations=self.num_generations, max_new_tokens=self.max_new_tokens, seed=self.seed,
                          engine_depth=self.engine_depth, engine_workers=self.engine_workers,
                          heldout_n=self.heldout_n, eval_max_new_tokens=self.eval_max_new_tokens,
                          device=self.device, micro_batch_size=self.micro_batch_size, **self.step_overrides)


# ------------------------------------------------------------------------------------------ measuring
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

        from rookworld_debug.grpo.phases import PhaseTimer
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


def _autocast(spec: BenchSpec):
    """bf16 autocast on CUDA (the GPU path), a no-op context on CPU."""
    import contextlib

    import torch
    if spec.device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _sync(spec: BenchSpec):
    import torch
    if spec.device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------ variants
class _Variant:
    """prepare() (untimed: load weights, engine, optimizer, trainer) → step() (timed) → close()."""

    def __init__(self, spec: BenchSpec):
        self.spec, self.cfg = spec, spec.step_config()

    def close(self):
        pass


class OursCore(_Variant):
    """(a): the phase functions composed, nothing a trainer would not compute."""

    def prepare(self):
        from rookworld_debug.grpo.start import setup
        from rookworld_debug.models import load_policy_and_reference
        loaded = load_policy_and_reference(self.spec.model_dir, dtype=self.cfg.dtype, device=self.cfg.device)
        self.s = setup(self.cfg, loaded=loaded)
        if self.s.engine is not None:
            prestart(self.s.engine)

    def step(self) -> dict:
        from rookworld_debug.grpo.advantages import advantages_from_config
        from rookworld_debug.grpo.generation import generate
        from rookworld_debug.grpo.rewards import compute_rewards
        from rookworld_debug.grpo.step import PhaseTimer, loss_for, rows
        from rookworld_debug.grpo.update import update
        s, cfg, timer = self.s, self.cfg, PhaseTimer()
        b, g = s.batch, cfg.num_generations
        with _autocast(self.spec):
            with timer("generation"):
                rollout = generate(s.policy, s.reference, s.tokenizer, list(b.prompts), list(b.tasks),
                                   num_generations=g, max_new_tokens=cfg.max_new_tokens,
                                   sampling={t: cfg.sampling_for(t) for t in set(b.tasks)}, seed=cfg.seed,
                                   top_k_alternatives=0, compute_ref=cfg.beta != 0,
                                   score_policy=cfg.freezes_old_logps or cfg.kl_estimator == "full")
            with timer("rewards"):
                rewards = compute_rewards(rollout.prompts, rollout.completions, rollout.tasks,
                                          labels=rows(b.completions, g), reward_mode=cfg.reward_mode, engine=s.engine)
            with timer("advantages"):
                adv = advantages_from_config(rewards.rewards, cfg)
            with timer("loss"):
                loss = loss_for(rollout, adv, cfg)
            with timer("update"):
                upd = update(s.policy, s.optimizer, rollout, adv, loss, cfg, per_term_grads=False)
                _sync(self.spec)
        self.rollout = rollout
        return {"phases": dict(timer.seconds), "tokens_generated": int(rollout.completion_mask.sum()),
                "reward_mean": rewards.metrics["reward"], "loss": upd.loss, "grad_norm": upd.grad_norm_pre_clip,
                "engine": dict(rewards.engine_stats), "generation_sub": dict(rollout.timings),
                "completions": list(rollout.completions), "prompts": list(rollout.prompts)}

    def close(self):
        if getattr(self, "s", None) is not None and self.s.engine is not None:
            self.s.engine.close()
        self.s = None


class OursInstrumented(OursCore):
    """(b): `run_step` on a prepared session (the setup phase itself is the untimed prepare)."""

    def step(self) -> dict:
        from rookworld_debug.grpo.step import run_step
        with _autocast(self.spec):
            trace = run_step(self.cfg, session=self.s)
            _sync(self.spec)
        phases = {k: v for k, v in trace.timings.items() if k != "setup"}
        r = trace.rollout
        return {"phases": phases, "tokens_generated": int(r.completion_mask.sum()),
                "reward_mean": trace.rewards.metrics["reward"],
                "loss": trace.update.loss if trace.update else math.nan,
                "grad_norm": trace.update.grad_norm_pre_clip if trace.update else math.nan,
                "engine": {k.removeprefix("engine/"): v for k, v in trace.counts.items() if k.startswith("engine/")},
                "generation_sub": dict(r.timings), "flags": list(trace.flags)[:10]}


def trl_config_kwargs(cfg, spec: BenchSpec, output_dir: str) -> dict:
    """Every GRPOConfig setting that makes one TRL step do the work of our step (docs/PERFORMANCE.md)."""
    temperature, top_p, top_k = cfg.sampling_for("P")
    cuda = spec.device.startswith("cuda")
    n = cfg.batch_size * cfg.num_generations
    ga = cfg.gradient_accumulation_steps        # 1 unless micro_batch_size is set
    return dict(
        output_dir=output_dir,
        # batch: one generation batch of B prompts × G completions = one optimizer step; with micro-batches
        # of m rows: per-device batch m, GA = steps_per_generation = N/m (dapo's normalizer stays global)
        per_device_train_batch_size=n // ga, gradient_accumulation_steps=ga, steps_per_generation=ga,
        num_generations=cfg.num_generations, num_iterations=1, max_steps=1,
        shuffle_dataset=False,
        # sampling (top-k 0 = off; TRL mirrors only the temperature in log-probs, like us)
        max_completion_length=cfg.max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        repetition_penalty=1.0, min_p=None,
        # objective
        beta=cfg.beta, loss_type=cfg.loss_type, epsilon=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
        delta=cfg.delta, importance_sampling_level=cfg.importance_sampling_level, scale_rewards=cfg.scale_rewards,
        mask_truncated_completions=cfg.mask_truncated_completions, use_bias_correction_kl=cfg.use_bias_correction_kl,
        top_entropy_quantile=1.0, entropy_coef=cfg.entropy_coef,
        # optimizer: torch AdamW, constant LR for the single step, same clip
        optim="adamw_torch", learning_rate=cfg.lr, adam_beta1=cfg.adam_betas[0], adam_beta2=cfg.adam_betas[1],
        adam_epsilon=cfg.adam_eps, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        lr_scheduler_type="constant", warmup_steps=0,
        # numerics / model: fp32 weights (bf16 autocast only on CUDA, as ours), no dropout, no checkpointing
        bf16=cuda, fp16=False, use_cpu=not cuda, disable_dropout=True, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32"}, torch_compile=False, use_liger_kernel=False,
        # bookkeeping off
        logging_steps=1, report_to="none", save_strategy="no", eval_strategy="no", log_completions=False,
        dataloader_num_workers=0, remove_unused_columns=False, seed=cfg.seed, disable_tqdm=True,
    )


class TrlStep(_Variant):
    """(c): TRL GRPOTrainer, max_steps=1; the policy AND the reference are loaded from the saved folder."""

    def prepare(self):
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from rookworld_debug.chess.engine import Engine
        from rookworld_debug.chess.rewards import default_p_reward_fn
        from rookworld_debug.data.loaders import select_batch
        from rookworld_debug.grpo.setup import load_samples
        from rookworld_debug.models import load_policy_and_reference

        cfg = self.cfg
        train, _ = load_samples(cfg.dataset, cfg.task)
        batch = select_batch(train, task=cfg.task, batch_size=cfg.batch_size, seed=cfg.seed,
                             indices=cfg.prompt_indices)
        tok = load_policy_and_reference(self.spec.model_dir).tokenizer      # same tokenizer settings as ours
        self.engine = prestart(Engine(depth=cfg.engine_depth, multipv=cfg.engine_multipv,
                                      workers=cfg.engine_workers))
        self.engine_base = self.engine.stats
        reward = default_p_reward_fn(engine=self.engine)                     # our P: reward, TRL signature
        self.reward_seconds = 0.0

        def rookworld(prompts, completions, **kw):
            t0 = time.perf_counter()
            try:
                return reward(prompts, completions)
            finally:
                self.reward_seconds += time.perf_counter() - t0

        times = self.times = {}

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                times["begin"] = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                times["end"] = time.perf_counter()

        self.tmp = tempfile.TemporaryDirectory(prefix="bench-trl-")
        args = GRPOConfig(**trl_config_kwargs(cfg, self.spec, self.tmp.name))
        self.trainer = GRPOTrainer(model=self.spec.model_dir, reward_funcs=[rookworld], args=args,
                                   train_dataset=Dataset.from_dict({"prompt": list(batch.prompts)}),
                                   processing_class=tok, callbacks=[StepTimer()])
        gen = self.trainer._generate_and_score_completions
        self.gen_seconds = 0.0

        def timed_gen(*a, **kw):
            t0 = time.perf_counter()
            try:
                out = gen(*a, **kw)
                self.tokens = int(out["completion_mask"].sum())
                return out
            finally:
                self.gen_seconds += time.perf_counter() - t0
        self.trainer._generate_and_score_completions = timed_gen

    def step(self) -> dict:
        t0 = time.perf_counter()
        out = self.trainer.train()
        _sync(self.spec)
        wall = time.perf_counter() - t0
        step = self.times["end"] - self.times["begin"]
        log = {k: v for d in self.trainer.state.log_history for k, v in d.items()}
        return {"seconds": step, "train_call_seconds": wall,
                "phases": {"generate_and_score": self.gen_seconds - self.reward_seconds,
                           "rewards": self.reward_seconds,
                           "loss_backward_step": step - self.gen_seconds},
                "tokens_generated": getattr(self, "tokens", 0), "reward_mean": log.get("reward", math.nan),
                "loss": log.get("loss", out.training_loss), "grad_norm": log.get("grad_norm", math.nan),
                "trl_step_time": log.get("step_time", math.nan),
                "engine": {k: getattr(self.engine.stats - self.engine_base, k)
                           for k in ("calls", "cache_hits", "cache_misses")}}

    def close(self):
        if getattr(self, "engine", None) is not None:
            self.engine.close()
        self.trainer = None
        if getattr(self, "tmp", None) is not None:
            self.tmp.cleanup()


class SeedsLoop(_Variant):
    """(d): jorahn/rookworld-trl manual_grpo_debug.py, one step (anchor_rookworld.md §3.2–3.4), fp32."""

    def prepare(self):
        from rookworld_debug.chess.engine import Engine
        from rookworld_debug.data.loaders import select_batch
        from rookworld_debug.grpo.setup import load_samples
        from rookworld_debug.grpo.update import make_optimizer
        from rookworld_debug.models import load_policy_and_reference
        cfg = self.cfg
        self.m = load_policy_and_reference(self.spec.model_dir, dtype=cfg.dtype, device=cfg.device)
        train, _ = load_samples(cfg.dataset, cfg.task)
        self.batch = select_batch(train, task=cfg.task, batch_size=cfg.batch_size, seed=cfg.seed,
                                  indices=cfg.prompt_indices)
        self.engine = Engine(depth=cfg.engine_depth, multipv=cfg.engine_multipv, workers=1, cache=False)
        self.optimizer = make_optimizer(self.m.policy, cfg)

    def _reward(self, prompt: str, completions) -> list[float]:
        """The seeds' reward_fn(completions, prompts=[prompt]*G): every completion scored on its own."""
        from rookworld_debug.chess.rewards import score_p_batch
        return [score_p_batch([prompt], [c], self.engine)[0].total for c in completions]

    def step(self) -> dict:
        import torch

        from rookworld_debug.grpo.step import PhaseTimer
        cfg, (policy, ref, tok, _), timer = self.cfg, self.m, PhaseTimer()
        dev = next(policy.parameters()).device
        temperature, top_p, top_k = cfg.sampling_for("P")
        B, G = cfg.batch_size, cfg.num_generations
        prompts, groups, tokens = list(self.batch.prompts), [], 0
        norm = lambda s: " ".join(s.split())                                   # noqa: E731 the seeds' normalize
        with _autocast(self.spec):
            with timer("generation"):
                policy.eval()
                for i, prompt in enumerate(prompts):
                    torch.manual_seed(cfg.seed + 2000 + i)
                    enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(dev)
                    with torch.no_grad():
                        out = policy.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p,
                                              top_k=top_k, max_new_tokens=cfg.max_new_tokens,
                                              num_return_sequences=G, return_dict_in_generate=True,
                                              output_scores=True, pad_token_id=tok.pad_token_id,
                                              eos_token_id=tok.eos_token_id, disable_compile=True)
                    p_len = enc["input_ids"].shape[1]
                    texts = []
                    for seq in out.sequences:                      # validate_and_process_generation
                        comp = seq[p_len:]
                        texts.append(tok.decode(comp, skip_special_tokens=True))
                        tokens += int(comp.numel())
                        with torch.no_grad():                       # Train_LP / Ref_LP prints, per sequence
                            for model in (policy, ref):
                                lp = torch.log_softmax(model(seq[None]).logits[0, p_len - 1:-1].float(), -1)
                                float(lp.gather(-1, comp[:, None]).sum())
                    groups.append(texts)
            with timer("rewards"):
                rewards = torch.tensor([self._reward(p, g) for p, g in zip(prompts, groups)])    # (B, G)
            with timer("advantages"):
                mean, std = rewards.mean(1, keepdim=True), rewards.std(1, keepdim=True)        # (B, 1)
                adv = ((rewards - mean) / std.clamp(min=cfg.manual_std_clamp)).clamp(-2.0, 2.0)  # (B, G)
            with timer("loss_update"):
                policy.train()
                for i, prompt in enumerate(prompts):
                    p_len = len(tok(norm(prompt), add_special_tokens=False)["input_ids"])
                    for j, comp in enumerate(groups[i]):
                        x = tok(norm(prompt) + " " + norm(comp), return_tensors="pt",
                                add_special_tokens=False)["input_ids"].to(dev)             # re-tokenized text
                        t = x.shape[1] - p_len
                        if t <= 0:
                            continue
                        logp = torch.log_softmax(policy(x).logits[0, p_len - 1:-1].float(), -1)    # (T, V)
                        with torch.no_grad():
                            logq = torch.log_softmax(ref(x).logits[0, p_len - 1:-1].float(), -1)   # (T, V)
                        p = logp.exp()
                        seq_lp = logp.gather(-1, x[0, p_len:, None]).mean()
                        kl = (p * (logp - logq)).sum(-1).mean()
                        ent = -(p * logp).sum(-1).mean()
                        loss = (-adv[i, j] * seq_lp + cfg.beta * kl - cfg.entropy_coef * ent) / (B * G)
                        loss.backward()
                grads = [q.grad for q in policy.parameters() if q.grad is not None]
                grad_norm = float(torch.sqrt(sum(g.norm() ** 2 for g in grads)))
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
                policy.eval()
                _sync(self.spec)
            with timer("post_eval"):                          # test_model_performance: greedy, per prompt
                for prompt in prompts:
                    enc = tok(prompt, return_tensors="pt", add_special_tokens=False).to(dev)
                    with torch.no_grad():
                        out = policy.generate(**enc, do_sample=False, max_new_tokens=cfg.max_new_tokens,
                                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                              disable_compile=True)
                    self._reward(prompt, [tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)])
        phases = dict(timer.seconds)
        return {"phases": phases, "seconds_core": sum(v for k, v in phases.items() if k != "post_eval"),
                "tokens_generated": tokens, "reward_mean": float(rewards.mean()), "grad_norm": grad_norm,
                "engine": {k: getattr(self.engine.stats, k) for k in ("calls", "cache_hits", "cache_misses")}}

    def close(self):
        if getattr(self, "engine", None) is not None:
            self.engine.close()
        self.m = self.optimizer = None


class OursDiagnostics(OursInstrumented):
    """(e): (b) with the signal-or-noise diagnostics on (notebook 01 and the report turn them on)."""

    def __init__(self, spec: BenchSpec):
        super().__init__(spec)
        self.cfg = self.cfg.replace(diagnostics=True)


class TrlRecorded(TrlStep):
    """(f): (c) with the flight recorder attached: the step is recorded and held (keep_last=2, no trigger),
    nothing is written while timing. Reports the capture's own seconds (timed inside its hooks), the bytes
    held, and — after the timed step — the seconds to write the held step."""

    def prepare(self):
        super().prepare()
        from rookworld_debug.trl.capture import capture_steps
        self.cap = capture_steps(self.trainer, out_dir=Path(self.tmp.name) / "captures", keep_last=2)

    def step(self) -> dict:
        res = super().step()
        held = [c for c in self.cap.cost.values() if c["captured"]]
        t0 = time.perf_counter()
        self.cap._write(self.cap._held[-1], [])            # what a trigger would write (not in the step time)
        res.update(capture_seconds=sum(c["seconds"] for c in held), held_bytes=sum(c["bytes"] for c in held),
                   write_one_step_seconds=time.perf_counter() - t0)
        res["recorder_share"] = res["capture_seconds"] / res["seconds"]
        return res


VARIANT_CLASSES = {"a": OursCore, "b": OursInstrumented, "c": TrlStep, "d": SeedsLoop, "e": OursDiagnostics,
                   "f": TrlRecorded}


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
        with RssSampler() as mem:
            t0 = time.perf_counter()
            res = v.step()
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
    call per completion — the seeds' way). Fresh engines per repetition, alternating; medians."""
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
    from rookworld_debug.grpo.setup import load_samples
    n = spec.batch_size * spec.num_generations
    train, _ = load_samples("bundled", "P")
    p_samples = [s for s in train if s.task == "P"][:n]
    sets = {"labels_distinct": ([s.prompt for s in p_samples], [s.completion for s in p_samples])}
    if rollout_completions:
        sets = {"rollout": (list(rollout_prompts), list(rollout_completions)), **sets}
    return sets


def widget_bench(n: int = 64, t: int = 128, calls: int = 20, seed: int = 0) -> dict:
    """The widget path: `loss_for` (no forward) for a new β/ε on an N×T rollout's tensors; median ms."""
    import types

    import torch

    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.advantages import compute_advantages
    from rookworld_debug.grpo.step import loss_for
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (n,), generator=g)                                   # (N,)
    mask = (torch.arange(t)[None] < lengths[:, None]).long()                                    # (N, T)
    logps = (-torch.rand(n, t, generator=g) * 3).masked_fill(mask == 0, 0)                      # (N, T)
    ref = (logps + 0.05 * torch.randn(n, t, generator=g)).masked_fill(mask == 0, 0)             # (N, T)
    rollout = types.SimpleNamespace(
        per_token_logps=logps, ref_per_token_logps=ref, completion_mask=mask,
        is_truncated=lengths == t, per_token_entropy=torch.rand(n, t, generator=g) * mask,
        per_token_full_kl=torch.rand(n, t, generator=g) * 0.01 * mask)
    g_size = 8 if n % 8 == 0 else 1
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


# ------------------------------------------------------------------------------------------ report
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
    for extra in ("seconds_core", "train_call_seconds", "trl_step_time", "capture_seconds", "held_bytes",
                  "write_one_step_seconds", "recorder_share"):
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
    r["d/a"] = d_core / sec("a")                    # same work: the seeds' step without its post-update eval
    r["d_full/a"] = sec("d") / sec("a")
    r["d_full/b"] = sec("d") / sec("b")             # both with evaluation
    if "b" in v:
        no_eval = sum(x for k, x in v["b"]["median_phases"].items() if k not in ("baseline_eval", "evaluation"))
        r["b_without_eval/c"] = no_eval / sec("c")
    r["e/c"] = sec("e") / sec("c")
    r["b/a"] = sec("b") / sec("a")
    r["f/c"] = sec("f") / sec("c")             # wall clock: noise on a shared CPU; recorder_share is the measure
    r["recorder_share"] = v["f"].get(f"{stat}_recorder_share", math.nan) if "f" in v else math.nan
    return r


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
    p.add_argument("--variants", default="abcd", help="subset of 'abcdef' (e: + diagnostics, f: TRL + flight recorder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-depth", type=int, default=10)
    p.add_argument("--engine-workers", type=int, default=2)
    p.add_argument("--heldout-n", type=int, default=16, help="held-out prompts of (b)'s before/after eval")
    p.add_argument("--eval-max-new-tokens", type=int, default=196)
    p.add_argument("--threads", type=int, default=2)
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


def run_bench(args) -> tuple[dict, Path]:
    import torch
    from rookworld_debug.safeio import atomic_write_json
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    variants = [v for v in args.variants if v in VARIANTS]
    if not variants or len(variants) != len(args.variants):
        raise SystemExit(f"--variants must be letters of 'abcdef', got {args.variants!r}")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rookworld-bench-") as tmp:
        model_dir, model_info = materialize_model(args.model, Path(tmp) / "model")
        spec = _spec_from_args(args, model_dir, device)
        spec.step_config()  # validate before starting workers
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
        "variants": summary, "ratios": compute_ratios(summary), "ratios_min": compute_ratios(summary, "min"),
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
    stamp = started.replace(":", "").replace("-", "")
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(args.model))[-40:]
    path = atomic_write_json(out_dir / f"bench-{safe}-{stamp}.json", _finite(result))
    atomic_write_json(out_dir / f"latest-{safe}.json", _finite(result))
    return result, path


def run_profile(args) -> tuple[dict, Path]:
    """`--profile VARIANT`: the operator breakdown of one step, in this process (after one untimed warm-up
    step unless --warmup 0), same spec as the benchmark."""
    import torch
    from rookworld_debug.safeio import atomic_write_json
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.profile not in VARIANTS:
        raise SystemExit(f"--profile must be one of {''.join(VARIANTS)}, got {args.profile!r}")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="rookworld-bench-") as tmp:
        model_dir, model_info = materialize_model(args.model, Path(tmp) / "model")
        spec = _spec_from_args(args, model_dir, device)
        for _ in range(args.warmup):
            run_once(args.profile, spec)
        prof = profile_variant(args.profile, spec)
    result = {"schema": SCHEMA + "#profile", "started": started,
              "command": "rookworld-debug bench " + " ".join(args.argv), "machine": machine_info(spec),
              "model_info": model_info, "settings": {**asdict(spec), "model_dir": None}, **prof}
    stamp = started.replace(":", "").replace("-", "")
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(args.model))[-40:]
    path = atomic_write_json(Path(args.out) / f"profile-{safe}-{args.profile}-{stamp}.json", _finite(result))
    return result, path


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_worker"]:
        return _worker_main(argv[1], argv[2])
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
