"""Fault-injection benchmark of the diagnosis checks: inject a fault the way a user's bug would occur, run real
steps of the embedded tiny model, and ask whether the checks name it.

    python -m rookworld_debug.lab.faults --out runs/fault-bench          # all cases (resumable), then the table
    python -m rookworld_debug.lab.faults --out runs/fault-bench --table  # the table from the saved results only

Cases: each step fault × 3 seeds through `run_step` (a config setting, a model loaded wrong, a reward function
with a bug, a scoring forward patched), each TRL fault × 3 seeds through TRL's GRPOTrainer (its own GRPOConfig or
a patched trainer; `faults_trl.py`), and healthy controls (varied β, learning rate, loss type, G, task).
A fault counts only when it changed the run measurably against the same case without it (same seed): the
sampled ids, rewards, log-probs, advantages, loss or gradient norm differ; otherwise it is reported as inert.
Results: one JSON line per case in OUT/results.jsonl (a finished case is never rerun), OUT/table.md.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

from rookworld_debug.lab.fault_kinds import BASE, P_TASK, SEEDS, Fault  # noqa: F401 - part of this module's API


# ------------------------------------------------------------------------------------------ injections
def _dropout(s):
    import torch
    for m in s.policy.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.1
    s.policy.train()
    return contextlib.nullcontext()


def _reference_other(s):
    import torch
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in s.reference.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * float(p.float().std() if p.numel() > 1 else 0.0))
    return contextlib.nullcontext()


def _reference_bf16(s):
    import torch
    s.reference.to(torch.bfloat16)
    return contextlib.nullcontext()


def _no_temperature(s):
    from unittest import mock

    from rookworld_debug.grpo.phases import scoring
    orig = scoring._iter_tempered_logits

    def untempered(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperatures, chunk):
        return orig(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                    temperatures * 0 + 1.0, chunk)
    return mock.patch.object(scoring, "_iter_tempered_logits", untempered)


def _position_ids(s):
    from unittest import mock

    import torch

    from rookworld_debug.grpo.phases import scoring

    def positions(attention_mask):                   # the bug: count from the first column, pads included
        return torch.arange(attention_mask.shape[1]).expand_as(attention_mask).contiguous()
    return mock.patch.object(scoring, "_position_ids", positions)


def _pad_in_mask(s):
    from unittest import mock

    from rookworld_debug.grpo.phases import generation as gen
    orig = gen._cut_after_eos

    def cut(generated, eos_id, pad_id):
        ids, mask, has_eos = orig(generated, eos_id, pad_id)
        return ids, mask.new_ones(mask.shape), has_eos  # the bug: every position of the padded block trains
    return mock.patch.object(gen, "_cut_after_eos", cut)


def _const_reward(seed):
    return {"mine": lambda prompts, completions, **kw: [0.5] * len(completions)}, {"rookworld": 0.0, "mine": 1.0}


def _prompt_reward(seed):
    return ({"mine": lambda prompts, completions, **kw: [(len(p) % 7) / 7 for p in prompts]},
            {"rookworld": 0.0, "mine": 1.0})


def _random_reward(seed):
    import random
    rng = random.Random(seed)
    return {"mine": lambda prompts, completions, **kw: [rng.random() for _ in completions]}, {"rookworld": 0.0, "mine": 1.0}


def _h(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def _jitter(scale):
    def make(seed):
        return {"jitter": lambda prompts, completions, **kw: [scale * _h(c) for c in completions]}, None
    return make


def _inf_reward(seed):
    def f(prompts, completions, **kw):
        return [-math.inf if len(c) % 2 else 0.0 for c in completions]
    return {"mine": f}, None


STEP_FAULTS = (
    Fault("dropout", frozenset({"dropout_active"}), "policy loaded with dropout 0.1 (the hub config) and left in "
          "train mode", patch=_dropout),
    Fault("reference_other_weights", frozenset({"reference_not_start"}), "reference loaded from other weights "
          "(every tensor + 5 % of its std of noise)", patch=_reference_other),
    Fault("reference_bf16", frozenset({"reference_precision"}), "reference cast to bfloat16, policy float32",
          patch=_reference_bf16),
    Fault("temperature_not_applied", frozenset({"temperature_not_applied"}), "scoring forward patched to skip "
          "logits ÷ T (sampling at T = 0.6)", base={"a_temperature": 0.6, "p_temperature": 0.6},
          patch=_no_temperature),
    Fault("position_ids", frozenset({"position_ids_left_pad"}), "scoring forward's position ids count the left "
          "padding", base={"task": "mixed"}, patch=_position_ids),
    Fault("pad_in_mask", frozenset({"pad_in_mask", "tokens_after_eos_trained"}), "completion mask not cut at EOS "
          "(padding trained)", patch=_pad_in_mask),
    Fault("sampler_bf16", frozenset({"sampler_precision", "sampler_trainer_mismatch"}), "sampler in bf16 autocast, "
          "trainer float32, no importance-sampling correction", config={"sampling_autocast": "bf16"}),
    Fault("temperature_low", frozenset({"temperature_too_low"}), "sampling temperature 0.05",
          config={"a_temperature": 0.05, "p_temperature": 0.05}),
    Fault("reward_constant", frozenset({"reward_ignores_completion"}), "reward function returns a constant",
          base=P_TASK, rewards=_const_reward),
    Fault("reward_prompt_only", frozenset({"reward_ignores_completion"}), "reward function reads the prompt only",
          base=P_TASK, rewards=_prompt_reward),
    Fault("reward_random", frozenset({"reward_not_deterministic", "update_mostly_noise"}), "reward function "
          "returns random numbers", base={"diagnostics": True}, rewards=_random_reward),
    Fault("all_truncated", frozenset({"all_truncated"}), "max_new_tokens = 12 (completions need ~55)",
          config={"max_new_tokens": 12}),
    Fault("budget_short", frozenset({"truncation", "all_truncated"}), "max_new_tokens = 52, just under the "
          "longest completions", config={"max_new_tokens": 52}),
    Fault("reward_jitter", frozenset({"tiny_sigma_groups", "std_floor_blowup"}), "reward + a completion-dependent "
          "jitter of 0.01 (tie-breaking noise)", base=P_TASK, rewards=_jitter(0.01)),
    Fault("std_floor_removed", frozenset({"std_floor_blowup", "tiny_sigma_groups"}), "adv_eps = 1e-12 with rewards "
          "that differ in the 9th digit", config={"adv_eps": 1e-12}, base=P_TASK, rewards=_jitter(1e-9)),
    Fault("reward_inf", frozenset({"unscorable_rows"}), "reward function returns −inf for some completions",
          rewards=_inf_reward),
    Fault("kl_dominates", frozenset({"kl_dominates"}), "β = 20 on a policy drifted by 2 warm-up steps at lr 1e-3",
          config={"beta": 20.0}, base={**P_TASK, "task": "mixed", "warmup_steps": 2, "warmup_lr": 1e-3}),
    Fault("lr_too_large", frozenset({"lr_too_large", "non_finite"}), "learning rate 3e-3 (300× the case's)",
          config={"lr": 3e-3}, base=P_TASK),
    Fault("grad_clip_tiny", frozenset({"grad_clip_binding"}), "max_grad_norm = 1e-4", config={"max_grad_norm": 1e-4},
          base=P_TASK),
    Fault("entropy_bonus", frozenset({"entropy_runaway"}), "entropy bonus coefficient 1.0", config={"entropy_coef": 1.0},
          base=P_TASK),
)

CONTROLS = tuple(
    dict(name=f"control-{i:02d}", **c) for i, c in enumerate((
        {}, {"beta": 0.0}, {"beta": 0.04, "seed": 1}, {"lr": 1e-6}, {"lr": 3e-5, "seed": 2},
        {"loss_type": "grpo"}, {"loss_type": "dr_grpo", "seed": 1}, {"loss_type": "bnpo", "seed": 2},
        {"loss_type": "cispo", "epsilon_high": 5.0}, {"num_generations": 2, "batch_size": 6},
        {"num_generations": 6, "batch_size": 3, "seed": 1}, {"task": "mixed", "max_new_tokens": 160,
                                                              "eval_max_new_tokens": 160},
        {"task": "P", "max_new_tokens": 160, "eval_max_new_tokens": 160, "seed": 1},
        {"task": "mixed", "max_new_tokens": 160, "eval_max_new_tokens": 160, "seed": 2, "beta": 0.0},
        {"seed": 3, "diagnostics": True}, {"seed": 4, "scale_rewards": "batch"}, {"seed": 5, "a_temperature": 1.0},
        {"seed": 6, "loss_type": "sapo"}, {"seed": 7, "num_iterations": 2}, {"seed": 8, "beta": 0.2, "lr": 2e-5},
        {"seed": 9, "loss_type": "dapo", "mask_truncated_completions": True},
    )))


# ------------------------------------------------------------------------------------------ running
def signature(trace) -> dict:
    """What 'the run changed' compares: sampled ids, rewards, log-probs, advantages, loss, gradient norm."""
    r = trace.rollout
    u = trace.update
    def s(x):
        return None if x is None else float(x.double().nan_to_num(0.0).abs().sum())
    return {"ids": hashlib.sha256(r.completion_ids.numpy().tobytes()).hexdigest()[:16],
            "mask": int(r.completion_mask.sum()), "rewards": s(trace.rewards.rewards), "logps": s(r.per_token_logps),
            "ref": s(r.ref_per_token_logps), "sampler": s(r.sampling_per_token_logps),
            "adv": s(trace.advantages.advantages), "loss": float(trace.loss.loss),
            "grad": None if u is None else float(u.grad_norm_pre_clip),
            "dlogp": None if trace.evaluation is None else s(trace.evaluation.delta_logp)}


def changed(a: dict, b: dict) -> list[str]:
    out = []
    for k in a:
        x, y = a[k], b.get(k)
        if isinstance(x, float) and isinstance(y, float):
            if not (math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7) or (math.isnan(x) and math.isnan(y))):
                out.append(k)
        elif x != y:
            out.append(k)
    return out


def run_one(settings: dict, *, patch=None, rewards=None, seed: int = 0):
    """One step of the tiny model under `settings` (StepConfig fields) with an optional injection."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import run_step
    cfg = StepConfig(**{**BASE, **settings, "seed": settings.get("seed", seed)})
    s = setup(cfg)
    funcs, weights = rewards(seed) if rewards else (None, None)
    with (patch(s) if patch else contextlib.nullcontext()):
        return run_step(cfg, session=s, reward_funcs=funcs, reward_weights=weights)


def diagnose_codes(trace, step=0, *, replay: bool = True) -> tuple[list, float, int]:
    """The findings a user gets on the step (`diagnose_step`: the checks and the replay on its kept weights)."""
    from rookworld_debug.diagnosis.registry import diagnose_step, replace_step
    t0 = time.perf_counter()
    found = [replace_step(f, step) for f in diagnose_step(trace, replay=replay)[0]]
    secs = time.perf_counter() - t0
    return [{"code": f.code, "severity": f.severity} for f in found], secs, sum(f.severity == "error" for f in found)


def step_case(fault: Fault, seed: int, twins: dict) -> dict:
    key = json.dumps({**fault.base, "seed": seed}, sort_keys=True)
    t0 = time.perf_counter()
    if key not in twins:      # the same case without the fault (its rewards bug and patch removed)
        twins[key] = signature(run_one(fault.base, seed=seed))
    trace = run_one({**fault.base, **fault.config}, patch=fault.patch, rewards=fault.rewards, seed=seed)
    # the run = what training used: a reward change that leaves the advantages as they were changed nothing
    diff = [k for k in changed(signature(trace), twins[key]) if k != "rewards"]
    codes, secs, errors = diagnose_codes(trace)
    return {"kind": "step", "fault": fault.name, "seed": seed, "accept": sorted(fault.accept), "how": fault.how,
            "effective": bool(diff), "changed": diff, "findings": codes, "first_named_step": 0 if _named(
                codes, fault.accept, 3) else None, "diagnose_seconds": secs, "seconds": time.perf_counter() - t0}


def control_case(ctrl: dict) -> dict:
    t0 = time.perf_counter()
    settings = {k: v for k, v in ctrl.items() if k != "name"}
    trace = run_one(settings, seed=settings.get("seed", 0))
    codes, secs, errors = diagnose_codes(trace)
    return {"kind": "control", "fault": None, "name": ctrl["name"], "settings": settings, "findings": codes,
            "errors": errors, "diagnose_seconds": secs, "seconds": time.perf_counter() - t0}


def _named(codes, accept, k) -> bool:
    return any(c["code"] in accept for c in codes[:k])


def cases(only: Optional[str] = None):
    """(id, runner) for every case: step faults × seeds, TRL faults × seeds, step controls, TRL controls."""
    from rookworld_debug.lab import faults_heldout as H
    from rookworld_debug.lab import faults_trl as T
    twins, trl_twins = {}, {}
    out = [(f"{f.name}/{s}", (lambda f=f, s=s: step_case(f, s, twins))) for f in STEP_FAULTS for s in SEEDS]
    out += [(f"{f.name}/{s}", (lambda f=f, s=s: T.trl_case(f, s, trl_twins))) for f in T.TRL_FAULTS for s in SEEDS]
    out += [(f"{f.name}/{s}", (lambda f=f, s=s: step_case(f, s, twins))) for f in H.HELDOUT_STEP_FAULTS
            for s in SEEDS]
    out += [(f"{f.name}/{s}", (lambda f=f, s=s: T.trl_case(f, s, trl_twins))) for f in H.HELDOUT_TRL_FAULTS
            for s in SEEDS]
    out += [(c["name"], (lambda c=c: control_case(c))) for c in CONTROLS]
    out += [(f"trl-control-{s}", (lambda s=s: T.trl_case(None, s, trl_twins))) for s in SEEDS]
    return [(k, fn) for k, fn in out if only is None or only in k]


def run_all(out: Path, only: Optional[str] = None, progress: bool = True) -> Path:
    import torch
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    res = out / "results.jsonl"
    done = set()
    if res.is_file():
        done = {r["id"] for r in _read_results(res)}
    todo = [(k, fn) for k, fn in cases(only) if k not in done]
    for i, (key, fn) in enumerate(todo):
        t0 = time.perf_counter()
        try:
            rec = fn()
        except Exception as err:  # noqa: BLE001 - a case that crashes is a result (reported), not the end of the run
            rec = {"kind": "crash", "error": f"{type(err).__name__}: {err}"}
        rec["id"] = key
        with open(res, "a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")
        if progress:
            top = (rec.get("findings") or [{}])[0].get("code")
            print(f"[{i + 1}/{len(todo)}] {key}: top={top} effective={rec.get('effective')} "
                  f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    return res


def _is(t):
    """A value of type t (a bool is not an int; an int fits 64 bits)."""
    return lambda v: (isinstance(v, t) and not (isinstance(v, bool) and t is not bool)
                      and not (isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63))


def _num_or_none(v) -> bool:
    return v is None or isinstance(v, float) or _is(int)(v)          # NaN reads back as a float


def _list_of(pred):
    return lambda v: isinstance(v, list) and all(pred(x) for x in v)


def _finding_row(v) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("code"), str) and isinstance(v.get("severity"), str)
            and set(v) <= {"code", "severity", "step"})


# a results line's closed schema: key -> type check (what the cases write; `id` and `kind` are required)
RESULT_FIELDS = {
    "id": _is(str), "kind": lambda v: v in ("step", "trl", "control", "crash"), "fault": lambda v: v is None or
    isinstance(v, str), "seed": _is(int), "name": _is(str), "accept": _list_of(_is(str)), "how": _is(str),
    "effective": _is(bool), "changed": _list_of(_is(str)), "findings": _list_of(_finding_row),
    "first_named_step": lambda v: v is None or _is(int)(v), "errors": _is(int), "settings": _is(dict),
    "error": _is(str), "diagnose_seconds": _num_or_none, "seconds": _num_or_none,
    "per_step": lambda v: isinstance(v, dict) and all(_list_of(_finding_row)(x) for x in v.values()),
    "capture_errors": _is(dict),
    "code_version": _is(str),           # which code a re-run case ran on (a commit, in words)
}


def check_result(rec, where: str) -> dict:
    """One results line through RESULT_FIELDS; DataError naming the line and the first field that does not fit."""
    from rookworld_debug.errors import DataError
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a result is a JSON object, got a {type(rec).__name__}")
    for key in ("id", "kind"):
        if key not in rec:
            raise DataError(f"{where}: the result has no {key!r}")
    for key, v in rec.items():
        ok = RESULT_FIELDS.get(key)
        if ok is None:
            raise DataError(f"{where}: unknown field {str(key)[:60]!r}")
        if not ok(v):
            raise DataError(f"{where}: field {key!r} has the wrong type or value ({str(v)[:60]!r})")
    if rec["kind"] == "crash" and "error" not in rec:
        raise DataError(f"{where}: a crashed case's result has no 'error'")
    if rec["kind"] in ("step", "trl") and rec.get("fault") is not None:
        for key in ("seed", "accept"):
            if key not in rec:
                raise DataError(f"{where}: a faulted case's result has no {key!r}")
    return rec


def load_results(out: Path) -> list[dict]:
    """The saved results (the last line per case id); DataError when there are none or a line that is JSON is
    not a result."""
    from rookworld_debug.errors import DataError
    path = out / "results.jsonl"
    if not path.is_file():
        raise DataError(f"{path} does not exist: no results to tabulate (run the benchmark first)")
    results = _read_results(path)
    if not results:
        raise DataError(f"{path} holds no results")
    return results


def _read_results(path: Path) -> list[dict]:
    """Every result of `path` through its closed schema, the last line per id; a line cut short by an
    interrupted run (not JSON) is skipped."""
    from rookworld_debug.errors import DataError
    by_id = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path} is not readable text ({type(err).__name__})") from None
    for i, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        except RecursionError:
            raise DataError(f"{path}:{i}: nested too deeply to be a result") from None
        rec = check_result(rec, f"{path}:{i}")
        by_id[rec["id"]] = rec
    return list(by_id.values())


def table(results: list[dict]) -> str:
    """The benchmark's Markdown: accuracy, confusion (fault × top finding), controls, first-named step."""
    faults = [r for r in results if r.get("kind") in ("step", "trl") and r.get("fault") is not None]
    eff = [r for r in faults if r.get("effective")]
    inert = [r for r in faults if not r.get("effective")]
    def top(r, k):
        return [c["code"] for c in (r.get("findings") or [])[:k]]
    hit1 = [r for r in eff if set(top(r, 1)) & set(r["accept"])]
    hit3 = [r for r in eff if set(top(r, 3)) & set(r["accept"])]
    ctrls = [r for r in results if r.get("kind") in ("control", "trl") and r.get("fault") is None]
    crashes = [r for r in results if r.get("kind") == "crash"]
    head = (f"Fault types: {len({r['fault'] for r in faults})} "
            f"({len({r['fault'] for r in faults if r['kind'] == 'trl'})} under TRL's GRPOTrainer); cases: "
            f"{len(faults)} faulted, {len(ctrls)} healthy controls" + (f", {len(crashes)} crashed" if crashes else ""))
    lines = [head, "",
             f"- effective faulted cases: {len(eff)} (inert: {len(inert)}, listed below, not counted as misses)",
             f"- top-1 accuracy: {len(hit1)}/{len(eff)} = {len(hit1) / max(len(eff), 1):.1%}",
             f"- top-3 accuracy: {len(hit3)}/{len(eff)} = {len(hit3) / max(len(eff), 1):.1%}",
             f"- error-level findings on healthy controls: {sum(r.get('errors', 0) for r in ctrls)} "
             f"(controls with any: {sum(1 for r in ctrls if r.get('errors'))}/{len(ctrls)})",
             f"- diagnosis time per step: max {max((r.get('diagnose_seconds') or 0) for r in results):.3f} s", "",
             "| fault | kind | accepted diagnoses | effective | top-1 per seed | top-1 hits | top-3 hits | first named at step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in dict.fromkeys(r["fault"] for r in faults):
        rs = sorted((r for r in faults if r["fault"] == name), key=lambda r: r["seed"])
        e = [r for r in rs if r.get("effective")]
        lines.append(f"| {name} | {rs[0]['kind']} | {', '.join(rs[0]['accept'])} | {len(e)}/{len(rs)} | "
                     f"{', '.join((top(r, 1) or ['—'])[0] for r in rs)} | {sum(r in hit1 for r in e)}/{len(e)} | "
                     f"{sum(r in hit3 for r in e)}/{len(e)} | "
                     f"{', '.join(str(r.get('first_named_step')) for r in rs)} |")
    lines += ["", "Healthy controls (top finding; error-level count):", "",
              "| control | settings | top finding | errors |", "| --- | --- | --- | --- |"]
    for r in ctrls:
        lines.append(f"| {r.get('name')} | {json.dumps(r.get('settings', {}))} | "
                     f"{(top(r, 1) or ['none'])[0]} | {r.get('errors', 0)} |")
    from rookworld_debug.lab.faults_heldout import heldout_report
    lines += heldout_report(results)
    if inert:
        lines += ["", "Inert cases (the fault did not change the run): " +
                  ", ".join(f"{r['fault']}/{r['seed']}" for r in inert)]
    if crashes:
        lines += ["", "Crashed cases: " + "; ".join(f"{r['id']}: {r['error']}" for r in crashes)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rookworld_debug.lab.faults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/fault-bench")
    ap.add_argument("--only", default=None, help="run only the cases whose id contains this text")
    ap.add_argument("--table", action="store_true", help="print the table from the saved results; run nothing")
    a = ap.parse_args(argv)
    from rookworld_debug.errors import RookWorldError
    try:
        return _main(a)
    except RookWorldError as err:
        print(f"python -m rookworld_debug.lab.faults: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


def _main(a) -> int:
    """Every argument checked before any case runs."""
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.safeio import check_output_dir
    out = check_output_dir(a.out, "--out")
    if a.only is not None and not any(a.only in k for k, _ in cases()):
        raise ConfigError("--only", f"no case id contains {a.only!r} (ids look like 'dropout/0', 'trl-control-1')")
    if not a.table:
        run_all(out, a.only)
    text = table(load_results(out))
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
