"""Capture chosen optimizer steps of a live TRL `GRPOTrainer` as `StepTrace` folders.

    trainer = GRPOTrainer(model=..., reward_funcs=rookworld_reward_funcs("dataset"), args=args, ...)
    cap = capture_steps(trainer, steps=[2, 3], out_dir="captures")   # one call, before train()
    trainer.train()
    StepTrace.load(cap.paths[2])                                      # the step TRL took, token by token

How it attaches (TRL 1.16 has no public hook that exposes per-token tensors):
- a `TrainerCallback` (public surface) for step boundaries, TRL's logged metrics (`on_log`) and the
  per-layer gradient norms (`on_pre_optimizer_step`);
- instance-level wrappers of the trainer's own methods, each calling the original unchanged:
  `_generate_and_score_completions` (batch, advantages, ref/old log-probs), `_calculate_rewards`
  (rewards per function), `compute_loss` + `_get_per_token_logps_and_entropies` (the log-probs and
  entropies of the loss forward, and the returned loss), `_get_grad_norm` (the pre-clip norm).
  The generation batch gets one extra index column (`_rookworld_row`) so rows can be put back in
  generation order after TRL's shuffle; nothing else is added, no random number is drawn.

Capturing never changes training: only detached CPU copies are taken (tested: bit-identical weights
with and without the capture). Steps that are not captured skip every copy: their cost is 0 by
construction; `cost` reports the seconds and bytes spent per step.
"""
from __future__ import annotations

import math
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Iterable, Optional

import torch
from transformers import TrainerCallback

from rookworld_debug.errors import ConfigError, IncompatibleTraceError
from rookworld_debug.trl.record import SUPPORTED_TRL, trl_minor

ROW_KEY = "_rookworld_row"

__all__ = ["StepCapture", "capture_steps", "ROW_KEY", "step_dir"]


def step_dir(out_dir, step: int) -> Path:
    return Path(out_dir) / f"step-{int(step):06d}"


def _cpu(x):
    return x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def _triggers(triggers) -> tuple:
    from rookworld_debug.trl.triggers import default_triggers
    if triggers is None or triggers == ():
        return ()
    if isinstance(triggers, str):
        if triggers != "default":
            raise ConfigError("triggers", f"'default' (the built-in set) or a list of callables, got {triggers!r}")
        return tuple(default_triggers())
    if callable(triggers):
        triggers = [triggers]
    out = tuple(triggers)
    bad = [t for t in out if not callable(t)]
    if bad:
        raise ConfigError("triggers", f"triggers are callables (step, metrics, record) -> Firing | None; got {bad[0]!r}")
    return out


def _step_numbers(steps) -> frozenset:
    """The optimizer steps to capture, refusing what would silently capture another step (1.5 → 1)."""
    if isinstance(steps, (str, bytes, int, float)) or not hasattr(steps, "__iter__"):
        raise ConfigError("steps", f"give a list of optimizer step numbers, e.g. steps=[{steps!r}]; got "
                                   f"{type(steps).__name__} {steps!r}")
    out = set()
    for s in steps:
        if isinstance(s, bool) or not (isinstance(s, int) or (hasattr(s, "__index__") and not isinstance(s, float))):
            raise ConfigError("steps", f"step numbers are whole numbers ≥ 1, got {s!r} ({type(s).__name__})")
        out.add(int(s))
    return frozenset(out)


class StepCapture(TrainerCallback):
    """Attached to one GRPOTrainer; `paths[step]` = saved StepTrace folder, `cost[step]` = what it cost."""

    def __init__(self, trainer, steps: Optional[Iterable[int]] = None, out_dir=None, *, every: Optional[int] = None,
                 keep_last: int = 0, triggers=()):
        import trl
        if trl_minor(trl.__version__) not in SUPPORTED_TRL:
            raise IncompatibleTraceError(f"installed TRL {trl.__version__}: the capture hooks GRPOTrainer internals "
                                         f"of TRL {', '.join(s + '.x' for s in SUPPORTED_TRL)} only")
        args = trainer.args
        self.world = int(trainer.accelerator.num_processes)      # > 1: rank 0 gathers every rank's rows and writes
        self.rank = int(trainer.accelerator.process_index)
        self.steps = _step_numbers(steps) if steps is not None else frozenset()
        if self.steps and min(self.steps) < 1:
            raise ConfigError("steps", f"name optimizer steps ≥ 1 to capture, got {sorted(self.steps)}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ConfigError("every", f"a whole number of steps ≥ 1, got {every!r}")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ConfigError("keep_last", f"a whole number of held steps ≥ 0, got {keep_last!r}")
        if out_dir is None:
            raise ConfigError("out_dir", "name the folder the captured steps are written to")
        self.triggers = _triggers(triggers)
        if not (self.steps or every or keep_last or self.triggers):
            raise ConfigError("steps", "nothing to capture: give steps=[…], every=N, keep_last=K or triggers=")
        self.every, self.keep_last = every, keep_last
        self._holding = bool(keep_last or self.triggers)   # flight recorder: every step is recorded, K held
        self._held: deque = deque(maxlen=max(keep_last, 1))
        self.index: list[dict] = []              # captures.json: one entry per written step, with its reasons
        self.trainer, self.out_dir = trainer, Path(out_dir)
        self.paths: dict[int, Path] = {}
        self.cost: dict[int, dict] = {}          # step -> {"seconds", "bytes", "captured"}
        self.errors: dict[int, str] = {}
        # captured generation batches by their first row id: a step reads one (steps_per_generation ≥ grad. acc.
        # steps, also reused num_iterations times) or several (steps_per_generation < grad. acc. steps)
        self._gens: dict[int, dict] = {}
        self._row_base = 0                       # row ids (ROW_KEY) are unique over the run, not per batch
        self._rewards: Optional[dict] = None
        self._mb: list = []                      # micro-batches of the running captured step
        self._logps = None
        self._in_loss = False
        self._grad_norm = float("nan")
        self._per_layer: dict = {}
        self._lr = float("nan")
        self._fed = 0
        self._weights_hash: Optional[str] = None
        self._pending: Optional[dict] = None
        self._wrap()
        trainer.add_callback(self)

    # ---------------------------------------------------------------------------------- bookkeeping
    def _named(self, step: int) -> bool:
        return step in self.steps or bool(self.every and step % self.every == 0)

    def _recorded(self, step: int) -> bool:
        """Are this step's tensors copied? Named steps, and every step while the flight recorder holds K."""
        return self._holding or self._named(step)

    @property
    def _running(self) -> int:
        """The optimizer step being computed (TRL logs it as state.global_step once it is done)."""
        return self.trainer.state.global_step + 1

    def _spend(self, step: int, t0: float, nbytes: int = 0) -> None:
        c = self.cost.setdefault(step, {"seconds": 0.0, "bytes": 0, "captured": self._recorded(step)})
        c["seconds"] += time.perf_counter() - t0
        c["bytes"] += nbytes

    def _feeds_capture(self) -> bool:
        """Does the generation batch made now feed a captured step (it is reused num_iterations times)?"""
        t = self.trainer
        ga = t.args.gradient_accumulation_steps
        every = t.args.steps_per_generation * t.num_iterations
        first, last = t._step // ga + 1, (t._step + every - 1) // ga + 1
        fed = [s for s in range(first, last + 1) if self._recorded(s)]
        # the copy is charged to the first captured step it feeds (with num_iterations > 1 that batch is
        # generated during an earlier, uncaptured step), so uncaptured steps stay at 0
        self._fed = fed[0] if fed else self._running
        return bool(fed)

    # ---------------------------------------------------------------------------------- wrappers
    def _wrap(self) -> None:
        t = self.trainer
        gen, rew, loss, logps, gnorm = (t._generate_and_score_completions, t._calculate_rewards, t.compute_loss,
                                        t._get_per_token_logps_and_entropies, t._get_grad_norm)

        def generate_and_score(inputs, *a, **kw):
            if not (t.model.training and self._feeds_capture()):
                return gen(inputs, *a, **kw)
            self._rewards = {}
            out = gen(inputs, *a, **kw)
            t0 = time.perf_counter()
            rec = {k: _cpu(v) for k, v in out.items() if isinstance(v, torch.Tensor)}
            rec["prompts"] = [x.get("prompt") for x in inputs]
            rec["columns"] = {k: [x.get(k) for x in inputs] for k in inputs[0] if k != "prompt"} if inputs else {}
            rec.update(self._rewards)
            rec["generation_step"] = self._running
            n, base = out["advantages"].shape[0], self._row_base
            self._rewards, self._gens[base], self._row_base = None, rec, base + n
            out[ROW_KEY] = torch.arange(base, base + n, device=out["advantages"].device)
            self._spend(self._fed, t0, _nbytes(rec))
            return out

        def calculate_rewards(inputs, prompts, completions, completion_ids_list, *a, **kw):
            out = rew(inputs, prompts, completions, completion_ids_list, *a, **kw)
            if self._rewards is not None:
                t0 = time.perf_counter()
                self._rewards.update(
                    rewards_per_func=_cpu(out), completions=list(completions),
                    breakdowns=[getattr(getattr(f, "last_call", None), "breakdowns", None) for f in t.reward_funcs])
                self._spend(self._fed, t0, _nbytes(out))
            return out

        def compute_loss(model, inputs, *a, **kw):
            if not (t.model.training and self._recorded(self._running) and ROW_KEY in inputs):
                return loss(model, inputs, *a, **kw)
            self._in_loss, self._logps = True, None
            try:
                value = loss(model, inputs, *a, **kw)
            finally:
                self._in_loss = False
            t0 = time.perf_counter()
            mb = {"rows": _cpu(inputs[ROW_KEY]), "loss": float(value.detach()),
                  "per_token_logps": self._logps[0], "entropy": self._logps[1],
                  "old_per_token_logps": _cpu(inputs.get("old_per_token_logps")),
                  "num_items_in_batch": _cpu(inputs.get("num_items_in_batch")),
                  "gradient_accumulation_steps": int(t.current_gradient_accumulation_steps)}
            self._mb.append(mb)
            self._spend(self._running, t0, _nbytes(mb))
            return value

        def per_token_logps_and_entropies(*a, **kw):
            out = logps(*a, **kw)
            if self._in_loss and kw.get("compute_entropy"):
                t0 = time.perf_counter()
                self._logps = (_cpu(out[0]), _cpu(out[1]))
                self._spend(self._running, t0)
            return out

        def get_grad_norm(*a, **kw):
            out = gnorm(*a, **kw)
            if self._recorded(self._running):
                self._grad_norm = float(out) if out is not None else float("nan")
            return out

        t._generate_and_score_completions = generate_and_score
        t._calculate_rewards = calculate_rewards
        t.compute_loss = compute_loss
        t._get_per_token_logps_and_entropies = per_token_logps_and_entropies
        t._get_grad_norm = get_grad_norm

    # ---------------------------------------------------------------------------------- callback
    def on_step_begin(self, args, state, control, **kw):
        step = state.global_step + 1
        self.cost.setdefault(step, {"seconds": 0.0, "bytes": 0, "captured": self._recorded(step)})
        if self._recorded(step):
            from rookworld_debug.models.provenance import weights_sha256
            t0 = time.perf_counter()
            self._mb, self._grad_norm, self._per_layer = [], float("nan"), {}
            # hashing every weight costs ~1 % of a step on 124M: named steps only, not every held one
            self._weights_hash = (weights_sha256(self.trainer.accelerator.unwrap_model(self.trainer.model))
                                  if self._named(step) else None)
            self._spend(step, t0)

    def on_pre_optimizer_step(self, args, state, control, **kw):
        step = state.global_step + 1
        if not self._recorded(step):
            return
        from rookworld_debug.grpo.update import layer_name
        t0 = time.perf_counter()
        sq: dict[str, float] = {}
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        named = [(n, p.grad.detach()) for n, p in model.named_parameters() if p.grad is not None]
        # one fused norm kernel over every gradient and one host copy (a float() per tensor was ~2x slower)
        norms = torch.stack(torch._foreach_norm([g.float() for _, g in named])).tolist() if named else []
        for (name, _), v in zip(named, norms):
            sq[layer_name(name)] = sq.get(layer_name(name), 0.0) + v * v
        self._per_layer = {k: v ** 0.5 for k, v in sq.items()}     # AFTER clipping (grads as the optimizer sees them)
        self._lr = float(self.trainer._get_learning_rate())          # the LR this update uses (scheduler steps after)
        self._spend(step, t0)

    def on_step_end(self, args, state, control, **kw):
        step = state.global_step
        if not self._recorded(step):
            return
        t0 = time.perf_counter()
        local = self._local_step(self._mb)
        self._mb = []
        if self.world > 1:                       # every rank takes part; only rank 0 keeps the merged step
            from rookworld_debug.trl.gather import gather_to_rank0
            merged = gather_to_rank0(local, self.rank, self.world, pad_id=self._pad_id())
            if self.rank != 0:
                self._spend(step, t0)
                return                           # the other ranks never write (nor wait on disk)
        else:
            from rookworld_debug.trl.gather import merge_step
            merged = merge_step([local], pad_id=self._pad_id())
        gen, mbs = merged["gen"], merged["micro_batches"]
        self._pending = {"step": step, "step_metrics": {k: list(v) for k, v in self.trainer._metrics["train"].items()},
                         "learning_rate": self._lr, "gen": gen, "micro_batches": mbs}
        self._spend(step, t0)
        if not control.should_log:              # no log at this step: finalize now, without logged metrics
            self._finalize(None)

    def _local_step(self, mbs: list) -> dict:
        """This rank's part of the step: the generation batches its micro-batches read, in generation order,
        and the micro-batches with rows local to their batch (``gen`` = index into ``gens``)."""
        bases = sorted(self._gens)
        used: list[int] = []
        out = []
        for mb in mbs:
            first = int(mb["rows"].min())
            base = max((b for b in bases if b <= first), default=None)
            if base is None:
                continue
            if base not in used:
                used.append(base)
            out.append(dict(mb, rows=mb["rows"] - base, gen=base))
        used.sort()
        for m in out:
            m["gen"] = used.index(m["gen"])
        if used:                                 # older batches are never read again (TRL regenerates forward)
            self._gens = {b: g for b, g in self._gens.items() if b >= used[0]}
        return {"gens": [self._gens[b] for b in used], "micro_batches": out}

    def _pad_id(self) -> int:
        tok = self.trainer.processing_class
        pad = getattr(tok, "pad_token_id", None)
        return int(pad if pad is not None else getattr(tok, "eos_token_id", 0) or 0)

    def on_log(self, args, state, control, logs=None, **kw):
        if self._pending is not None and self._pending["step"] == state.global_step:
            self._finalize(dict(logs or {}))

    def on_train_end(self, args, state, control, **kw):
        if self._pending is not None:
            self._finalize(None)

    def _finalize(self, logs: Optional[dict]) -> None:
        """The step's raw record: written now when named or a trigger fires (with the held lead-up), else held."""
        pending, self._pending = self._pending, None
        step = pending["step"]
        t0 = time.perf_counter()
        raw = dict(gen=pending["gen"], micro_batches=pending["micro_batches"], logs=logs, step=step,
                   grad_norm=self._grad_norm, per_layer_post_clip=self._per_layer, step_metrics=pending["step_metrics"],
                   learning_rate=pending["learning_rate"], weights_sha256=self._weights_hash,
                   num_processes=self.world)
        from rookworld_debug.trl.triggers import Firing, run_triggers
        reasons = run_triggers(self.triggers, step, step_metrics_of(raw), raw) if self.triggers else []
        if self._named(step):
            reasons.insert(0, Firing("named", float(step), math.nan, "named",
                                     "in steps=" if step in self.steps else f"every={self.every}"))
        self._spend(step, t0)
        fired = [r for r in reasons if r.kind != "named"]
        if fired:                                # the lead-up: the K steps before the trigger, unless written
            lead = Firing("lead-up", float(step), math.nan, "lead-up",
                          f"held step before step {step}, where {', '.join(r.trigger for r in fired)} fired")
            for old in self._held:
                if old["step"] not in self.paths and old["step"] not in self.errors:
                    self._write(old, [lead])
        if reasons:
            self._write(raw, reasons)
        if self.keep_last:
            self._held.append(raw)               # the last K steps, written or not (a deque drops the oldest)

    def _write(self, raw: dict, reasons: list) -> None:
        from rookworld_debug.trl.build import build_captured_trace
        step, t0 = raw["step"], time.perf_counter()
        try:
            if raw["gen"] is None or not raw["micro_batches"]:
                raise RuntimeError("the step's generation batch or loss micro-batches were not seen "
                                   "(was the capture attached after train() started?)")
            trace = build_captured_trace(self.trainer, **raw, cost=dict(self.cost.get(step, {})),
                                         reasons=tuple(r.to_dict() for r in reasons))
            self.paths[step] = trace.save(step_dir(self.out_dir, step))
        except Exception as err:                 # never kill the user's training run; say what was lost
            self.errors[step] = f"{type(err).__name__}: {err}"
            warnings.warn(f"rookworld_debug capture of step {step} failed: {self.errors[step]}", stacklevel=2)
        finally:
            self._spend(step, t0)
            if step in self.paths:               # the saved record's cost misses the save itself: add it
                _patch_cost(self.paths[step], self.cost[step])
        self.index.append({"step": step, "path": step_dir(self.out_dir, step).name if step in self.paths else None,
                           "reasons": [r.to_dict() for r in reasons], "error": self.errors.get(step),
                           "written_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        self._write_index()

    def _write_index(self) -> None:
        """captures.json: the folder's index, rewritten atomically after every write (a run in progress)."""
        from rookworld_debug.safeio import atomic_write_json
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.out_dir / "captures.json", {
            "format": 1, "keep_last": self.keep_last, "every": self.every, "steps": sorted(self.steps),
            "triggers": [getattr(t, "name", getattr(t, "__name__", repr(t))) for t in self.triggers],
            "captures": sorted(self.index, key=lambda e: e["step"])})

    def cost_table(self) -> list[dict]:
        """One row per step seen: captured?, seconds and bytes the capture spent (0 for uncaptured steps)."""
        return [{"step": s, **c} for s, c in sorted(self.cost.items())]


def _patch_cost(path: Path, cost: dict) -> None:
    import json

    from rookworld_debug.safeio import atomic_write_json
    p = Path(path) / "trace.json"
    payload = json.loads(p.read_text())
    fields = payload["fields"]["capture"]["fields"]
    fields["capture_seconds"], fields["capture_bytes"] = float(cost["seconds"]), int(cost["bytes"])
    atomic_write_json(p, payload)


def step_metrics_of(raw: dict) -> dict:
    """The flat metrics a trigger sees: TRL's logged dict when the step logged, else the last value of each
    metric TRL accumulated during the step; plus the capture's own loss (Σ micro-batches) and grad norm."""
    m = {k: v[-1] for k, v in (raw.get("step_metrics") or {}).items() if v}
    m.update({k: v for k, v in (raw.get("logs") or {}).items() if isinstance(v, (int, float))})
    m["loss"] = float(sum(mb["loss"] for mb in raw.get("micro_batches") or ())) if raw.get("micro_batches") else m.get("loss")
    m["grad_norm"] = raw.get("grad_norm", m.get("grad_norm"))
    return {k: v for k, v in m.items() if v is not None}


def capture_steps(trainer, steps: Optional[Iterable[int]] = None, out_dir=None, *, every: Optional[int] = None,
                  keep_last: int = 0, triggers=()) -> StepCapture:
    """Attach a capture to `trainer`; call before train(). Writes a StepTrace folder (`step-NNNNNN`) for:

    - `steps`: optimizer steps as TRL logs them (1-based), and every `every`-th step;
    - the flight recorder: with `keep_last=K` and/or `triggers` ("default" = `triggers.default_triggers()`,
      or callables `(step, metrics, record) -> Firing | None`), every step is recorded as a compact CPU
      record (no weights) and the last K are held; a step where a trigger fires is written together with
      the K held steps before it.

    Every written step says why in its provenance (`capture_reasons`) and in `<out_dir>/captures.json`."""
    return StepCapture(trainer, steps, out_dir, every=every, keep_last=keep_last, triggers=triggers)
