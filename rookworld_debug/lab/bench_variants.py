"""The variants `rookworld-debug bench` times: one GRPO step done four (six) ways on the same model, prompts,
seed and config, each as prepare() (untimed: load weights, engine, optimizer, trainer) → step() (timed) →
close(); and (g)–(j), the diagnosis and what-if tools on that step (``lab/bench_tools.py``). What each does,
and every setting that makes them do the same work: docs/PERFORMANCE.md.
"""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rookworld_debug.lab.bench_tools import TOOL_CLASSES, TOOL_LABELS, TOOL_VARIANTS

VARIANTS = {
    "a": "ours: core step (generate → rewards → advantages → loss → update)",
    "b": "ours: run_step, fully instrumented (ref, entropy, KL, top-k, per-term grads, before/after eval)",
    "c": "TRL GRPOTrainer: one step, same work as (a)",
    "d": "rookworld-trl's manual_grpo_debug loop (per-prompt generate, per-sample fwd/bwd, uncached sequential "
         "engine)",
    "e": "ours: run_step + signal-or-noise diagnostics (StepConfig.diagnostics: per-group backward passes, "
         "noise scale, G' curve, entropy mechanism, sampler-trainer gap)",
    "f": "TRL GRPOTrainer as (c) with the flight recorder holding K steps (capture_steps keep_last, nothing written)",
    **TOOL_VARIANTS,                    # (g)–(j): the diagnosis and what-if tools on (b)'s step
    "k": "ours: run_step as (b) without keeping the weights for the replay (keep_weights='never'): (b) − (k) is "
         "what keeping them costs",
}
LABELS = {"a": "ours, core step", "b": "ours, run_step (instrumented)", "c": "TRL GRPOTrainer",
          "d": "rookworld-trl's manual debug loop", "e": "ours, run_step + diagnostics",
          "f": "TRL GRPOTrainer + flight recorder (held, not written)",
          "k": "ours, run_step without kept weights", **TOOL_LABELS}
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
    saved_step: str = ""                # (b)'s step saved once by the parent: what (g), (i), (j) read

    def step_config(self):
        from rookworld_debug.config import StepConfig
        return StepConfig(model=self.model_dir, task="P", batch_size=self.batch_size,
                          num_generations=self.num_generations, max_new_tokens=self.max_new_tokens, seed=self.seed,
                          engine_depth=self.engine_depth, engine_workers=self.engine_workers,
                          heldout_n=self.heldout_n, eval_max_new_tokens=self.eval_max_new_tokens,
                          device=self.device, micro_batch_size=self.micro_batch_size, **self.step_overrides)



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
        from rookworld_debug.grpo.multistep.start import setup
        from rookworld_debug.models import load_policy_and_reference
        loaded = load_policy_and_reference(self.spec.model_dir, dtype=self.cfg.dtype, device=self.cfg.device)
        self.s = setup(self.cfg, loaded=loaded)
        if self.s.engine is not None:
            prestart(self.s.engine)

    def step(self) -> dict:
        from rookworld_debug.grpo.families import advantages_from_config
        from rookworld_debug.grpo.phases.generation import generate
        from rookworld_debug.grpo.phases.rewards import compute_rewards
        from rookworld_debug.grpo.step import PhaseTimer, loss_for, rows
        from rookworld_debug.grpo.phases.update import update
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
        from rookworld_debug.grpo.phases.setup import load_samples
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


class ManualLoop(_Variant):
    """(d): one step of jorahn/rookworld-trl's manual_grpo_debug.py, done the way its source does it, fp32."""

    def prepare(self):
        from rookworld_debug.chess.engine import Engine
        from rookworld_debug.data.loaders import select_batch
        from rookworld_debug.grpo.phases.setup import load_samples
        from rookworld_debug.grpo.phases.update import make_optimizer
        from rookworld_debug.models import load_policy_and_reference
        cfg = self.cfg
        self.m = load_policy_and_reference(self.spec.model_dir, dtype=cfg.dtype, device=cfg.device)
        train, _ = load_samples(cfg.dataset, cfg.task)
        self.batch = select_batch(train, task=cfg.task, batch_size=cfg.batch_size, seed=cfg.seed,
                                  indices=cfg.prompt_indices)
        self.engine = Engine(depth=cfg.engine_depth, multipv=cfg.engine_multipv, workers=1, cache=False)
        self.optimizer = make_optimizer(self.m.policy, cfg)

    def _reward(self, prompt: str, completions) -> list[float]:
        """rookworld-trl's reward_fn(completions, prompts=[prompt]*G): every completion scored on its own."""
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
        norm = lambda s: " ".join(s.split())                                   # noqa: E731 rookworld-trl's normalize
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
                adv = ((rewards - mean) / std.clamp(min=0.05)).clamp(-2.0, 2.0)  # (B, G), that loop's constants
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


class OursWithoutWeights(OursInstrumented):
    """(k): (b) with keep_weights='never' (no snapshots of the weights, gradient and optimizer state)."""

    def __init__(self, spec: BenchSpec):
        super().__init__(spec)
        self.cfg = self.cfg.replace(keep_weights="never")


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


VARIANT_CLASSES = {"a": OursCore, "b": OursInstrumented, "c": TrlStep, "d": ManualLoop, "e": OursDiagnostics,
                   "f": TrlRecorded, "k": OursWithoutWeights, **TOOL_CLASSES}
