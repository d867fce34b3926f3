"""The table of checks (one place, like the loss types' table) and the entry points.

    diagnose_trace(trace)          a StepTrace (run_step or a TRL capture) → findings, most likely first
    diagnose_step(trace, folder)   the same checks and the step's replay → (findings, Replay): every view's call
    diagnose_run(run_dir_or_log)   a run folder / trainer_state.json / log_history list → run-level findings
    diagnose_path(path)            a trace folder, a captures folder, a folder of recorded steps (each step and
                                   each pair of consecutive steps replayed) or a run folder → both
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Optional

from rookworld_debug.diagnosis import checks_invariants as IN
from rookworld_debug.diagnosis import checks_logprob as LP
from rookworld_debug.diagnosis import checks_run as RUN
from rookworld_debug.diagnosis import checks_run_invariants as RIN
from rookworld_debug.diagnosis import checks_sampler as SA
from rookworld_debug.diagnosis import checks_signal as SI
from rookworld_debug.diagnosis import checks_trl_generation as TG
from rookworld_debug.diagnosis import checks_update as UP
from rookworld_debug.diagnosis.context import at_step
from rookworld_debug.diagnosis.findings import Finding, Fix, rank, rank_run
from rookworld_debug.diagnosis.flags import check_phase_flags
from rookworld_debug.errors import DataError, RookWorldError

if TYPE_CHECKING:
    from rookworld_debug.diagnosis.replay.records import Replay


def _optional_checks(module: str) -> tuple:
    """STEP_CHECKS of a sibling module that may be absent (the rookworld-rlvr "mini" loss family's pitfall checks).
    The name is a constant of this file, never read from data; importlib keeps an absent module from reading as
    an import of this package (an import circle) to static analysis. An error inside a present module surfaces."""
    import importlib
    import importlib.util
    if importlib.util.find_spec(module) is None:
        return ()
    return tuple(getattr(importlib.import_module(module), "STEP_CHECKS", ()))


# every check over one StepTrace: check(trace) -> list[Finding]
STEP_CHECKS = (
    IN.check_optimizer_applied, IN.check_reference_frozen, IN.check_loss_path, IN.check_moved_with_advantages,
    IN.check_objective_signs, IN.check_cispo_cap, IN.check_sampler_record,
    LP.check_dropout, LP.check_reference,
    SA.check_mask_after_eos, SA.check_sampler_trainer,
    SI.check_truncation, SI.check_no_signal, SI.check_reward_determinism, SI.check_unscorable,
    SI.check_label_vs_engine,
    UP.check_advantage_noise, UP.check_kl_dominates, UP.check_update_size, UP.check_grad_clip, UP.check_noise,
    UP.check_entropy, UP.check_capture_drift, UP.check_length_bias,
    TG.check_trl_generation,
    check_phase_flags,
) + _optional_checks("rookworld_debug.diagnosis.rlvr_mini")

# every check over a run's log: check(rows) -> list[Finding], rows = [{"step": int, metric: float, ...}]
RUN_CHECKS = (
    RUN.check_truncated_run, RUN.check_update_jump, RUN.check_no_net_trend, RUN.check_kl_runaway,
    RUN.check_entropy_collapse, RUN.check_grad_spikes, RUN.check_reward_vs_format, RUN.check_little_signal,
    RUN.check_kl_dominates_run,
    RIN.check_optimizer_run, RIN.check_kl_zero_run, RIN.check_reward_task_diverge, RIN.check_objective_run,
)


def _guarded(check, arg) -> list[Finding]:
    """A check that fails is itself a finding (a diagnosis never hides a crash nor stops the others)."""
    try:
        return list(check(arg) or ())
    except Exception as err:  # noqa: BLE001 - one broken check must not cost the other findings
        name = getattr(check, "__name__", repr(check))
        return [Finding(code="check_failed", severity="warning", cause=f"check {name} failed: "
                        f"{type(err).__name__}: {err}", evidence=(), fix=Fix("Report this with the trace."),
                        score=0.1)]


def diagnose_trace(trace, step: Optional[int] = None) -> list[Finding]:
    """Every step check on `trace`, ranked most likely first. `step`: the 0-based step of a multi-step run
    (step 0 / None: the policy has not been updated before this step unless the config says so)."""
    with at_step(step):
        found = [f for check in STEP_CHECKS for f in _guarded(check, trace)]
    return rank(found)


def diagnose_rows(rows) -> list[Finding]:
    """Every run check on rows given by a caller (read through the log's closed schema first)."""
    from rookworld_debug.diagnosis.runlog import clean_rows
    return _run_checks(clean_rows(rows))


def _run_checks(rows) -> list[Finding]:
    """Every run check on rows a reader of this package made (runlog: closed schema already applied)."""
    return rank_run([f for check in RUN_CHECKS for f in _guarded(check, rows)])


def diagnose_run(run_dir_or_log) -> list[Finding]:
    """Run-level findings from a log alone: a run folder, a trainer_state.json / table.csv path, TRL's
    log_history list, or rows already read ({"step": int, metric: value})."""
    from rookworld_debug.diagnosis.runlog import read_rows, rows_from_history
    if isinstance(run_dir_or_log, (str, Path)):
        return _run_checks(read_rows(run_dir_or_log))
    log = [d for d in (run_dir_or_log or []) if isinstance(d, dict)]
    # TRL's log_history (entries that logged a loss, merged per step), else rows as given
    return _run_checks(rows_from_history(log)) if any("loss" in d for d in log) else diagnose_rows(log)


def captured_steps(folder: Path) -> dict:
    """{step: trace folder} of every captures.json under `folder` (paths must stay inside their index's folder)."""
    from rookworld_debug.diagnosis.runlog import read_json, step_of
    out = {}
    for index in sorted(Path(folder).rglob("captures.json")):
        data = read_json(index)
        entries = data.get("captures", []) if isinstance(data, dict) else []
        for e in entries if isinstance(entries, list) else ():
            if isinstance(e, dict) and step_of(e.get("step")) is not None:
                p = _inside(index.parent, e.get("path"))
                if p is not None:
                    out[e["step"]] = p
    return out


def _inside(folder: Path, rel):
    """`folder / rel` when `rel` names a trace folder inside `folder`, else None (a path that leaves the folder,
    is not a string, or no file system can hold: a NUL, an unpaired surrogate, too long)."""
    if not isinstance(rel, str) or not rel:
        return None
    try:
        p = (folder / rel).resolve()
        return p if p.is_relative_to(folder.resolve()) and (p / "trace.json").is_file() else None
    except (OSError, ValueError):                 # UnicodeEncodeError is a ValueError
        return None


def merge(findings) -> list[Finding]:
    """One finding per code (its highest-ranked instance, with the earliest step the code was named at)."""
    from dataclasses import replace
    best: dict = {}
    first: dict = {}
    for f in rank(findings):
        best.setdefault(f.code, f)
        if f.step is not None:
            first[f.code] = min(first.get(f.code, f.step), f.step)
    return [replace(f, step=first.get(f.code, f.step)) for f in best.values()]


def diagnose_path(path, *, replay: bool = True) -> list[Finding]:
    """A trace folder (run_step's, a capture or a recorded step), a captures folder, or a run folder (log +
    captures). `replay`: also recompute each phase from the previous one's recorded output (diagnosis.replay) and
    rank the first phase that disagrees above everything else (a phase it only places, with no mechanism, after an
    error-level upstream check that names one)."""
    return diagnose_folder(path, replay=replay)[0]


def diagnose_folder(path, *, replay: bool = True) -> tuple[list, dict]:
    """(the findings of `diagnose_path`, {step: Replay} of every step replayed; step None for a single trace).
    When a replay fits a neighbouring declaration, the step's checks run under it too."""
    found, replays, _ = folder_diagnosis(path, replay=replay)
    return found, replays


class FolderDiagnosis(NamedTuple):
    findings: list              # ranked
    replays: dict               # {step: Replay} of every step replayed (None: a single trace)
    consecutive: list           # ConsecutiveReplay of each pair of consecutive recorded steps


def folder_diagnosis(path, *, replay: bool = True) -> FolderDiagnosis:
    """`diagnose_folder` with the consecutive-step replays: a folder of recorded step folders (`*/trace.json`, no
    captures.json) replays each step and, with `replay`, each pair of consecutive steps (diagnosis.replay.consecutive);
    the pair's findings carry the later step."""
    from rookworld_debug.grpo.step import StepTrace
    p = Path(path)
    if not p.exists():                       # a save cut short may have left the step beside it
        from rookworld_debug.grpo.trace.folder import leftover_hint
        raise DataError(f"{p} does not exist{leftover_hint(p)}")
    if (p / "trace.json").is_file():
        found, rep = diagnose_step(StepTrace.load(p), p, replay=replay)
        return FolderDiagnosis(found, {None: rep} if rep is not None else {}, [])
    from rookworld_debug.diagnosis.runlog import read_rows
    rows = read_rows(p)
    caps = captured_steps(p) if p.is_dir() else {}
    steps = recorded_steps(p) if p.is_dir() and not caps else []
    if not rows and not caps and not steps:
        raise DataError(f"{p} is neither a step trace (trace.json), a captures folder (captures.json), a folder of "
                        "recorded steps (*/trace.json) nor a run (trainer_state.json, table.csv)")
    found, replays = list(_run_checks(rows)), {}
    traces = {step: StepTrace.load(folder) for step, folder in sorted(caps.items())}
    for step, trace in traces.items():
        step_found, rep = _step_findings(trace, caps[step], replay)
        found += [replace_step(f, step) for f in step_found]
        if rep is not None:
            replays[step] = rep
    found += _guarded(RIN.check_captured_weights, traces) + _guarded(RIN.check_captured_rewards, traces)
    kept = [(s, caps[s], t) for s, t in traces.items() if getattr(t, "weights", "") == "state/"]
    cap_found, pairs = _pairs(kept, replays, replay)          # captures kept with their weights
    step_found, step_replays, step_pairs = _recorded_steps(steps, replay)
    replays.update(step_replays)
    return FolderDiagnosis(rank_run(merge(found + cap_found + step_found)), replays, pairs + step_pairs)


def recorded_steps(folder: Path) -> list:
    """[(step, folder, StepTrace)] of the recorded steps one level down (`*/trace.json`, no hidden or linked
    folder), ordered by the loop's step number (`trace.recorded.step`), else by folder name."""
    from rookworld_debug.diagnosis.evidence import first_step
    from rookworld_debug.grpo.step import StepTrace
    found = [d for d in sorted(Path(folder).iterdir()) if not d.name.startswith(".") and d.is_dir()
             and not d.is_symlink() and (d / "trace.json").is_file()]
    out = [(first_step(t), d, t) for d, t in ((d, StepTrace.load(d)) for d in found)]
    return sorted(out, key=lambda x: (x[0] is None, x[0] or 0, x[1].name))


def _recorded_steps(steps: list, replay: bool) -> tuple[list, dict, list]:
    """(findings, {step or folder name: Replay}, [ConsecutiveReplay]) of the recorded steps: each replayed as one
    step, then each consecutive pair (a pair that fails is a finding, as a check's failure is)."""
    found, replays = [], {}
    for step, folder, trace in steps:
        step_found, rep = _step_findings(trace, folder, replay)
        found += [replace_step(f, step) for f in step_found] if step is not None else step_found
        if rep is not None:
            replays[step if step is not None else folder.name] = rep
    pair_found, pairs = _pairs(steps, replays, replay)
    return found + pair_found, replays, pairs


def _pairs(steps: list, replays: dict, replay: bool) -> tuple[list, list]:
    """(findings, [ConsecutiveReplay]) of each pair of consecutive steps in `steps` [(step, folder, trace)]: step
    numbers k and k + 1 (steps without a number: in folder order)."""
    from rookworld_debug.diagnosis.replay.consecutive import replay_consecutive
    from rookworld_debug.diagnosis.replay.consecutive_findings import consecutive_findings
    found, pairs = [], []
    for (sa, fa, ta), (sb, fb, tb) in zip(steps, steps[1:]) if replay else []:
        if (sa is None) != (sb is None) or sa is not None and sb != sa + 1:
            continue                                  # not consecutive: nothing must carry over as it is
        rep_b = replays.get(sb if sb is not None else fb.name)
        fitted = rep_b.trace if rep_b is not None and rep_b.trace is not None else tb

        def run_pair(_, fa=fa, fb=fb, ta=ta, tb=fitted, rep_b=rep_b):
            pairs.append(replay_consecutive(fa, fb, traces=(ta, tb), replay_k1=rep_b))
            return consecutive_findings(pairs[-1])
        run_pair.__name__ = f"consecutive steps {fa.name} → {fb.name}"
        found += _guarded(run_pair, None)
    return found, pairs


def diagnose_step(trace, folder=None, *, replay: bool = True) -> tuple[list[Finding], Optional["Replay"]]:
    """One step's findings, ranked, and its Replay (None when `replay` is off): what `diagnose_folder` gives for
    a trace folder, and what the notebook's diagnosis card, the step report and the tune panel show. `folder`:
    the trace's folder, where a recorded step keeps its weights (state/); None for a step held in memory."""
    found, rep = _step_findings(trace, folder, replay)
    return rank(found), rep


def _step_findings(trace, folder, replay: bool) -> tuple[list, object]:
    """(the step's check and replay findings, its Replay or None). A replay that fails is itself a finding, as a
    check's failure is; the checks then run on the trace as declared."""
    from rookworld_debug.diagnosis.replay import replay_findings, replay_trace
    if not replay:
        return diagnose_trace(trace), None
    got = []

    def run_replay(t):
        try:
            got.append(replay_trace(t, folder))
        except RookWorldError as err:          # a saved step the replay refuses to read: the user's files, named
            return [refused_step(err)]
        return replay_findings(got[0])
    run_replay.__name__ = "replay"
    found = _guarded(run_replay, trace)
    rep = got[0] if got else None
    checked = rep.trace if rep is not None and rep.trace is not None else trace
    return _unrefuted(diagnose_trace(checked), rep) + found, rep


# signature checks (read from the recorded numbers, without the weights) whose mistake the replay recomputes on the
# weights as a scoring variant: where it scored both log-prob tensors and that mistake reproduced neither, the
# signature's pattern has another cause (another bug that hits the same rows)
REPLAYED_SIGNATURES = frozenset({"position_ids_left_pad", "temperature_not_applied"})
SCORED = ("per_token_logps (N, T)", "sampling_per_token_logps (N, T)")


def _unrefuted(found: list, rep) -> list:
    """`found` with each signature finding the replay refuted made an info line that says so."""
    from dataclasses import replace
    from rookworld_debug.diagnosis.replay.declaration import quantity_key
    scored = {quantity_key(c) for c in getattr(rep, "checks", ()) if c.status in ("agree", "disagree")}
    if not set(SCORED) <= scored:
        return found
    named = {c.cause for c in rep.checks}
    return [replace(f, severity="info", score=0.0,
                    cause="Not borne out by the replay: the log-probs recomputed on the recorded weights with this "
                          "mistake reproduce neither the loss forward's nor the sampler's recorded ones, so the "
                          f"pattern has another cause. The pattern: {f.cause}")
            if f.code in REPLAYED_SIGNATURES and f.code not in named else f for f in found]


def refused_step(err) -> Finding:
    """The replay refused the step's saved files (incomplete, altered, links out of the folder, tensors unlike their
    parameters): an error, since nothing of the step could be checked against them, with what was refused."""
    from rookworld_debug.diagnosis.findings import Evidence
    return Finding(code="recorded_step_refused", severity="error",
                   cause=f"The saved step cannot be replayed: {type(err).__name__}: {err}",
                   evidence=(Evidence("replay/refused", 1.0, f"files refused by the replay's reader: {err}"[:300],
                                      "the recorded step"),),
                   fix=Fix("Save or record the step again (an interrupted or altered save); nothing from the refused "
                           "files was used."), score=1.0)


def replace_step(f: Finding, step: int) -> Finding:
    from dataclasses import replace
    return f if f.step is not None else replace(f, step=step)
