"""The sealed fault set: twenty-one bug classes reported against public GRPO/PPO trainers, written into the hand-written
loop (one step), into its consecutive steps, and into TRL 1.16's GRPOTrainer, and frozen before the diagnosis fits
they call for were written. Scored as a user meets them: the first finding that is not info must name the cause
(top-1), or one of the first three (top-3); the first phase found disagreeing must be the one the bug breaks.

    python -m rookworld_debug.lab.sealed --out reports/sealed        # about 25 minutes on a 2-core CPU

Writes out/results.jsonl (a row per case, as each finishes) and out/table.md.

    python -m rookworld_debug.lab.sealed --out reports/probe --only probe   # not sealed: see PROBE_SHAPES

    python -m rookworld_debug.lab.sealed --out reports/blind --only blind   # a second held-out set

    python -m rookworld_debug.lab.sealed --out reports/unseen --only unseen   # a third

    python -m rookworld_debug.lab.sealed --out reports/fresh --only fresh     # a fourth

    python -m rookworld_debug.lab.sealed --out reports/novel --only novel     # a fifth

    python -m rookworld_debug.lab.sealed --out reports/sixth --only sixth     # a sixth

    python -m rookworld_debug.lab.sealed --out reports/seventh --only seventh   # a seventh

    python -m rookworld_debug.lab.sealed --out reports/eighth --only eighth     # an eighth

`--only blind` runs seven more bug classes written and frozen (in a commit of their own) before any fit for them, with
one healthy control; `--only unseen` nine more, frozen the same way; `--only fresh` sixteen more, frozen the same way:
eleven in one step of the hand-written loop and five between its consecutive steps, with one healthy control of each
kind; `--only novel` twelve more, frozen the same way: nine in one step and three between consecutive steps, with one
healthy control of each kind; `--only sixth` fourteen more, frozen the same way: eight in one step, four between
consecutive steps and two in TRL's GRPOTrainer, with two healthy controls in one step (the plain loop, and AdamW's two
parameter groups over four micro-batches), one between consecutive steps and one TRL run; `--only seventh` sixteen
more, frozen the same way: six in one step, four between consecutive steps, three in TRL's GRPOTrainer and three in
the project's own step (run through the fault benchmark's step cases, seed 0), with three healthy controls in one step
(the plain loop, two optimizer passes over four micro-batches, bf16 autocast with AdamW's two parameter groups), one
between consecutive steps, two TRL runs (the plain run, a high-entropy token mask) and two own steps (the plain step,
micro-batches of four rows); `--only eighth` sixteen more, frozen the same way: six in one step, four between
consecutive steps, three in TRL's GRPOTrainer and three in the project's own step, with four healthy controls in one
step (the plain loop, a learning-rate schedule with warm-up, micro-batches of unequal size, truncated completions
masked out), one between consecutive steps, four TRL runs (the plain run, two optimizer passes per generation, dapo
over a generation batch of two steps, cispo) and three own steps (AdamW's weight decay, a binding clip over two
passes, a short completion budget). `--only probe` runs what
was written after the set's fits, from the same trackers (not held out): five more faults of the hand-written loop,
and healthy loops of shapes that real trainers have (AdamW's two parameter groups, frozen embeddings, a gradient
handed over after the clip, numbers left at their defaults), none of which may get an error.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Optional

# healthy loops of the shapes the sealed faults need: none may get an error-level finding
HEALTHY_SINGLE = ({}, {"autocast": "bfloat16"}, {"micro_batches": 4},
                  {"num_iterations": 2, "declare_iteration": False})


# healthy loops of shapes real trainers have, written with the probe faults (not held out)
PROBE_SHAPES = ({"weight_decay": 0.1, "lr": 1e-3}, {"frozen_embeddings": True},
                {"gradient_after_clip": True, "max_grad_norm": 0.05}, {"undeclare": ("beta",)},
                {"undeclare": ("temperature",)}, {"undeclare": ("max_grad_norm",), "max_grad_norm": 0.05},
                {"num_iterations": 2, "declare_iteration": False, "undeclare": ("num_iterations", "temperature")})


def _loop_rows(name: str, faults, all_faults: dict, settings: dict, healthy: tuple):
    """The hand-written loop's rows: each fault under the setting it needs, then (all faults only) the healthy
    loops."""
    from rookworld_debug.lab.handloop import LoopConfig
    from rookworld_debug.lab.replay_bench import diagnose_case
    for fault in faults if faults is not None else all_faults:
        r = diagnose_case(LoopConfig(**settings.get(fault, {})), fault)
        yield {**r, "set": name, "phase_right": r["first_phase"] == r["expected_phase"]}
    for kw in healthy if faults is None else ():
        yield {**diagnose_case(LoopConfig(**kw), ""), "set": name}


def blind_rows(faults=None):
    from rookworld_debug.lab.handloop import BLIND_FAULTS, BLIND_SETTINGS
    return _loop_rows("blind", faults, BLIND_FAULTS, BLIND_SETTINGS, HEALTHY_SINGLE[:1])


def unseen_rows(faults=None):
    from rookworld_debug.lab.handloop import UNSEEN_FAULTS
    return _loop_rows("unseen", faults, UNSEEN_FAULTS, {}, HEALTHY_SINGLE[:1])


def fresh_rows(faults=None):
    """The fourth held-out set: its one-step faults as blind_rows runs them, then its consecutive-step faults as
    between_rows runs the sealed ones (each part with its healthy control when the whole set runs)."""
    from rookworld_debug.lab.between_steps import FRESH_BETWEEN_FAULTS
    from rookworld_debug.lab.handloop import FRESH_FAULTS, FRESH_SETTINGS
    return _two_part_rows("fresh", faults, FRESH_FAULTS, FRESH_SETTINGS, FRESH_BETWEEN_FAULTS)


def novel_rows(faults=None):
    """The fifth held-out set, run as fresh_rows runs the fourth."""
    from rookworld_debug.lab.between_steps import NOVEL_BETWEEN_FAULTS
    from rookworld_debug.lab.handloop import NOVEL_FAULTS, NOVEL_SETTINGS
    return _two_part_rows("novel", faults, NOVEL_FAULTS, NOVEL_SETTINGS, NOVEL_BETWEEN_FAULTS)


def sixth_rows(faults=None):
    """The sixth held-out set: its one-step and consecutive-step faults as fresh_rows runs the fourth's, then its TRL
    faults as trl_rows runs the sealed ones (each part with its healthy controls when the whole set runs)."""
    from rookworld_debug.lab.between_steps import SIXTH_BETWEEN_FAULTS
    from rookworld_debug.lab.faults_trl import SIXTH_TRL_FAULTS
    from rookworld_debug.lab.handloop import SIXTH_FAULTS, SIXTH_HEALTHY, SIXTH_SETTINGS
    yield from _two_part_rows("sixth", faults, SIXTH_FAULTS, SIXTH_SETTINGS, SIXTH_BETWEEN_FAULTS, SIXTH_HEALTHY)
    trl = None if faults is None else [f for f in faults if f in {x.name for x in SIXTH_TRL_FAULTS}]
    if trl is None or trl:
        yield from trl_rows(trl, SIXTH_TRL_FAULTS, "sixth TRL")


def seventh_rows(faults=None):
    """The seventh held-out set: its one-step and consecutive-step faults as sixth_rows runs the sixth's, its TRL
    faults as trl_rows runs them (with two healthy runs), then its faults in the project's own step as step_rows runs
    them (each part with its healthy controls when the whole set runs)."""
    from rookworld_debug.lab.between_steps import SEVENTH_BETWEEN_FAULTS
    from rookworld_debug.lab.faults_heldout import SEVENTH_STEP_CONTROLS, SEVENTH_STEP_FAULTS
    from rookworld_debug.lab.faults_trl import SEVENTH_TRL_FAULTS, SEVENTH_TRL_HEALTHY
    from rookworld_debug.lab.handloop import SEVENTH_FAULTS, SEVENTH_HEALTHY, SEVENTH_SETTINGS
    yield from _four_part_rows("seventh", faults, (SEVENTH_FAULTS, SEVENTH_SETTINGS, SEVENTH_BETWEEN_FAULTS,
                                                   SEVENTH_HEALTHY), (SEVENTH_TRL_FAULTS, SEVENTH_TRL_HEALTHY),
                               (SEVENTH_STEP_FAULTS, SEVENTH_STEP_CONTROLS))


def eighth_rows(faults=None):
    """The eighth held-out set, run as seventh_rows runs the seventh."""
    from rookworld_debug.lab.between_steps import EIGHTH_BETWEEN_FAULTS
    from rookworld_debug.lab.faults_heldout import EIGHTH_STEP_CONTROLS, EIGHTH_STEP_FAULTS
    from rookworld_debug.lab.faults_trl import EIGHTH_TRL_FAULTS, EIGHTH_TRL_HEALTHY
    from rookworld_debug.lab.handloop import EIGHTH_FAULTS, EIGHTH_HEALTHY, EIGHTH_SETTINGS
    yield from _four_part_rows("eighth", faults, (EIGHTH_FAULTS, EIGHTH_SETTINGS, EIGHTH_BETWEEN_FAULTS,
                                                  EIGHTH_HEALTHY), (EIGHTH_TRL_FAULTS, EIGHTH_TRL_HEALTHY),
                               (EIGHTH_STEP_FAULTS, EIGHTH_STEP_CONTROLS))


def _four_part_rows(name: str, faults, loop: tuple, trl: tuple, own: tuple):
    """A set's one-step and consecutive-step faults (`loop`: single, settings, between, healthy), its TRL faults
    (`trl`: faults, healthy settings) and its faults in the project's own step (`own`: faults, controls); with
    `faults`, only those (no controls)."""
    yield from _two_part_rows(name, faults, *loop)
    for part, (known, healthy), run in ((f"{name} TRL", trl, trl_rows), (f"{name} own step", own, step_rows)):
        picked = None if faults is None else [f for f in faults if f in {x.name for x in known}]
        if picked is None or picked:
            yield from run(picked, known, part, healthy)


def step_rows(names, known: tuple, name: str, controls: tuple = ()):
    """Faults in the project's own step (`run_step`), each through the fault benchmark's step case (seed 0: the run
    against its fault-free twin, then the diagnosis a user gets), then (all faults only) the healthy `controls`."""
    from rookworld_debug.lab.faults import control_case, step_case
    twins: dict = {}
    for fault in [f for f in known if names is None or f.name in names]:
        r = step_case(fault, 0, twins)
        codes = [c["code"] for c in r["findings"] if c["severity"] != "info"]
        accept = set(r["accept"])
        yield {"set": name, "fault": fault.name, "expected_phase": "", "expected_cause": "|".join(sorted(accept)),
               "codes": codes[:5], "errors": sum(c["severity"] == "error" for c in r["findings"]),
               "top1": bool(codes) and codes[0] in accept, "top3": bool(accept & set(codes[:3])),
               "first_phase": "", "phase_right": None, "effective": r["effective"], "seconds": r["seconds"]}
    for ctrl in controls if names is None else ():
        r = control_case(ctrl)
        codes = [c["code"] for c in r["findings"] if c["severity"] != "info"]
        yield {"set": name, "fault": "", "expected_phase": "", "expected_cause": "", "codes": codes[:5],
               "errors": r["errors"], "top1": False, "top3": False, "first_phase": "", "phase_right": None,
               "effective": True, "seconds": r["seconds"]}


def _two_part_rows(name: str, faults, single: dict, settings: dict, between: dict, healthy: tuple = HEALTHY_SINGLE[:1]):
    """A set's one-step faults, then its consecutive-step faults (`faults`: only these, no controls)."""
    one = None if faults is None else [f for f in faults if f in single]
    two = None if faults is None else [f for f in faults if f in between]
    if one is None or one:
        yield from _loop_rows(name, one, single, settings, healthy)
    if two is None or two:
        yield from between_rows(two, between, f"{name} between steps")


def probe_rows(faults=None):
    from rookworld_debug.lab.handloop import PROBE_FAULTS, PROBE_SETTINGS
    return _loop_rows("probe", faults, PROBE_FAULTS, PROBE_SETTINGS, PROBE_SHAPES)


def single_rows(faults=None):
    from rookworld_debug.lab.handloop import SEALED_FAULTS, SEALED_SETTINGS
    return _loop_rows("one step", faults, SEALED_FAULTS, SEALED_SETTINGS, HEALTHY_SINGLE)


def between_rows(faults=None, known: Optional[dict] = None, name: str = "consecutive steps"):
    """The consecutive-step faults (`known`: the sealed ones unless given), each recorded by run_pair and replayed as
    a pair; the healthy pair first: a fault whose second step's tensors equal the healthy one's changed nothing and
    is not scored."""
    from rookworld_debug.lab.between_steps import BASE, SEALED_BETWEEN_FAULTS, _pair_result, run_pair
    known = SEALED_BETWEEN_FAULTS if known is None else known
    healthy = None
    for fault in [""] + (faults if faults is not None else list(known)):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            folders = run_pair(BASE, tmp, fault)
            digest = _tensors_digest(folders[-1])
            r = _pair_result(fault or "healthy", folders, fault)
        healthy = digest if not fault else healthy
        if not fault and faults is not None:
            continue                                   # a subset: the healthy pair only to tell effect
        first = next((p for p, s in r["checks"].items() if s == "disagree"), "")
        want = known.get(fault, ("", ""))
        yield {"set": name, "fault": fault, "expected_phase": want[0], "expected_cause": want[1],
               "codes": r["errors"][:5], "errors": len(r["errors"]), "top1": r["found"],
               "top3": bool(fault) and want[1] in r["errors"][:3], "first_phase": first,
               "phase_right": bool(fault) and first == want[0], "effective": not fault or digest != healthy,
               "seconds": time.perf_counter() - t0}


def _tensors_digest(folder) -> str:
    """A hash of every tensor file a recorded step holds (its weights, optimizer state, rollout, gradient)."""
    import hashlib
    h = hashlib.sha256()
    for f in sorted(Path(folder).rglob("*.safetensors")):
        h.update(f.relative_to(folder).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def trl_rows(names=None, known: Optional[tuple] = None, name: str = "TRL", healthy: tuple = ({},)):
    """TRL's GRPOTrainer runs of `known` (the sealed TRL faults unless given), then (all faults only) a healthy run
    under each of `healthy`'s GRPOConfig settings."""
    from rookworld_debug.lab.faults_trl import SEALED_TRL_FAULTS, trl_case
    twins: dict = {}
    faults = [f for f in (SEALED_TRL_FAULTS if known is None else known) if names is None or f.name in names]
    runs = [(f, None) for f in faults] + ([(None, kw) for kw in healthy] if names is None else [])
    for fault, base in runs:
        r = trl_case(fault, 0, twins, base=base)
        codes = [c["code"] for c in r["findings"] if c["severity"] != "info"]
        accept = set(r.get("accept", ()))
        yield {"set": name, "fault": fault.name if fault else "", "expected_phase": "",
               "expected_cause": "|".join(sorted(accept)), "codes": codes[:5],
               "errors": sum(c["severity"] == "error" for c in r["findings"]),
               "top1": bool(codes) and codes[0] in accept, "top3": bool(accept & set(codes[:3])),
               "first_phase": "", "phase_right": None, "effective": r.get("effective", True),
               "seconds": r["seconds"]}


def table(rows: list) -> str:
    faults = [r for r in rows if r["fault"] and r.get("effective", True)]
    healthy = [r for r in rows if not r["fault"]]
    phased = [r for r in faults if r["phase_right"] is not None]
    pct = (lambda k, n: f"{k}/{n} ({100 * k / n:.0f} %)" if n else "0/0")
    sets = {str(r.get("set") or "").partition(" ")[0] for r in rows}   # probe: written after the fits, not sealed
    held_out = {"probe", "blind", "unseen", "fresh", "novel", "sixth", "seventh", "eighth"}
    kind = " and ".join(sorted(sets)).capitalize() if sets and sets <= held_out else "Sealed"
    lines = [f"{kind} faults scored: {len(faults)}; cause named first {pct(sum(r['top1'] for r in faults), len(faults))}"
             f", within three {pct(sum(r['top3'] for r in faults), len(faults))}, first phase right "
             f"{pct(sum(bool(r['phase_right']) for r in phased), len(phased))} (TRL cases have no phase); healthy "
             f"controls {len(healthy)}, with an error-level finding: {sum(r['errors'] > 0 for r in healthy)}", "",
             *[f"not scored (changed nothing the loop recorded): {r['fault']}" for r in rows
               if r["fault"] and not r.get("effective", True)],
             "| set | fault | cause due | phase due | first phase found | findings (first five) | top-1 | top-3 |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['fault'] or 'healthy'} | {r['expected_cause'] or '—'} | {r['expected_phase'] or '—'} "
              f"| {r['first_phase'] or '—'} | {', '.join(r['codes']) or '—'} | "
              f"{('✓' if r['top1'] else '✗') if r['fault'] else '—'} | "
              f"{('✓' if r['top3'] else '✗') if r['fault'] else ('errors: ' + str(r['errors']))} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.lab.sealed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="reports/sealed", help="folder for results.jsonl and table.md")
    ap.add_argument("--only", choices=("single", "between", "trl", "probe", "blind", "unseen", "fresh", "novel",
                                       "sixth", "seventh", "eighth"),
                    action="append",
                    help="only these parts (repeatable); default: the three sealed ones")
    ap.add_argument("--fault", action="append", help="only these faults (repeatable; no healthy controls)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = {"single": single_rows, "between": between_rows, "trl": trl_rows, "probe": probe_rows,
             "blind": blind_rows, "unseen": unseen_rows, "fresh": fresh_rows, "novel": novel_rows,
             "sixth": sixth_rows, "seventh": seventh_rows, "eighth": eighth_rows}
    rows = []
    with open(out / "results.jsonl", "a") as fh:
        for name in a.only or ["single", "between", "trl"]:
            for row in parts[name](_subset(name, a.fault)):
                rows.append(row)
                fh.write(json.dumps(row, default=str) + "\n")
                fh.flush()
                print(f"{row['set']}: {row['fault'] or 'healthy'} → {row['codes'][:3]}", flush=True)
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
    (out / "table.md").write_text(table(rows))
    print(table(rows))
    return 0


def _subset(part: str, names: Optional[list]):
    """The faults of `part` among `names` (None: all of them, with the healthy controls)."""
    if names is None:
        return None
    from rookworld_debug.lab.between_steps import EIGHTH_BETWEEN_FAULTS, FRESH_BETWEEN_FAULTS, NOVEL_BETWEEN_FAULTS, \
        SEALED_BETWEEN_FAULTS, SEVENTH_BETWEEN_FAULTS, SIXTH_BETWEEN_FAULTS
    from rookworld_debug.lab.faults_heldout import EIGHTH_STEP_FAULTS, SEVENTH_STEP_FAULTS
    from rookworld_debug.lab.faults_trl import EIGHTH_TRL_FAULTS, SEALED_TRL_FAULTS, SEVENTH_TRL_FAULTS, \
        SIXTH_TRL_FAULTS
    from rookworld_debug.lab.handloop import BLIND_FAULTS, EIGHTH_FAULTS, FRESH_FAULTS, NOVEL_FAULTS, PROBE_FAULTS, \
        SEALED_FAULTS, SEVENTH_FAULTS, SIXTH_FAULTS, UNSEEN_FAULTS
    known = {"single": SEALED_FAULTS, "between": SEALED_BETWEEN_FAULTS,
             "trl": {f.name: f for f in SEALED_TRL_FAULTS}, "probe": PROBE_FAULTS, "blind": BLIND_FAULTS,
             "unseen": UNSEEN_FAULTS, "fresh": {**FRESH_FAULTS, **FRESH_BETWEEN_FAULTS},
             "novel": {**NOVEL_FAULTS, **NOVEL_BETWEEN_FAULTS},
             "sixth": {**SIXTH_FAULTS, **SIXTH_BETWEEN_FAULTS, **{f.name: f for f in SIXTH_TRL_FAULTS}},
             "seventh": {**SEVENTH_FAULTS, **SEVENTH_BETWEEN_FAULTS, **{f.name: f for f in SEVENTH_TRL_FAULTS},
                         **{f.name: f for f in SEVENTH_STEP_FAULTS}},
             "eighth": {**EIGHTH_FAULTS, **EIGHTH_BETWEEN_FAULTS, **{f.name: f for f in EIGHTH_TRL_FAULTS},
                        **{f.name: f for f in EIGHTH_STEP_FAULTS}}}[part]
    return [n for n in names if n in known]


if __name__ == "__main__":
    raise SystemExit(main())
