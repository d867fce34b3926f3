"""The hand-written-loop fault benchmark: every fault of `lab.handloop.FAULTS` recorded through `StepRecorder`,
diagnosed by `diagnose_path` (replay on), scored by top-1 / top-3 cause and the first disagreeing phase; healthy
steps of the same loop over varied settings must give no error-level finding.

    python -m rookworld_debug.lab.replay_bench --out reports/replay_bench      # results.jsonl + table.md
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from rookworld_debug.diagnosis.replay.records import PHASES

HEALTHY = tuple(
    dict(loss_type=lt, beta=beta, num_generations=g, task=task, lr=lr, dtype=dtype)
    for lt, beta, g, task, lr, dtype in (
        ("grpo", 0.04, 4, "P", 1e-4, "float32"), ("dapo", 0.0, 4, "P", 1e-5, "float32"),
        ("bnpo", 0.1, 3, "P", 3e-4, "float32"), ("dr_grpo", 0.04, 4, "A", 1e-4, "float32"),
        ("grpo", 0.0, 2, "A", 1e-6, "float32"), ("dapo", 0.04, 3, "A", 1e-4, "float32"),
        ("bnpo", 0.0, 4, "P", 1e-5, "float32"), ("dr_grpo", 0.1, 2, "P", 1e-4, "float32"),
        ("grpo", 0.04, 4, "P", 1e-4, "bfloat16"), ("dapo", 0.1, 3, "P", 3e-4, "bfloat16"),
        ("bnpo", 0.04, 2, "A", 1e-4, "bfloat16"), ("grpo", 0.1, 3, "A", 3e-4, "float32"),
        ("dapo", 0.0, 2, "P", 1e-4, "bfloat16")))


# the loop's shapes: passes over a rollout (μ, the recorded pass), micro-batches, a separate sampler copy, a
# scheduler, bf16 autocast, truncated completions masked, the plain k3 KL
SHAPES = tuple(
    dict(num_iterations=mu, record_pass=rp, micro_batches=mb, separate_sampler=ss, scheduler=sc, loss_type=lt,
         beta=beta, autocast=ac, mask_truncated=mt, bias_correction=bc, num_generations=g)
    for mu, rp, mb, ss, sc, lt, beta, ac, mt, bc, g in (
        (2, -1, 2, False, False, "grpo", 0.04, "", False, True, 4), (2, 0, 1, False, True, "dapo", 0.0, "", False, True, 4),
        (4, -1, 4, False, False, "bnpo", 0.04, "", False, True, 4), (4, 2, 2, True, True, "dr_grpo", 0.1, "", False, True, 4),
        (1, -1, 3, True, False, "grpo", 0.04, "", False, True, 3), (2, -1, 2, True, True, "bnpo", 0.0, "", True, True, 4),
        (1, -1, 4, False, True, "dapo", 0.04, "", True, False, 4), (2, -1, 1, False, False, "grpo", 0.1, "", False, False, 2),
        (2, -1, 2, False, False, "dapo", 0.04, "bfloat16", False, True, 4),
        (1, -1, 2, True, False, "bnpo", 0.04, "bfloat16", True, True, 4),
        (4, -1, 2, False, True, "grpo", 0.0, "", False, True, 4), (1, -1, 1, False, False, "dr_grpo", 0.0, "", True, True, 3)))
FP32_SHAPES = tuple(sh for sh in SHAPES if not sh["autocast"])
# healthy loops whose declaration is not what they compute: a declaration note, never an error
DECLARATION_VARIANTS = tuple(
    dict(declare=d, **kw) for d, kw in (
        ((("use_bias_correction_kl", True),), dict(bias_correction=False)),
        ((("use_bias_correction_kl", False),), dict(bias_correction=True, num_iterations=2)),
        ((("loss_type", "grpo"),), dict(loss_type="dapo")),
        ((("loss_type", "dapo"),), dict(loss_type="bnpo", micro_batches=2)),
        ((("scale_rewards", "none"),), dict()),
        ((("precision", None),), dict(autocast="bfloat16")),
        ((("mask_truncated_completions", False),), dict(mask_truncated=True)),
        ((("loss_type", "dr_grpo"), ("use_bias_correction_kl", True)), dict(loss_type="grpo", bias_correction=False))))

# settings a fault needs to change the step at all (a clip that never binds changes nothing; a fault of a loop shape)
FAULT_SETTINGS = {"no_clip": {"max_grad_norm": 1e-3}, "clip_after_step": {"max_grad_norm": 1e-3},
                  "sampler_not_synced": {"separate_sampler": True}, "old_logps_recomputed": {"num_iterations": 2},
                  "scheduler_stepped_early": {"scheduler": True}}


def diagnose_case(cfg, fault: str) -> dict:
    from rookworld_debug.diagnosis.registry import diagnose_folder
    from rookworld_debug.lab.handloop import ALL_FAULTS as FAULTS, run
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rec = run(cfg, out=tmp, fault=fault)
        t1 = time.perf_counter()
        findings, replays = diagnose_folder(tmp)
        t2 = time.perf_counter()
    rep = replays.get(None)
    first = rep.first_disagreement if rep is not None else None
    if rep is not None and rep.declaration is not None:       # the phase the declaration was fitted in came first
        first = rep.declaration
    phase, cause = FAULTS.get(fault, ("", ""))
    codes = [f.code for f in findings if f.severity != "info"]
    return {"fault": fault, "config": cfg.to_dict(), "expected_phase": phase, "expected_cause": cause,
            "first_phase": first.phase if first else "", "codes": codes[:5],
            "errors": sum(f.severity == "error" for f in findings),
            "top1": bool(codes) and _names(codes[0], cause, phase), "top3": any(_names(c, cause, phase)
                                                                           for c in codes[:3]),
            "record_seconds": t1 - t0, "diagnose_seconds": t2 - t1,
            "replay_seconds": rep.seconds if rep is not None else None,
            "effective": not fault or first is not None or _changed(cfg, rec),
            "declared": [[d.keyword, d.fitted] for d in rep.declarations] if rep is not None else []}


_HEALTHY_PIECES: dict = {}


def _changed(cfg, rec) -> bool:
    """Whether a fault changed anything the loop recorded (a fault that changes nothing, e.g. a clamp no value
    reaches, is not scored): its pieces against the healthy loop's of the same settings and seed."""
    import torch
    from rookworld_debug.lab.handloop import run
    key = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    if key not in _HEALTHY_PIECES:
        _HEALTHY_PIECES[key] = run(cfg).pieces
    ref = _HEALTHY_PIECES[key]

    def differ(a, b) -> bool:
        if isinstance(a, dict):
            return set(a) != set(b) or any(differ(a[k], b[k]) for k in a)
        if isinstance(a, (tuple, list)):
            return len(a) != len(b) or any(differ(x, y) for x, y in zip(a, b))
        if torch.is_tensor(a):            # float-order noise of the same math is no change
            return a.shape != b.shape or not torch.allclose(a.nan_to_num().double(), b.nan_to_num().double(),
                                                            rtol=1e-4, atol=1e-6)
        return a != b
    return set(rec.pieces) != set(ref) or any(differ(rec.pieces[k], ref[k]) for k in ref)


def _healthy_folder(kind: str, tmp: Path, kw: dict) -> Path:
    """A healthy step of another trainer, saved: the project's run_step, TRL's GRPOTrainer (a capture), or one of
    the example trainers (run as a user runs them)."""
    import subprocess
    import sys
    if kind == "run_step":
        from rookworld_debug import StepConfig, run_step
        run_step(StepConfig(reward_mode="dataset", **kw)).save(tmp / "step")
        return tmp / "step"
    if kind == "trl":
        from rookworld_debug.trl.example import run
        run(tmp, steps=2, capture=(2,), **kw)
        return next(tmp.glob("step-*"))
    script = Path(__file__).resolve().parents[2] / "examples" / f"{kind}.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp / "step")], check=True, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=600)
    return tmp / "step"


OTHER_HEALTHY = (("run_step", dict(loss_type="dapo", beta=0.04, batch_size=2, num_generations=4)),
                 ("run_step", dict(loss_type="grpo", beta=0.0, batch_size=2, num_generations=3, task="A")),
                 ("run_step", dict(loss_type="manual", beta=0.1, batch_size=2, num_generations=4)),
                 ("run_step", dict(loss_type="bnpo", beta=0.04, batch_size=2, num_generations=4, dtype="bfloat16")),
                 ("run_step", dict(loss_type="dr_grpo", beta=0.04, batch_size=2, num_generations=2, lr=1e-4)),
                 ("run_step", dict(loss_type="cispo", beta=0.0, batch_size=2, num_generations=4, task="mixed")),
                 ("trl", dict(loss_type="dapo", beta=0.04)), ("trl", dict(loss_type="grpo", beta=0.0)),
                 ("trl", dict(loss_type="bnpo", beta=0.1)), ("manual_loop", {}), ("mini_loop", {}),
                 ("ppo_epochs_loop", {}))


def healthy_case(kind: str, kw: dict) -> dict:
    from rookworld_debug.diagnosis import diagnose_path
    with tempfile.TemporaryDirectory() as tmp:
        folder = _healthy_folder(kind, Path(tmp), kw)
        t0 = time.perf_counter()
        findings = diagnose_path(folder)
        secs = time.perf_counter() - t0
    codes = [f.code for f in findings if f.severity != "info"]
    return {"fault": "", "config": {"trainer": kind, **kw}, "expected_phase": "", "expected_cause": "",
            "first_phase": "", "codes": codes[:5], "errors": sum(f.severity == "error" for f in findings),
            "error_codes": [f.code for f in findings if f.severity == "error"], "top1": False, "top3": False,
            "record_seconds": 0.0, "diagnose_seconds": secs}


def _shape(config: dict) -> str:
    keys = ("num_iterations", "micro_batches", "separate_sampler", "scheduler", "loss_type", "beta", "autocast",
            "mask_truncated")
    return ", ".join(f"{k}={config[k]}" for k in keys if k in config)


def _describe(c: dict) -> str:
    """A healthy step's loop in words: its trainer, or the hand-written loop's shape and what it declared."""
    if "trainer" in c:
        return f"{c['trainer']} {', '.join(f'{k}={v}' for k, v in c.items() if k != 'trainer')}"
    declared = ", ".join(f"{k}={v!r}" for k, v in c.get("declare", ()))
    return _short_shape(c) + (f", declared {declared}" if declared else "")


def _short_shape(c: dict) -> str:
    """μ2 mb2 sampler sched bnpo β0.04: the loop's shape in a table cell."""
    parts = [f"μ{c.get('num_iterations', 1)}", f"mb{c.get('micro_batches', 2)}", c.get("loss_type", "grpo"),
             f"β{c.get('beta', 0.04):g}"]
    parts += [w for k, w in (("separate_sampler", "sampler"), ("scheduler", "sched"), ("mask_truncated", "masked"))
              if c.get(k)]
    return " ".join(parts + ([c["autocast"]] if c.get("autocast") else []))


def _names(code: str, cause: str, phase: str) -> bool:
    """A finding names the fault: its cause code, or — for a fault with no known mechanism — its phase."""
    return code == cause if cause else code == f"replay_{phase}"


def run_all(out: Path, faults=None, healthy=HEALTHY + SHAPES + DECLARATION_VARIANTS,
            other_healthy=OTHER_HEALTHY, shaped: bool = False) -> list:
    """Every fault (and, `shaped`, each again in a loop of another shape), then the healthy steps."""
    from rookworld_debug.lab.handloop import FAULTS, LoopConfig
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / "results.jsonl", "w") as fh:
        def keep(row):
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        for i, fault in enumerate(faults if faults is not None else FAULTS):
            keep(diagnose_case(LoopConfig(**FAULT_SETTINGS.get(fault, {})), fault))
            if shaped:      # the same fault in a loop of another shape (fp32: a bf16 tolerance hides small faults)
                shape = FP32_SHAPES[i % len(FP32_SHAPES)]
                keep(diagnose_case(LoopConfig(**{**shape, **FAULT_SETTINGS.get(fault, {})}), fault))
        for kw in healthy:
            keep(diagnose_case(LoopConfig(**kw), ""))
        for kind, kw in other_healthy:
            keep(healthy_case(kind, kw))
    (out / "table.md").write_text(table(rows))
    return rows


def read_rows(path: Path) -> list:
    """The results of a benchmark run (one JSON object per line)."""
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def table(rows) -> str:
    ineffective = [r for r in rows if r["fault"] and not r.get("effective", True)]
    faults = [r for r in rows if r["fault"] and r.get("effective", True)]
    healthy = [r for r in rows if not r["fault"]]
    lines = [f"Faults: {len(faults)}; top-1 {sum(r['top1'] for r in faults)}/{len(faults)}, top-3 "
             f"{sum(r['top3'] for r in faults)}/{len(faults)}, first disagreeing phase right "
             f"{sum(r['first_phase'] == r['expected_phase'] for r in faults)}/{len(faults)}; healthy steps "
             f"{len(healthy)}, with an error-level finding: {sum(r['errors'] > 0 for r in healthy)}", "",
             *[f"healthy with an error: {_describe(r['config'])} → {r.get('error_codes', r['codes'])}"
               for r in healthy if r["errors"]],
             *[f"not scored (the fault changed nothing this loop recorded): {r['fault']} in {_shape(r['config'])}"
               for r in ineffective], "",
             "| fault | loop | phase broken | first disagreeing phase | top finding | top-1 | top-3 |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['fault']} | {_short_shape(r['config'])} | {r['expected_phase']} | {r['first_phase'] or '—'} | "
              f"{r['codes'][0] if r['codes'] else '—'} | {'✓' if r['top1'] else '✗'} | {'✓' if r['top3'] else '✗'} |"
              for r in faults]
    by_phase = [(p, [r for r in faults if r["expected_phase"] == p]) for p in PHASES]
    lines += ["", "Per family of faults (the phase they break; no check has a threshold fitted to a family, so "
                  "leaving one out changes no check): top-1 / first phase right", "",
              "| family | faults | top-1 | first phase right |", "|---|---|---|---|"]
    lines += [f"| {p} | {len(rs)} | {sum(r['top1'] for r in rs)}/{len(rs)} | "
              f"{sum(r['first_phase'] == p for r in rs)}/{len(rs)} |" for p, rs in by_phase if rs]
    conf = Counter((r["expected_phase"], r["first_phase"] or "none") for r in faults)
    cols = [p for p in PHASES] + ["none"]
    lines += ["", "Confusion (rows: the phase the fault broke; columns: the first phase the replay found "
                  "disagreeing):", "", "| broken \\ found | " + " | ".join(cols) + " |",
              "|---|" + "---|" * len(cols)]
    lines += [f"| {p} | " + " | ".join(str(conf.get((p, q), 0) or "") for q in cols) + " |" for p in PHASES]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.lab.replay_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="reports/replay_bench", help="folder for results.jsonl and table.md")
    ap.add_argument("--fault", action="append", help="only these faults (repeatable); default: all")
    ap.add_argument("--heldout", action="store_true", help="the faults written after the named checks were frozen")
    ap.add_argument("--frozen", action="store_true", help="the faults written after the generic fits were frozen")
    ap.add_argument("--no-healthy", action="store_true", help="skip the healthy steps")
    ap.add_argument("--shaped", action="store_true", help="also run each fault in a loop of another shape (μ, "
                                                          "micro-batches, sampler copy, scheduler, masking)")
    ap.add_argument("--table", action="store_true", help="only re-render table.md from the folder's results.jsonl")
    a = ap.parse_args(argv)
    if a.table:
        rows = read_rows(Path(a.out) / "results.jsonl")
        (Path(a.out) / "table.md").write_text(table(rows))
        print(table(rows))
        return 0
    from rookworld_debug.lab.handloop import FROZEN_FAULTS, HELDOUT_FAULTS
    faults = a.fault or (list(FROZEN_FAULTS) if a.frozen else list(HELDOUT_FAULTS) if a.heldout else None)
    rows = run_all(Path(a.out), faults, *(((), ()) if a.no_healthy else
                                          (HEALTHY + SHAPES + DECLARATION_VARIANTS, OTHER_HEALTHY)),
                   shaped=a.shaped)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
