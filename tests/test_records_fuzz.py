"""Fuzzing every record diagnose, whatif and resume read from disk: seeded mutations (the triage fuzz's kit: values
swapped for NaN/±inf, huge or negative numbers, wrong types, hostile strings, record-like objects; keys deleted,
lists duplicated and shuffled, deep nesting; truncated, bit-flipped, non-UTF-8 text) of trainer_state.json,
table.csv, captures.json, a run_steps checkpoint's state.json and finding dicts. On each, only the project's named
errors escape, `diagnose --json`'s payload stays strict ASCII JSON, and no canary file appears.
250 mutations in the default run, 2,500 in the slow one (counts in the terminal summary)."""
from __future__ import annotations

import dataclasses
import json
import random
import shutil
import traceback
from pathlib import Path

import pytest
from test_triage_fuzz import _atoms, _mutate_tree, _run_folder, _seed_index, _seed_state, _text

from rookworld_debug.errors import RookWorldError

KINDS = ("trainer_state.json", "table.csv", "captures.json", "checkpoint state.json", "finding dict")


def _diagnose_json(path) -> str:
    """What `diagnose PATH --json` prints, or "named error"."""
    from rookworld_debug.cli_diagnose import printable
    from rookworld_debug.diagnosis import diagnose_path
    try:
        found = diagnose_path(path)
    except RookWorldError:
        return "named error"
    text = json.dumps({"path": printable(str(path)), "findings": [f.to_dict() for f in found]}, ensure_ascii=True)
    text.encode("ascii")
    json.loads(text)
    return "findings"


def _table_text(rng: random.Random, atoms: list) -> bytes:
    head = ["step", "rollout_reward", "kl", "entropy", "grad_norm_pre_clip", "lr", "loss", "frac_reward_zero_std"]
    rows = [[str(k), "0.5", "0.01", "1.0", "0.3", "1e-05", "0.1", "0.25"] for k in range(12)]
    for _ in range(rng.randint(1, 4)):
        r, c = rng.randrange(len(rows)), rng.randrange(len(head))
        rows[r][c] = str(rng.choice(atoms + ["9" * 401, "1e999", "-", "x" * 200_000, "\xff", "\u2028", '"', ","]))
    if rng.random() < 0.2:
        head[rng.randrange(len(head))] = rng.choice(["", "step", "\x00", "kl"])
    text = "\n".join(",".join(x) for x in [head, *rows]).encode("utf-8", "surrogatepass")
    op = rng.randrange(6)
    if op == 0:
        return text[: rng.randrange(len(text) + 1)]
    if op == 1:
        i = rng.randrange(len(text))
        return text[:i] + bytes([text[i] ^ (1 << rng.randrange(8))]) + text[i + 1:]
    if op == 2:
        return b"\xff\xfe" + text
    return text


def _seed_checkpoint() -> dict:
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.multistep.schedules import BetaSchedule, LRSchedule
    rows = [{"step": k, "epoch": k, "cursor": 0, "batch_indices": "[0, 1]", "batch_hash": "ab", "n_prompts": 2,
             "seed": 3, "beta": 0.04, "lr": 1e-5, "loss": 0.1, "kl": float("nan"), "updated": True,
             "sec/rollout": 0.5} for k in range(2)]
    return {"version": 1, "next_step": 2, "completed_steps": 2, "steps": 4, "mode": "overfit_single_batch",
            "config": StepConfig().to_dict(), "beta_schedule": dataclasses.asdict(BetaSchedule(target=0.04)),
            "lr_schedule": dataclasses.asdict(LRSchedule()), "beta_state": {"value": 0.04, "history": []},
            "cursor_order": [0, 1], "cursor_next": [0, 0], "rows": rows,
            "per_prompt": [{"step": 0, "slot": 0, "dataset_index": 0, "prompt": "P: x", "reward_before": 0.5}],
            "saved_at": "2026-01-01T00:00:00"}


def _seed_finding() -> dict:
    return {"code": "lr_too_large", "title": "t", "severity": "error", "cause": "c",
            "evidence": [{"name": "kl", "value": 5.0, "definition": "d", "batch": "run log", "where": "w"},
                         {"name": "x", "value": "nan", "definition": "", "batch": "", "where": ""}],
            "fix": {"description": "d", "step_config": {"lr": 1e-5}, "grpo_config": {"learning_rate": 1e-5},
                    "code_change": None}, "alternatives": ["grad_norm_spikes"], "score": 9.0, "step": 8}


def _checkpoint_once(folder: Path) -> str:
    from rookworld_debug.grpo.multistep.checkpoint import built, read_state
    try:
        built(read_state(folder), folder)
    except RookWorldError:
        return "named error"
    return "accepted"


def _finding_once(d) -> str:
    from rookworld_debug.diagnosis import Finding
    from rookworld_debug.viz import diagnosis_card
    try:
        f = Finding.from_dict(d)
    except RookWorldError:
        html = diagnosis_card([d]).html                     # the card flags it, never crashes
        assert "unreadable_finding" in html and "<img" not in html
        return "named error"
    json.loads(json.dumps(f.to_dict(), allow_nan=False))
    assert "<img" not in diagnosis_card([f]).html
    return "accepted"


def _one(kind: str, run: Path, rng: random.Random, atoms: list) -> str:
    """One mutation of `kind`; the log kinds go to a run folder without captures (a run's log alone), captures.json
    to the one whose captured steps are stand-ins (each that the index names is refused as a trace)."""
    log = run.parent / "log"
    log.mkdir(exist_ok=True)
    for folder in (run, log):
        for name in ("trainer_state.json", "table.csv"):
            (folder / name).unlink(missing_ok=True)
    if kind == "trainer_state.json":
        (log / "trainer_state.json").write_bytes(_text(_mutate_tree(_seed_state(), rng, atoms), rng))
        return _diagnose_json(log)
    if kind == "table.csv":
        (log / "table.csv").write_bytes(_table_text(rng, atoms))
        return _diagnose_json(log)
    if kind == "captures.json":
        (run / "trainer_state.json").write_text(json.dumps(_seed_state()))
        (run / "captures" / "captures.json").write_bytes(_text(_mutate_tree(_seed_index(), rng, atoms), rng))
        return _diagnose_json(run)
    if kind == "checkpoint state.json":
        (run / "ckpt").mkdir(exist_ok=True)
        (run / "ckpt" / "state.json").write_bytes(_text(_mutate_tree(_seed_checkpoint(), rng, atoms), rng))
        return _checkpoint_once(run / "ckpt")
    return _finding_once(_mutate_tree(_seed_finding(), rng, atoms))


def _fuzz(tmp_path: Path, per_kind: int, seed: int, counts: dict) -> dict:
    canary = tmp_path / "CANARY"
    run = _run_folder(tmp_path)
    atoms = _atoms(canary)
    rng = random.Random(seed)
    outcomes: dict = {}
    for i in range(per_kind * len(KINDS)):
        kind = KINDS[i % len(KINDS)]
        try:
            got = _one(kind, run, rng, atoms)
        except Exception:  # noqa: BLE001 - the failure report: which mutation, what escaped
            pytest.fail(f"mutation {i} of {kind} (seed {seed}) escaped:\n{traceback.format_exc()}")
        outcomes.setdefault(kind, {}).setdefault(got, 0)
        outcomes[kind][got] += 1
        label = f"diagnose/whatif records: {kind}"
        counts[label] = counts.get(label, 0) + 1
    assert not canary.exists(), "a mutation made a reader run a command"
    shutil.rmtree(run, ignore_errors=True)
    return outcomes


def _check(out: dict, per_kind: int) -> None:
    assert set(out) == set(KINDS) and all(sum(v.values()) == per_kind for v in out.values()), out
    for kind, v in out.items():                 # both branches are exercised: records still read after mutation
        read = v.get("findings", 0) + v.get("accepted", 0)
        assert read >= (per_kind // 5 if kind in ("trainer_state.json", "table.csv") else 1), (kind, v)


def test_fuzz_records_default_run(tmp_path, fuzz_counts):
    _check(_fuzz(tmp_path, 50, seed=11, counts=fuzz_counts), 50)


@pytest.mark.slow
def test_fuzz_records_2500(tmp_path, fuzz_counts):
    out = _fuzz(tmp_path, 500, seed=12, counts=fuzz_counts)
    print(json.dumps(out, indent=1))
    _check(out, 500)
