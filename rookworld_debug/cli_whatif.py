"""`rookworld-debug whatif`: branch a saved step or run from its state, apply fixes, measure whether they work.

    rookworld-debug whatif runs/step0 --set beta=0.1 --set lr=1e-6 --steps 10 --seeds 3
    rookworld-debug whatif runs/demo --set lr=1e-5 --steps 3          # a TRL run folder: its flagged step
    rookworld-debug whatif runs/demo/captures/step-000007 --before runs/demo/checkpoint-6 --set lr=1e-5 --steps 3
    rookworld-debug whatif runs/step0 --from-findings --steps 10
    rookworld-debug whatif runs/manual/step-2 --fix          # what the replay's fix changes in this step's update
    rookworld-debug whatif runs/manual/step-2 --fix --steps 3 --seeds 3   # and 3 steps bug vs fix from there

PATH: a saved step (`rookworld-debug step --out DIR`, trace.json), a `run_steps` checkpoint folder (state.json), or a
TRL capture (with --before: the Trainer checkpoint saved before the captured step), or a TRL run folder (its
flight-recorder captures and Trainer checkpoints, e.g. a trl-demo run): the captured step whose update led to the
first flagged step is branched from the checkpoint saved before it, and one line says which. Each --set is one arm
(several settings in one arm: --set "beta=0.1 lr=1e-6"); the unchanged arm is always run first and must
reproduce the record (the self-check) before anything else is trusted. Writes OUT/whatif.json and
OUT/whatif.html; --json prints the JSON. Exit 0 on success, 2 on bad input or a failed self-check.

--fix: a recorded step folder kept with its weights (StepRecorder, StepConfig.keep_weights, a TRL capture with
keep_weights=True) is replayed, and from the phase its finding names the step is recomputed with the trusted
implementation from the recorded state (advantages, log-probs, loss, gradient, clipping, the recorded optimizer's
step): the verdict ("the fix turns this step's update by 41° and shrinks it 2.0×; 3 of 16 completions change
direction") and a table of the loss, the gradient's and the update's norms, their angles, the parameters the fix
changes most and each completion's log-likelihood change. With --steps K (and --seeds S, default 3): the
continuation, K steps of this package's step from the recorded state on the step's own prompts, the recorded bug
re-applied each step (where its fit is a setting this step has, or a factor on the advantages or on the loss)
against the fix, each symptom judged removed / not removed / cannot tell over the S shared seeds. Nothing is written; --json prints it as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rookworld_debug import cliargs


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rookworld-debug whatif", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="saved step folder, run_steps checkpoint folder, TRL capture folder or TRL run folder")
    ap.add_argument("--set", action="append", default=[], metavar="'KEY=VALUE ...'",
                    help="one arm: settings to change (StepConfig names or lr, eps, G, importance_sampling, mu)")
    ap.add_argument("--fix", action="store_true", help="a recorded step kept with its weights: the update its "
                    "replay's fix gives, against the recorded one (one step, from the recorded state)")
    ap.add_argument("--from-findings", action="store_true", help="one arm per finding of the diagnosis with a "
                    "configuration fix; the symptoms its evidence names")
    ap.add_argument("--steps", type=cliargs.int_in(0, cliargs.MAX_STEPS), default=0, help="k-step branches of this many steps (0: one step only)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per arm, shared across arms (default 3)")
    ap.add_argument("--before", help="the checkpoint the step starts from (TRL: checkpoint-N, N = step − 1; a saved "
                    "step: a run_steps checkpoint or model folder replacing the recorded start)")
    ap.add_argument("--symptom", action="append", default=[], help="judge only these symptoms (kl_spike, "
                    "entropy_collapse, reward_drop, grad_norm_spike, clip_ratio, heldout_reward, reward_noise)")
    ap.add_argument("--out", default="whatif-out", help="folder for whatif.json and whatif.html")
    ap.add_argument("--json", action="store_true", help="print the JSON")
    ap.add_argument("--cluster", help="Dask scheduler address (tcp://host:8786): run the arms there")
    cliargs.add_threads(ap)
    ap.add_argument("--device", help="where the arms run: 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto' (default: the "
                    "saved step's own device setting; the unchanged arm reproduces the record only on the same kind "
                    "of device)")
    return ap


def _is_trl_capture(path: Path) -> bool:
    from rookworld_debug.errors import TraceError
    f = path / "trace.json"
    if not f.is_file():
        return False
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError) as err:
        raise TraceError(f"{f}: not readable JSON ({err})") from None
    except RecursionError:                   # a tampered file nested past the parser's depth
        raise TraceError(f"{f}: nested too deeply to be a step's trace.json") from None
    return isinstance(d, dict) and isinstance(d.get("fields"), dict) and d["fields"].get("capture") is not None


def _arms(a, path: Path, trl: bool):
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.whatif import arms_from_sets
    from rookworld_debug.whatif.findings import arms_from_findings, diagnose
    if a.from_findings:
        if a.set:
            raise ConfigError("--set", "give either --set arms or --from-findings, not both")
        return arms_from_findings(diagnose(path), trl=trl)
    if not a.set:
        raise ConfigError("--set", "no arm to try: give at least one --set KEY=VALUE (or --from-findings)")
    return arms_from_sets([s.split() for s in a.set]), ()


def _progress(arms: int, total_steps: int):
    from tqdm.auto import tqdm
    bars = {"arm": tqdm(total=arms, desc="one step per arm", disable=None, file=sys.stderr),
            "step": tqdm(total=total_steps, desc="branch steps", disable=None, file=sys.stderr) if total_steps else None}

    def tick(kind, n=1):
        if bars.get(kind) is not None:
            bars[kind].update(n)
    return tick, bars


def _check_before_work(a) -> None:
    """The arguments that need no saved state, checked before anything is loaded or run."""
    from rookworld_debug.safeio import check_output_dir
    from rookworld_debug.whatif.symptoms import symptom
    check_output_dir(a.out, "--out")
    for name in a.symptom:
        symptom(name)


def _fix(a, path: Path) -> int:
    """--fix: the corrected step of a recorded step folder, printed (nothing written); with --steps K, the
    continuation too: K steps bug against fix from the recorded state, --seeds S shared seeds."""
    from rookworld_debug.errors import ConfigError, TraceError
    given = [name for name, on in (("--set", a.set), ("--from-findings", a.from_findings), ("--before", a.before),
                                   ("--cluster", a.cluster), ("--symptom", a.symptom)) if on]
    if given:
        raise ConfigError(given[0], "--fix compares one recorded step with its corrected update (and, with --steps, "
                                    "its continuation); it takes no arms or checkpoints")
    if a.steps < 0 or a.seeds < 1 or a.threads < 1:
        raise ConfigError("--steps/--seeds/--threads", "need --steps ≥ 0, --seeds ≥ 1, --threads ≥ 1")
    if not (path / "trace.json").is_file():
        raise TraceError(f"{path}: not a recorded step folder (no trace.json); --fix reads one step kept with its "
                         "weights")
    import torch
    torch.set_num_threads(a.threads)
    from rookworld_debug.diagnosis.replay import replay_trace
    from rookworld_debug.diagnosis.replay.corrected import corrected_step, describe
    from rookworld_debug.diagnosis.replay.weights import weights_for
    from rookworld_debug.grpo.step import StepTrace
    trace = StepTrace.load(path)
    w = weights_for(trace, path)
    replay = replay_trace(trace, path, loaded=w)
    res = corrected_step(trace, path, replay=replay, loaded=w)
    cont = None
    if a.steps:
        from rookworld_debug.whatif.continuation import continuation
        tick, bars = _progress(0, a.steps * a.seeds * 2)
        try:
            cont = continuation(trace, path, replay, steps=a.steps, seeds=a.seeds, on_step=lambda: tick("step"))
        finally:
            for b in bars.values():
                if b is not None:
                    b.close()
    if a.json:
        print(json.dumps({**res.to_dict(), **({"continuation": cont.to_dict()} if cont else {})}, indent=1,
                         allow_nan=False))
    else:
        from rookworld_debug.whatif.continuation import describe as describe_continuation
        print(describe(res) + (("\n\n" + describe_continuation(cont)) if cont else ""))
    return 0


def main(argv=None) -> int:
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    from rookworld_debug.errors import ConfigError, TraceError
    path = Path(a.path)
    if not path.is_dir():
        raise TraceError(f"{path}: no such folder")
    if a.fix:
        return _fix(a, path)
    if a.steps < 0 or a.seeds < 1 or a.threads < 1:
        raise ConfigError("--steps/--seeds/--threads", "need --steps ≥ 0, --seeds ≥ 1, --threads ≥ 1")
    _check_before_work(a)
    if a.device is not None:
        from rookworld_debug.models.devices import check_device
        check_device(a.device, "--device")          # a typo or a missing GPU: before any loading
    from rookworld_debug.trl.whatif_branch import is_run_folder, pick_branch
    if is_run_folder(path):                 # a TRL run folder: its flagged step and the checkpoint before it
        pick = pick_branch(path, a.before)
        path, a.before = pick.capture, str(pick.before)
        print(f"whatif: {pick.why}", file=sys.stderr)
    trl = _is_trl_capture(path)
    if trl and a.cluster:
        raise ConfigError("--cluster", "TRL branches run GRPOTrainer here; --cluster sends this package's own step")
    if trl and not a.before:
        raise ConfigError("--before", f"{path} is a TRL capture: give the Trainer checkpoint saved before it")
    import torch
    torch.set_num_threads(a.threads)
    arms, symptoms = _arms(a, path, trl)
    from rookworld_debug.whatif.overrides import check_needs_steps
    check_needs_steps(arms, a.steps)
    symptoms = tuple(a.symptom) or symptoms
    from rookworld_debug.whatif.overrides import sampling_fields
    one_step_arms = sum(not set(x.overrides) & set(sampling_fields()) for x in arms)
    tick, bars = _progress(one_step_arms, a.steps * a.seeds * len(arms))
    try:
        if trl:
            from rookworld_debug.trl.whatif_branch import trl_whatif
            res = trl_whatif(path, arms, before=a.before, steps=a.steps, seeds=a.seeds, symptoms=symptoms,
                             progress=tick)
        else:
            from rookworld_debug.whatif import whatif
            res = whatif(path, arms, steps=a.steps, seeds=a.seeds, before=a.before, symptoms=symptoms,
                         cluster=a.cluster, progress=tick, device=a.device)
    finally:
        for b in bars.values():
            if b is not None:
                b.close()
    from rookworld_debug.report.whatif_page import write
    d = res.to_dict()
    jpath, hpath = write(d, a.out)
    if a.json:
        print(json.dumps(d, indent=1, default=str))
    else:
        print(res.self_check.describe())
        for v in res.verdicts:
            print(f"  {v.symptom:18s} {v.arm:28s} {v.verdict:22s} {v.reason}")
        print(f"wrote {hpath} and {jpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
