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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

import torch
from transformers import TrainerCallback

from rookworld_debug.errors import ConfigError, IncompatibleTraceError
from rookworld_debug.trl.capture_weights import WeightsKeeper
from rookworld_debug.trl.record import SUPPORTED_TRL, trl_minor

ROW_KEY = "_rookworld_row"

__all__ = ["StepCapture", "CapturePlan", "capture_steps", "ROW_KEY", "step_dir"]


def _warn(message: str) -> None:
    """A capture problem, said where the user looks: a Python warning and a line in the trainer's log."""
    from transformers.utils import logging as hf_logging
    warnings.warn(message, stacklevel=3)
    hf_logging.get_logger("rookworld_debug.capture").warning(message)


def _guarded(errors: dict, step_of, what: str):
    """Decorator for the recorder's own work inside a wrapped trainer method: an exception there is recorded in
    `errors` (the step's entry) and warned about, never raised into the training loop."""
    def wrap(fn):
        def run(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception as err:  # noqa: BLE001 - the capture must never end the user's training run
                step = step_of()
                errors.setdefault(step, f"{what} failed: {type(err).__name__}: {err}")
                _warn(f"rookworld_debug capture of step {step}: {what} failed ({type(err).__name__}: {err}); "
                      "training goes on")
                return None
        return run
    return wrap


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


@dataclass(frozen=True)
class CapturePlan:
    """Triggering: which optimizer steps are recorded (tensors copied) and which are written."""
    steps: frozenset                     # named steps (1-based, as TRL logs them)
    every: Optional[int]                 # and every N-th step
    keep_last: int                       # flight recorder: the last K recorded steps are held
    triggers: tuple                      # callables (step, metrics, record) -> Firing | None

    @classmethod
    def of(cls, steps, every, keep_last, triggers) -> "CapturePlan":
        """The plan from capture_steps' arguments, refusing anything that would capture another step."""
        steps = _step_numbers(steps) if steps is not None else frozenset()
        if steps and min(steps) < 1:
            raise ConfigError("steps", f"name optimizer steps ≥ 1 to capture, got {sorted(steps)}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ConfigError("every", f"a whole number of steps ≥ 1, got {every!r}")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ConfigError("keep_last", f"a whole number of held steps ≥ 0, got {keep_last!r}")
        return cls(steps, every, keep_last, _triggers(triggers))

    @property
    def holding(self) -> bool:
        """Flight recorder: every step is recorded, K held."""
        return bool(self.keep_last or self.triggers)

    def named(self, step: int) -> bool:
        return step in self.steps or bool(self.every and step % self.every == 0)

    def recorded(self, step: int) -> bool:
        """Are this step's tensors copied? Named steps, and every step while the flight recorder holds K."""
        return self.holding or self.named(step)


class _Costs:
    """What the capture spent per step: {"seconds", "bytes", "captured"} (0 for uncaptured steps)."""

    def __init__(self, plan: CapturePlan):
        self.plan, self.table = plan, {}

    def open(self, step: int) -> dict:
        return self.table.setdefault(step, {"seconds": 0.0, "bytes": 0, "captured": self.plan.recorded(step)})

    def spend(self, step: int, t0: float, nbytes: int = 0) -> None:
        c = self.open(step)
        c["seconds"] += time.perf_counter() - t0
        c["bytes"] += nbytes


class _Recorder:
    """Recording: instance-level wrappers of the trainer's own methods (each calls the original unchanged)
    that keep detached CPU copies of what a recorded step reads — its generation batches, the loss
    micro-batches with their log-probs and entropies, the pre-clip grad norm — and the per-layer norms."""

    def __init__(self, trainer, plan: CapturePlan, costs: _Costs, errors: Optional[dict] = None):
        self.trainer, self.plan, self.costs = trainer, plan, costs
        self.errors = {} if errors is None else errors          # step -> what went wrong (shared with the writer)
        # captured generation batches by their first row id: a step reads one (steps_per_generation ≥ grad. acc.
        # steps, also reused num_iterations times) or several (steps_per_generation < grad. acc. steps)
        self.gens: dict[int, dict] = {}
        self._row_base = 0                       # row ids (ROW_KEY) are unique over the run, not per batch
        self._rewards: Optional[dict] = None
        self.mb: list = []                       # micro-batches of the running captured step
        self._logps = None
        self._in_loss = False
        self.grad_norm = float("nan")
        self.per_layer: dict = {}
        self.lr = float("nan")
        self._fed = 0
        self.weights_hash: Optional[str] = None

    @property
    def running(self) -> int:
        """The optimizer step being computed (TRL logs it as state.global_step once it is done)."""
        return self.trainer.state.global_step + 1

    def _feeds_capture(self) -> bool:
        """Does the generation batch made now feed a captured step (it is reused num_iterations times)?"""
        t = self.trainer
        ga = t.args.gradient_accumulation_steps
        every = t.args.steps_per_generation * t.num_iterations
        first, last = t._step // ga + 1, (t._step + every - 1) // ga + 1
        fed = [s for s in range(first, last + 1) if self.plan.recorded(s)]
        # the copy is charged to the first captured step it feeds (with num_iterations > 1 that batch is
        # generated during an earlier, uncaptured step), so uncaptured steps stay at 0
        self._fed = fed[0] if fed else self.running
        return bool(fed)

    def install(self) -> None:
        t, plan, spend = self.trainer, self.plan, self.costs.spend
        gen, rew, loss, logps, gnorm = (t._generate_and_score_completions, t._calculate_rewards, t.compute_loss,
                                        t._get_per_token_logps_and_entropies, t._get_grad_norm)

        guard = _guarded(self.errors, lambda: self.running, "recording")

        @guard
        def keep_batch(inputs, out):
            t0 = time.perf_counter()
            rec = {k: _cpu(v) for k, v in out.items() if isinstance(v, torch.Tensor)}
            rec["prompts"] = [x.get("prompt") for x in inputs]
            rec["columns"] = {k: [x.get(k) for x in inputs] for k in inputs[0] if k != "prompt"} if inputs else {}
            rec.update(self._rewards)
            rec["generation_step"] = self.running
            n, base = out["advantages"].shape[0], self._row_base
            self._rewards, self.gens[base], self._row_base = None, rec, base + n
            out[ROW_KEY] = torch.arange(base, base + n, device=out["advantages"].device)
            spend(self._fed, t0, _nbytes(rec))

        def generate_and_score(inputs, *a, **kw):
            if not (t.model.training and self._feeds_capture()):
                return gen(inputs, *a, **kw)
            self._rewards = {}
            out = gen(inputs, *a, **kw)
            keep_batch(inputs, out)
            self._rewards = None
            return out

        @guard
        def keep_rewards(out, completions):
            t0 = time.perf_counter()
            self._rewards.update(
                rewards_per_func=_cpu(out), completions=list(completions),
                breakdowns=[getattr(getattr(f, "last_call", None), "breakdowns", None) for f in t.reward_funcs])
            spend(self._fed, t0, _nbytes(out))

        def calculate_rewards(inputs, prompts, completions, completion_ids_list, *a, **kw):
            out = rew(inputs, prompts, completions, completion_ids_list, *a, **kw)
            if self._rewards is not None:
                keep_rewards(out, completions)
            return out

        def compute_loss(model, inputs, *a, **kw):
            if not (t.model.training and plan.recorded(self.running) and ROW_KEY in inputs):
                return loss(model, inputs, *a, **kw)
            self._in_loss, self._logps = True, None
            try:
                value = loss(model, inputs, *a, **kw)
            finally:
                self._in_loss = False
            keep_micro_batch(inputs, value)
            return value

        @guard
        def keep_micro_batch(inputs, value):
            t0 = time.perf_counter()
            mb = {"rows": _cpu(inputs[ROW_KEY]), "loss": float(value.detach()),
                  "per_token_logps": self._logps[0], "entropy": self._logps[1],
                  "old_per_token_logps": _cpu(inputs.get("old_per_token_logps")),
                  "num_items_in_batch": _cpu(inputs.get("num_items_in_batch")),
                  "gradient_accumulation_steps": int(t.current_gradient_accumulation_steps)}
            self.mb.append(mb)
            spend(self.running, t0, _nbytes(mb))

        def per_token_logps_and_entropies(*a, **kw):
            out = logps(*a, **kw)
            if self._in_loss and kw.get("compute_entropy"):
                t0 = time.perf_counter()
                self._logps = (_cpu(out[0]), _cpu(out[1]))
                spend(self.running, t0)
            return out

        def get_grad_norm(*a, **kw):
            out = gnorm(*a, **kw)
            if plan.recorded(self.running):
                self.grad_norm = float(out) if out is not None else float("nan")
            return out

        t._generate_and_score_completions = generate_and_score
        t._calculate_rewards = calculate_rewards
        t.compute_loss = compute_loss
        t._get_per_token_logps_and_entropies = per_token_logps_and_entropies
        t._get_grad_norm = get_grad_norm

    def begin_step(self, step: int) -> None:
        from rookworld_debug.models.provenance import weights_sha256
        self.mb, self.grad_norm, self.per_layer = [], float("nan"), {}
        # every recorded step, held ones too: a held step written as a trigger's lead-up needs its provenance, and
        # the weights it started from are gone by then (~1 % of a step on 124M)
        self.weights_hash = weights_sha256(self.trainer.accelerator.unwrap_model(self.trainer.model))

    def record_layer_norms(self) -> None:
        """Per-layer gradient norms AFTER clipping (as the optimizer sees them), and the LR this update uses."""
        from rookworld_debug.grpo.phases.update import layer_name
        sq: dict[str, float] = {}
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        named = [(n, p.grad.detach()) for n, p in model.named_parameters() if p.grad is not None]
        # one fused norm kernel over every gradient and one host copy (a float() per tensor was ~2x slower)
        norms = torch.stack(torch._foreach_norm([g.float() for _, g in named])).tolist() if named else []
        for (name, _), v in zip(named, norms):
            sq[layer_name(name)] = sq.get(layer_name(name), 0.0) + v * v
        self.per_layer = {k: v ** 0.5 for k, v in sq.items()}
        self.lr = float(self.trainer._get_learning_rate())          # (the scheduler steps after)

    def local_step(self) -> dict:
        """This rank's part of the step: the generation batches its micro-batches read, in generation order,
        and the micro-batches with rows local to their batch (``gen`` = index into ``gens``)."""
        mbs, self.mb = self.mb, []
        bases = sorted(self.gens)
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
            self.gens = {b: g for b, g in self.gens.items() if b >= used[0]}
        return {"gens": [self.gens[b] for b in used], "micro_batches": out}

    def pad_id(self) -> int:
        tok = self.trainer.processing_class
        pad = getattr(tok, "pad_token_id", None)
        return int(pad if pad is not None else getattr(tok, "eos_token_id", 0) or 0)


class _Writer:
    """Writing: a finished step's raw record is written when named or when a trigger fires (with the held
    lead-up), else held (the flight recorder's last K); trace folders and the captures.json index."""

    def __init__(self, trainer, plan: CapturePlan, out_dir: Path, costs: _Costs, errors: Optional[dict] = None):
        self.trainer, self.plan, self.out_dir, self.costs = trainer, plan, out_dir, costs
        self.held: deque = deque(maxlen=max(plan.keep_last, 1))
        self.index: list[dict] = []              # captures.json: one entry per written step, with its reasons
        self.paths: dict[int, Path] = {}
        self.errors: dict[int, str] = {} if errors is None else errors

    def finalize(self, raw: dict) -> None:
        step, t0 = raw["step"], time.perf_counter()
        plan = self.plan
        from rookworld_debug.trl.triggers import Firing, run_triggers
        reasons = run_triggers(plan.triggers, step, step_metrics_of(raw), raw) if plan.triggers else []
        if plan.named(step):
            reasons.insert(0, Firing("named", float(step), math.nan, "named",
                                     "in steps=" if step in plan.steps else f"every={plan.every}"))
        self.costs.spend(step, t0)
        fired = [r for r in reasons if r.kind != "named"]
        if fired:                                # the lead-up: the K steps before the trigger, unless written
            lead = Firing("lead-up", float(step), math.nan, "lead-up",
                          f"held step before step {step}, where {', '.join(r.trigger for r in fired)} fired")
            for old in self.held:
                if old["step"] not in self.paths and old["step"] not in self.errors:
                    self.write(old, [lead])
        if reasons:
            self.write(raw, reasons)
        if plan.keep_last:                       # the last K steps, written or not (a deque drops the oldest)
            self.held.append({k: v for k, v in raw.items() if k != "kept"})

    def write(self, raw: dict, reasons: list) -> None:
        from rookworld_debug.trl.build import build_captured_trace
        step, t0, top = raw["step"], time.perf_counter(), None
        cost = self.costs.table
        try:
            if raw["gen"] is None or not raw["micro_batches"]:
                raise RuntimeError(self.errors.get(step) or "the step's generation batch or loss micro-batches were "
                                   "not seen (was the capture attached after train() started?)")
            trace = build_captured_trace(self.trainer, **{k: v for k, v in raw.items() if k != "kept"},
                                         cost=dict(cost.get(step, {})), reasons=tuple(r.to_dict() for r in reasons))
            if raw.get("kept") is not None:      # the step's weights, written to state/ beside it
                trace = replace(trace, kept=raw["kept"])
            self.paths[step] = trace.save(step_dir(self.out_dir, step))
            top = _top_finding(trace)
        except Exception as err:                 # never kill the user's training run; say what was lost
            self.errors[step] = f"{type(err).__name__}: {err}"
            _warn(f"rookworld_debug capture of step {step} failed: {self.errors[step]}; training goes on")
        finally:
            self.costs.spend(step, t0)
        if step in self.paths:                   # the saved record's cost misses the save itself: add it
            try:
                _patch_cost(self.paths[step], cost[step])
            except Exception as err:  # noqa: BLE001 - the trace is saved; only its cost figure is stale
                _warn(f"rookworld_debug capture of step {step}: its cost was not added ({type(err).__name__}: {err})")
        self.index.append({"step": step, "path": step_dir(self.out_dir, step).name if step in self.paths else None,
                           "reasons": [r.to_dict() for r in reasons], "error": self.errors.get(step),
                           "top_finding": top,
                           "written_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        try:
            self.write_index()
        except Exception as err:  # noqa: BLE001 - a full disk or a bad folder: the run goes on, the error is kept
            self.errors.setdefault(step, f"captures.json not written: {type(err).__name__}: {err}")
            _warn(f"rookworld_debug capture: {self.out_dir / 'captures.json'} not written ({type(err).__name__}: "
                  f"{err}); training goes on")

    def write_index(self) -> None:
        """captures.json: the folder's index, rewritten atomically after every write (a run in progress)."""
        from rookworld_debug.safeio import atomic_write_json
        plan = self.plan
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.out_dir / "captures.json", {
            "format": 1, "keep_last": plan.keep_last, "every": plan.every, "steps": sorted(plan.steps),
            "triggers": [getattr(t, "name", getattr(t, "__name__", repr(t))) for t in plan.triggers],
            "captures": sorted(self.index, key=lambda e: e["step"])})


class StepCapture(TrainerCallback):
    """Attached to one GRPOTrainer; `paths[step]` = saved StepTrace folder, `cost[step]` = what it cost.
    The TrainerCallback: step boundaries drive the recorder (`_Recorder`) and the writer (`_Writer`)
    according to the plan (`CapturePlan`)."""

    def __init__(self, trainer, steps: Optional[Iterable[int]] = None, out_dir=None, *, every: Optional[int] = None,
                 keep_last: int = 0, triggers=(), keep_weights: bool = False):
        import trl
        if trl_minor(trl.__version__) not in SUPPORTED_TRL:
            raise IncompatibleTraceError(f"installed TRL {trl.__version__}: the capture hooks GRPOTrainer internals "
                                         f"of TRL {', '.join(s + '.x' for s in SUPPORTED_TRL)} only")
        self.world = int(trainer.accelerator.num_processes)      # > 1: rank 0 gathers every rank's rows and writes
        self.rank = int(trainer.accelerator.process_index)
        self.plan = plan = CapturePlan.of(steps, every, keep_last, triggers)
        if out_dir is None:
            raise ConfigError("out_dir", "name the folder the captured steps are written to")
        if not (plan.steps or every or keep_last or plan.triggers):
            raise ConfigError("steps", "nothing to capture: give steps=[…], every=N, keep_last=K or triggers=")
        self.steps, self.every, self.keep_last, self.triggers = plan.steps, every, keep_last, plan.triggers
        self.trainer, self.out_dir = trainer, Path(out_dir)
        self._costs = _Costs(plan)
        self.cost: dict[int, dict] = self._costs.table   # step -> {"seconds", "bytes", "captured"}
        errors: dict[int, str] = {}
        self.recorder = _Recorder(trainer, plan, self._costs, errors)
        self.writer = _Writer(trainer, plan, self.out_dir, self._costs, errors)
        self.unreached: tuple = ()               # named steps the run ended before (set at the end of training)
        _check_out_dir(self.out_dir)
        self.paths, self.errors, self.index = self.writer.paths, self.writer.errors, self.writer.index
        self._pending: Optional[dict] = None
        if not isinstance(keep_weights, bool):
            raise ConfigError("keep_weights", f"True or False, got {keep_weights!r}")
        self.keeper = WeightsKeeper(trainer, self.rank) if keep_weights else None
        self.recorder.install()
        trainer.add_callback(self)

    def on_step_begin(self, args, state, control, **kw):
        step = state.global_step + 1
        self._costs.open(step)
        if self.plan.recorded(step):
            t0 = time.perf_counter()
            _guarded(self.errors, lambda: step, "starting the step's record")(self.recorder.begin_step)(step)
            if self.keeper is not None and self.plan.named(step):
                _guarded(self.errors, lambda: step, "keeping the step's weights")(self.keeper.begin)(step)
            self._costs.spend(step, t0)

    def on_pre_optimizer_step(self, args, state, control, **kw):
        step = state.global_step + 1
        if self.plan.recorded(step):
            t0 = time.perf_counter()
            _guarded(self.errors, lambda: step, "the per-layer gradient norms")(self.recorder.record_layer_norms)()
            self._costs.spend(step, t0)

    def on_step_end(self, args, state, control, **kw):
        step = state.global_step
        if not self.plan.recorded(step):
            return
        t0 = time.perf_counter()
        local = self.recorder.local_step()
        if self.world > 1:                       # every rank takes part; only rank 0 keeps the merged step
            from rookworld_debug.trl.gather import gather_to_rank0
            merged = gather_to_rank0(local, self.rank, self.world, pad_id=self.recorder.pad_id())
            if self.rank != 0:
                self._costs.spend(step, t0)
                return                           # the other ranks never write (nor wait on disk)
        else:
            from rookworld_debug.trl.gather import merge_step
            merged = _guarded(self.errors, lambda: step, "merging the step's record")(merge_step)(
                [local], pad_id=self.recorder.pad_id())
            if merged is None:
                self._costs.spend(step, t0)
                return
        kept, hook_s, nbytes = self.keeper.end(step, self.recorder.grad_norm) if self.keeper is not None \
            else (None, 0.0, 0)
        c = self._costs.open(step)               # the snapshots inside optimizer.step were timed there
        c["seconds"], c["bytes"] = c["seconds"] + hook_s, c["bytes"] + nbytes
        self._pending = {"step": step, "step_metrics": {k: list(v) for k, v in self.trainer._metrics["train"].items()},
                         "learning_rate": self.recorder.lr, "gen": merged["gen"],
                         "micro_batches": merged["micro_batches"], "kept": kept}
        self._costs.spend(step, t0)
        if not control.should_log:              # no log at this step: finalize now, without logged metrics
            self._finalize(None)

    def on_log(self, args, state, control, logs=None, **kw):
        if self._pending is not None and self._pending["step"] == state.global_step:
            self._finalize(dict(logs or {}))

    def on_train_end(self, args, state, control, **kw):
        if self._pending is not None:
            self._finalize(None)
        if self.keeper is not None:
            self.keeper.drop()
        last = state.global_step
        self.unreached = tuple(sorted(s for s in self.plan.steps if s > last))
        if self.unreached and self.rank == 0:
            _warn(f"rookworld_debug capture: named step(s) {list(self.unreached)} were never reached (the run ended "
                  f"at step {last}): nothing was captured for them")
        if self.errors and self.rank == 0:
            _warn(f"rookworld_debug capture: {len(self.errors)} step(s) not captured: "
                  + "; ".join(f"step {k}: {v}" for k, v in sorted(self.errors.items())[:5]))

    def _finalize(self, logs: Optional[dict]) -> None:
        """The step's raw record (TRL's logged metrics when it logged), handed to the writer."""
        pending, self._pending = self._pending, None
        r = self.recorder
        self.writer.finalize(dict(
            gen=pending["gen"], micro_batches=pending["micro_batches"], logs=logs, step=pending["step"],
            grad_norm=r.grad_norm, per_layer_post_clip=r.per_layer, step_metrics=pending["step_metrics"],
            learning_rate=pending["learning_rate"], weights_sha256=r.weights_hash, num_processes=self.world,
            kept=pending.get("kept")))

    def cost_table(self) -> list[dict]:
        """One row per step seen: captured?, seconds and bytes the capture spent (0 for uncaptured steps)."""
        return [{"step": s, **c} for s, c in sorted(self.cost.items())]

    # the recorder-cost measurement (lab/) writes one held step as a trigger would
    @property
    def _held(self) -> deque:
        return self.writer.held

    def _write(self, raw: dict, reasons: list) -> None:
        self.writer.write(raw, reasons)


def _check_out_dir(out_dir: Path) -> None:
    """Warn now (training still goes on) when the capture folder cannot be written: every capture will fail."""
    from rookworld_debug.safeio import check_output_dir
    try:
        check_output_dir(out_dir, "out_dir")
    except ConfigError as err:
        _warn(f"rookworld_debug capture: {err}; the steps it should write will fail (recorded in cap.errors), "
              "training goes on")


def _top_finding(trace):
    """The step checks' top finding of a written step (captures.json says why it matters, not only what fired)."""
    from rookworld_debug.diagnosis import diagnose_trace
    found = [f for f in diagnose_trace(trace) if not (f.code == "phase_note" and f.severity == "info")]
    return found[0].to_dict() if found else None


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
                  keep_last: int = 0, triggers=(), keep_weights: bool = False) -> StepCapture:
    """Attach a capture to `trainer`; call before train(). Writes a StepTrace folder (`step-NNNNNN`) for:

    - `steps`: optimizer steps as TRL logs them (1-based), and every `every`-th step;
    - the flight recorder: with `keep_last=K` and/or `triggers` ("default" = `triggers.default_triggers()`,
      or callables `(step, metrics, record) -> Firing | None`), every step is recorded as a compact CPU
      record (no weights) and the last K are held; a step where a trigger fires is written together with
      the K held steps before it.

    - `keep_weights=True`: the steps named by `steps`/`every` also keep, in `state/` beside their trace, the model
      before the step, the gradient before clipping, the optimizer's state, the model after and the reference, so
      `rookworld-debug diagnose` replays their log-probs, gradient and update (rank 0 writes them; the cost per
      step is in docs/PERFORMANCE.md). Held and trigger-written steps keep none.

    Every written step says why in its provenance (`capture_reasons`) and in `<out_dir>/captures.json`."""
    return StepCapture(trainer, steps, out_dir, every=every, keep_last=keep_last, triggers=triggers,
                       keep_weights=keep_weights)
