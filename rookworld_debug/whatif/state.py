"""The saved state a branch starts from: a `run_step` trace (with the start it was taken from) or a `run_steps`
checkpoint. A TRL capture with the checkpoint before it is opened by `rookworld_debug.trl.whatif`.

`SavedState` holds one loaded session (models, engine, optimizer), a snapshot of the policy weights and the
AdamW state at the step's start, the step's configuration, and what was recorded about the step (its
rollout when a trace was saved; the per-step table row when a checkpoint is the source). `restore(state)`
puts the snapshot back before each arm, so every arm starts from the same weights and moments.
"""
from __future__ import annotations

import copy
import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


from rookworld_debug.config import StepConfig
from rookworld_debug.errors import CheckpointError, DataError, TraceError

# metrics kept from the record before the branch point (thresholds of the symptoms)
HISTORY_COLUMNS = ("kl", "entropy", "rollout_reward", "grad_norm_pre_clip", "heldout_reward_after", "reward_std")


@dataclass(frozen=True)
class SavedState:
    kind: str                           # "run_step trace" | "run_steps checkpoint"
    path: str
    config: StepConfig                  # the configuration of the step that starts the branch
    step: int                           # its index in its run (0 for a single run_step trace)
    session: object = field(repr=False)                 # grpo.phases.setup.Setup at the start state
    weights: dict = field(repr=False, default=None)     # policy state_dict at the start (CPU clones)
    optimizer_state: dict = field(repr=False, default=None)   # AdamW state at the start
    trace: Optional[object] = None      # the recorded StepTrace (trace source); None: regenerate from the seed
    recorded: dict = field(default_factory=dict)        # recorded numbers of the step (see `recorded_numbers`)
    history: dict = field(default_factory=dict)         # metric -> values of the steps before the branch
    before: Optional[str] = None        # the --before checkpoint that replaced the recorded start, if any
    notes: tuple = ()


def snapshot(session) -> tuple[dict, dict]:
    weights = {k: v.detach().clone() for k, v in session.policy.state_dict().items()}
    return weights, copy.deepcopy(session.optimizer.state_dict())


def restore(state: SavedState) -> None:
    """Policy weights, AdamW moments, the models' precision and the reference's device back to the start (in place:
    the optimizer keeps its parameters); an arm that changed precision or placement leaves nothing to the next."""
    from rookworld_debug.grpo.phases.setup import place_reference
    from rookworld_debug.models.precision import set_autocast
    s = state.session
    s.policy.load_state_dict(state.weights)
    s.optimizer.load_state_dict(copy.deepcopy(state.optimizer_state))
    set_autocast(s.config.autocast, s.policy, s.reference)
    if s.reference is not None:
        place_reference(s, s.config.reference_device)


def load_state(path, *, before=None, device: Optional[str] = None) -> SavedState:
    """A run_step trace folder (trace.json) or a run_steps checkpoint folder (state.json). `before`: a run_steps
    checkpoint or HF model folder whose weights (and optimizer.pt, when there) replace the recorded start.
    `device`: where the session runs (None: the saved configuration's own `device`)."""
    path = Path(path)
    if (path / "trace.json").is_file():
        return _from_trace(path, before, device)
    if (path / "state.json").is_file() and (path / "policy.pt").is_file():
        return _from_checkpoint(path, before, device)
    raise TraceError(f"{path}: neither a saved step (trace.json) nor a run_steps checkpoint (state.json + "
                     "policy.pt); a TRL capture folder needs the checkpoint before it (--before)")


def here(config: StepConfig, device: Optional[str]) -> tuple[dict, tuple]:
    """(device settings, notes): `device` when given; else the saved ones when this machine has them, else the
    CPU with a note (a step saved on a GPU opens, branches and resumes on any machine)."""
    from rookworld_debug.models.devices import usable
    if device is not None:
        return {"device": device}, ()
    kw, notes = {}, []
    for name in ("device", "reference_device"):
        saved = getattr(config, name)
        if not usable(saved):
            kw[name] = "cpu" if name == "device" else "same"
            notes.append(f"{name}={saved!r} was saved but this machine lacks it: running on the CPU instead "
                         "(--device to choose)")
    return kw, tuple(notes)


def _start_config(config: StepConfig, before, device: Optional[str]) -> StepConfig:
    kw, _ = here(config, device)
    if before is not None:
        b = Path(before)
        if not ((b / "policy.pt").is_file() or (b / "config.json").is_file()):
            raise CheckpointError(f"--before {b}: neither a run_steps checkpoint (policy.pt) nor a model folder "
                                  "(config.json)")
        kw.update(init_policy=str(b), warmup_steps=0,
                  init_optimizer="checkpoint" if (b / "optimizer.pt").is_file() else None)
    return config.replace(**kw)


def _from_trace(path: Path, before, device: Optional[str]) -> SavedState:
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import StepTrace
    trace = StepTrace.load(path)
    if trace.capture is not None:
        raise TraceError(f"{path} is a TRL capture: branch it with the checkpoint saved before it (--before "
                         "checkpoint-N)")
    if trace.recorded is not None:
        raise TraceError(f"{path} is a step recorded from your own training loop: what-if branches re-run this "
                         "package's step, not your loop's; `rookworld-debug diagnose` replays it phase by phase")
    config = _start_config(trace.config, before, device)
    session = setup(config)
    want = getattr(trace.setup.batch, "batch_hash", None) if trace.setup is not None else None
    if want is not None and session.batch.batch_hash != want:
        raise DataError(f"{path}: the step's prompts (batch hash {want[:12]}) are not the ones this dataset and "
                        f"configuration select now ({session.batch.batch_hash[:12]}): the data changed")
    w, o = snapshot(session)
    rec = recorded_numbers(trace)
    start = (trace.setup.provenance or {}).get("start") or {} if trace.setup is not None else {}
    rec["start_weights_sha256"] = start.get("start_weights_sha256") or \
        ((trace.setup.provenance or {}).get("weights_sha256") if trace.setup is not None else None)
    return SavedState("run_step trace", str(path), config, 0, session, w, o,
                      trace=trace, recorded=rec, before=None if before is None else str(before),
                      notes=here(trace.config, device)[1])


def recorded_numbers(trace) -> dict:
    u = trace.iterations[0].updates[0] if trace.iterations and trace.iterations[0].updates else trace.update
    return {"rollout_reward": float(trace.rewards.rewards.nanmean()), "loss": float(trace.loss.loss),
            "update_loss": u.loss if u else math.nan, "grad_norm_pre_clip": u.grad_norm_pre_clip if u else math.nan,
            "param_delta_norm": u.param_delta_norm if u else math.nan, "lr": u.lr if u else math.nan}


def _read_json(f: Path) -> dict:
    try:
        d = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{f}: not readable JSON ({err})") from None
    except RecursionError:
        raise CheckpointError(f"{f}: nested too deeply to be a checkpoint's JSON") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{f}: expected an object")
    return d


def _from_checkpoint(path: Path, before, device: Optional[str]) -> SavedState:
    from rookworld_debug.grpo.multistep.loop import CHECKPOINT_VERSION, BetaController, step_seed
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.safeio import check_fits, load_state_into, load_torch
    from rookworld_debug.grpo.multistep.checkpoint import built, read_state
    st = read_state(path)
    if st.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {st.get('version')!r}, expected {CHECKPOINT_VERSION}")
    if st.get("mode") != "overfit_single_batch":
        raise CheckpointError(f"{path}: a '{st.get('mode')}' run; branches start from overfit_single_batch runs "
                              "(the batch of a fresh run's next step is not in the checkpoint's session)")
    k = st["next_step"]
    base, beta_schedule, lr_schedule = built(st, path)
    beta = BetaController(beta_schedule)
    beta.load_state_dict(st["beta_state"])
    config = base.replace(beta=beta.beta_for(k), lr=lr_schedule.lr_at(k), seed=step_seed(base.seed, k))
    session = setup(_start_config(base, None, device))
    src = Path(before) if before is not None else path
    pol = load_torch(src / "policy.pt", "checkpoint")
    check_fits(session.policy, pol, "checkpoint", src / "policy.pt")
    if (src / "optimizer.pt").is_file():
        load_state_into(session.optimizer, load_torch(src / "optimizer.pt", "checkpoint"), "checkpoint",
                        src / "optimizer.pt")
    load_state_into(session.policy, pol, "checkpoint", src / "policy.pt")
    w, o = snapshot(session)
    rows = [r for r in st.get("rows", []) if isinstance(r, dict)]
    history = {c: [float(r[c]) for r in rows if isinstance(r.get(c), (int, float))] for c in HISTORY_COLUMNS}
    rec, notes = _later_row(path, k), list(here(base, device)[1])
    if rec is None:
        notes.append(f"no record of step {k} next to the checkpoint (a later checkpoint or table.csv): the "
                     "self-check can compare nothing")
    return SavedState("run_steps checkpoint", str(path), config.replace(device=session.config.device), k, session, w, o,
                      recorded=rec or {}, history=history, before=None if before is None else str(before),
                      notes=tuple(notes))


def _later_row(path: Path, k: int) -> Optional[dict]:
    """Step k's row of the per-step table, from a later checkpoint of the same run or a table.csv beside it."""
    from rookworld_debug.grpo.multistep.checkpoint import read_state
    for other in sorted(path.parent.glob("*/state.json")):
        try:
            rows = read_state(other.parent)["rows"]
        except CheckpointError:
            continue                                  # another folder's damaged checkpoint is not this one's record
        for r in rows:
            if r.get("step") == k:
                return _row_numbers(r)
    for table in (path.parent / "table.csv", path.parent.parent / "table.csv"):
        if table.is_file():
            try:
                with table.open(newline="", encoding="utf-8") as f:
                    for r in csv.DictReader(f):
                        if str(r.get("step")) == str(k):
                            return _row_numbers(r)
            except (OSError, csv.Error, UnicodeDecodeError) as err:
                raise CheckpointError(f"{table}: not a readable table ({type(err).__name__})") from None
    return None


def _row_numbers(r: dict) -> dict:
    def num(key):
        try:
            return float(r.get(key))
        except (TypeError, ValueError, OverflowError):
            return math.nan
    return {"rollout_reward": num("rollout_reward"), "loss": num("loss"), "update_loss": math.nan,
            "grad_norm_pre_clip": num("grad_norm_pre_clip"), "param_delta_norm": num("param_delta_norm"),
            "lr": num("lr"), "advantage_min": num("advantage_min"), "advantage_max": num("advantage_max")}

