"""Fuzzing triage's input files: seeded mutations of a run's trainer_state.json and captures.json (values
swapped for NaN/±inf, huge or negative numbers, wrong types, hostile strings and paths, record-like objects;
keys deleted, lists duplicated and shuffled, deep nesting; truncated, bit-flipped, non-UTF-8 text). On each,
triage reads the run and builds every part of its page: nothing but the project's named errors escapes, the
page's JSON is strict, and no canary file is created. 200 mutations in the default run, 2,000 in the slow one."""
from __future__ import annotations

import copy
import json
import math
import random
import shutil
import traceback
from pathlib import Path

import pytest

from rookworld_debug.errors import RookWorldError

HOSTILE = '<img src=x onerror="alert(1)"> $(touch {c}) `touch {c}` \'; touch {c}; \' {{7*7}} %s%n'


def _atoms(canary: Path) -> list:
    h = HOSTILE.replace("{c}", str(canary))
    return [math.nan, math.inf, -math.inf, 0, -1, -(2 ** 31), 2 ** 31, 2 ** 63, 10 ** 400, 1e308, -0.0, 0.5, True,
            False, None, "", "NaN", "Infinity", "-Infinity", "1e999", h, "../../../../etc", "/etc", "a\x00b",
            "x" * 5000, "step-000001", f"step-000001; touch {canary}", "\ud800", [], {}, [1, 2, 3], {"step": 1},
            {"__record__": "os:system", "fields": {"command": f"touch {canary}"}}, {"__tensor__": "x"},
            {"__float__": "nan"}, {"__dict__": [[h, 1]]}]


def _seed_state() -> dict:
    hist = [{"step": s, "loss": 0.1 * s, "reward": 0.5, "reward_std": 0.1, "kl": 0.01 * s, "entropy": 1.2,
             "grad_norm": 0.4, "learning_rate": 1e-5, "clip_ratio/region_mean": 0.0, "frac_reward_zero_std": 0.25,
             "completions/mean_length": 30.0, "completions/clipped_ratio": 0.1, "epoch": 0.1 * s}
            for s in range(1, 13)]
    hist[8]["kl"] = 5.0                                              # a jump: the triggers fire
    return {"global_step": 12, "log_history": hist + [{"step": 12, "train_loss": 0.3}], "max_steps": 12}


def _seed_index() -> dict:
    return {"format": 1, "keep_last": 3, "every": None, "steps": [], "triggers": ["kl"],
            "captures": [{"step": s, "path": f"step-{s:06d}", "reasons": [{"trigger": "kl", "value": 5.0}],
                          "error": None, "written_at": "2026-01-01T00:00:00"} for s in (7, 8, 9)]}


def _nodes(obj, path=()):
    yield path, obj
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            yield from _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, path + (i,))


def _set(root, path, value):
    if not path:
        return value
    node = root
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return root


def _mutate_tree(obj, rng: random.Random, atoms: list):
    for _ in range(rng.randint(1, 4)):
        nodes = list(_nodes(obj))
        path, node = rng.choice(nodes)
        op = rng.randrange(7)
        if op == 0:
            obj = _set(obj, path, copy.deepcopy(rng.choice(atoms)))
        elif op == 1 and isinstance(node, dict) and node:
            del node[rng.choice(list(node))]
        elif op == 2 and isinstance(node, list) and node:
            node.insert(rng.randrange(len(node) + 1), json.loads(json.dumps(rng.choice(node))))
        elif op == 3 and isinstance(node, list):
            rng.shuffle(node)
        elif op == 4:
            deep = node
            for _ in range(rng.choice((5, 50, 200))):
                deep = [deep] if rng.random() < 0.5 else {"log_history": deep}
            obj = _set(obj, path, deep)
        elif op == 5 and isinstance(node, dict):
            node[rng.choice(["step", "loss", "kl", "path", "captures", "log_history", HOSTILE])] = copy.deepcopy(rng.choice(atoms))
        else:
            obj = _set(obj, path, copy.deepcopy(rng.choice(atoms)))
    return obj


def _text(obj, rng: random.Random) -> bytes:
    data = json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")
    op = rng.randrange(10)
    if op == 0:
        return data[: rng.randrange(len(data) + 1)]                   # truncated (a run still writing)
    if op == 1 and data:
        i = rng.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    if op == 2:
        return b"[" * 100_000 + b"]" * 100_000                         # deeper than any parser's recursion
    if op == 3:
        return b"\xef\xbb\xbf" + data                                  # a BOM
    if op == 4:
        return b"\xff\xfe" + data[:50]                                 # not UTF-8
    return data


def _run_folder(base: Path) -> Path:
    """A run folder whose three captured steps open (trace.json + a real safetensors file)."""
    import torch
    from safetensors.torch import save_file
    run = base / "run"
    for s in (7, 8, 9):
        d = run / "captures" / f"step-{s:06d}"
        d.mkdir(parents=True)
        metrics = {"__dict__": [["loss", 0.5], ["kl", {"__float__": "inf"}], ["reward", 0.1]]}
        (d / "trace.json").write_text(json.dumps({"__record__": "rookworld_debug.grpo.step:StepTrace", "fields": {
            "version": 1, "capture": {"__record__": "rookworld_debug.grpo.trace.captured:TRLCapture",
                                      "fields": {"logged_metrics": metrics}}}}))
        save_file({"x": torch.zeros(2)}, str(d / "trace.safetensors"))
    return run


def _triage_once(run: Path, figure: bool) -> str:
    from rookworld_debug.report import triage_view
    from rookworld_debug.report.triage_build import build_triage
    from rookworld_debug.safeio import to_jsonable
    try:
        t = build_triage(run)
    except RookWorldError:
        return "named error"
    t = json.loads(json.dumps(to_jsonable(t), allow_nan=False))      # what triage.json holds (strict JSON)
    triage_view.header_lines(t)
    for html in (triage_view.flagged_table_html(t), triage_view.trend_table_html(t)):
        assert "<img" not in html and "onerror=\"" not in html
    if figure:
        triage_view.curves_figure(t)
    return "page"


def _fuzz(tmp_path: Path, n: int, seed: int, figure_every: int) -> dict:
    canary = tmp_path / "CANARY"
    run = _run_folder(tmp_path)
    atoms = _atoms(canary)
    rng = random.Random(seed)
    outcomes: dict = {}
    for i in range(n):
        for name in ("trainer_state.json", "checkpoint-3"):
            p = run / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        which = rng.randrange(4)                  # 0 state only, 1 index only, 2 both, 3 both + no top-level state
        state, index = _seed_state(), _seed_index()
        if which in (0, 2, 3):
            state = _mutate_tree(state, rng, atoms)
        if which in (1, 2, 3):
            index = _mutate_tree(index, rng, atoms)
        target = run / "checkpoint-3" / "trainer_state.json" if which == 3 else run / "trainer_state.json"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(_text(state, rng))
        (run / "captures" / "captures.json").write_bytes(_text(index, rng))
        try:
            got = _triage_once(run, figure=i % figure_every == 0)
        except Exception:  # noqa: BLE001 - the failure report: which mutation, what escaped
            pytest.fail(f"mutation {i} (seed {seed}) escaped:\n{traceback.format_exc()}\nstate: "
                        f"{target.read_bytes()[:600]!r}\nindex: {(run / 'captures' / 'captures.json').read_bytes()[:600]!r}")
        outcomes[got] = outcomes.get(got, 0) + 1
    assert not canary.exists(), "a mutation made triage run a command"
    return outcomes


def test_fuzz_triage_inputs_default_run(tmp_path):
    out = _fuzz(tmp_path, 200, seed=1, figure_every=10)
    assert sum(out.values()) == 200 and out.get("page", 0) >= 100, out    # most mutations still give a page


@pytest.mark.slow
def test_fuzz_triage_inputs_2000(tmp_path):
    out = _fuzz(tmp_path, 2000, seed=2, figure_every=5)
    assert sum(out.values()) == 2000 and out.get("page", 0) >= 1000, out
