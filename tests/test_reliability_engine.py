"""Engine faults: a Stockfish killed mid-batch, a missing binary, an engine never closed.

(`tests/test_engine.py::test_killed_engine_is_restarted_and_the_batch_completes` covers the same crash at
the `analyse_many` level; here it is asserted where it matters: the REWARDS of `score_p_batch`.)
"""
from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rookworld_debug.chess import rewards as R
from rookworld_debug.chess.engine import Engine
from rookworld_debug.chess.formats import parse_p, split_p
from rookworld_debug.config import StepConfig
from tinymodels import tiny_step_config
from rookworld_debug.errors import EngineNotFound

REPO = Path(__file__).resolve().parents[1]
DEPTH, MULTIPV = 4, 5


@pytest.fixture(scope="module")
def batch(fixtures_dir):
    """24 real P: rows (prompt, completion, label) + near-miss completions, so the batch needs both root
    searches (multipv 5) and after-move searches (multipv 1)."""
    lines = [x for x in (fixtures_dir / "rook_p_lines.txt").read_text().splitlines() if x.strip()][:12]
    rows = [(*split_p(x), parse_p(x)) for x in lines]
    rng = random.Random(0)
    prompts, completions, labels = [], [], []
    for prompt, completion, label in rows:
        moves = completion.split("M:")[1].split("E:")[0].split()
        rng.shuffle(moves)
        shuffled = completion.split("M:")[0] + "M: " + " ".join(moves) + " E:" + completion.split("E:")[1]
        for c in (completion, shuffled):
            prompts.append(prompt), completions.append(c), labels.append(label)
    return prompts, completions, labels


@pytest.fixture(scope="module")
def undisturbed(batch):
    with Engine(depth=DEPTH, multipv=MULTIPV, workers=1, cache=False) as e:
        return R.score_p_batch(*batch[:2], e, batch[2])


def _kill_during(engine: Engine, which: str, at: int):
    """Wrap the engine's per-position search so that when search number `at` starts, `which` engine
    process(es) get SIGKILL ('one' = the first worker, 'all' = every running worker)."""
    search, started = engine._search, itertools.count()
    killed: list[int] = []

    def search_then_kill(key):
        if next(started) == at:
            victims = engine.pids()[:1] if which == "one" else engine.pids()
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return search(key)

    engine._search = search_then_kill
    return killed


@pytest.mark.parametrize("which,workers", [("one", 2), ("all", 2), ("all", 1)])
def test_killed_stockfish_mid_batch_gives_identical_rewards(batch, undisturbed, which, workers):
    prompts, completions, labels = batch
    with Engine(depth=DEPTH, multipv=MULTIPV, workers=workers) as e:
        killed = _kill_during(e, which, at=5)
        got = R.score_p_batch(prompts, completions, e, labels)
        assert killed and e.stats.restarts >= 1, "the fault was not injected"
        assert not set(killed) & set(e.pids()), "dead processes still in the pool"
        assert got == undisturbed                                  # every total, component, flag, detail
        # the healed pool keeps working (and the cache holds the same answers)
        assert R.score_p_batch(prompts, completions, e, labels) == undisturbed


def test_missing_binary_is_engine_not_found_up_front_from_setup_and_run_step(monkeypatch, tmp_path):
    """reward_mode='engine' with a P: batch and no Stockfish: EngineNotFound from setup()/run_step before any
    model is loaded (so a big model is never loaded for nothing)."""
    from rookworld_debug.grpo.multistep import start as setup_mod
    from rookworld_debug.grpo.step import run_step
    import rookworld_debug.models as models

    monkeypatch.setenv("ROOKWORLD_STOCKFISH", str(tmp_path / "no-such-stockfish"))

    def must_not_load(*a, **k):
        raise AssertionError("the model was loaded before the engine check")

    monkeypatch.setattr(models, "load_policy_and_reference", must_not_load)
    cfg = StepConfig(reward_mode="engine", task="P", batch_size=2, num_generations=2, max_new_tokens=8)
    for call in (lambda: setup_mod.setup(cfg), lambda: run_step(cfg)):
        t0 = time.perf_counter()
        with pytest.raises(EngineNotFound) as e:
            call()
        assert "no-such-stockfish" in str(e.value)
        assert time.perf_counter() - t0 < 30
    # an explicit path to a missing binary fails the same way
    with pytest.raises(EngineNotFound):
        Engine(path=str(tmp_path / "nope"))


def test_missing_binary_with_dataset_mode_runs_on_ground_truth(monkeypatch, tiny_byte_model_dir):
    """reward_mode='dataset' never needs the engine: a full step runs with labels as ground truth."""
    from rookworld_debug.grpo.step import run_step

    monkeypatch.setenv("ROOKWORLD_STOCKFISH", "/nonexistent/stockfish")
    cfg = tiny_step_config(tiny_byte_model_dir, top_k_alternatives=2)
    trace = run_step(cfg)
    assert trace.setup.engine is None and trace.setup.provenance["engine"] is None
    assert trace.rewards.reward_mode == "dataset" and trace.rewards.engine_stats == {}
    assert {b.kind for b in trace.rewards.breakdowns} == {"p_dataset"}
    assert trace.update is not None


def test_a_only_batch_needs_no_engine_even_in_engine_mode(monkeypatch, tiny_byte_model_dir):
    from rookworld_debug.grpo.multistep.start import setup

    monkeypatch.setenv("ROOKWORLD_STOCKFISH", "/nonexistent/stockfish")
    s = setup(tiny_step_config(tiny_byte_model_dir, reward_mode="engine", task="A"))
    assert s.engine is None


def test_unclosed_engine_does_not_hang_interpreter_exit():
    """Regression: python-chess runs each engine on a non-daemon thread, so a script that forgot
    Engine.close() (e.g. `rookworld-debug step`, which never closes the engine run_step created) hung
    forever at exit. Engines still open are now closed before Python joins its threads."""
    code = textwrap.dedent("""
        from rookworld_debug.chess.engine import Engine
        e = Engine(depth=1, multipv=2, workers=2)
        e.analyse_many(["rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
                        "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"])
        print("pids", *e.pids())
    """)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert time.perf_counter() - t0 < 30
    pids = [int(p) for p in out.stdout.split()[1:]]
    time.sleep(0.2)
    for pid in pids:                                               # and the Stockfish processes are gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text(), f"stockfish {pid} still alive"


def test_closed_engine_refuses_new_searches_instead_of_leaking_processes():
    from rookworld_debug.errors import EngineError
    start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    e = Engine(depth=1, multipv=2, workers=1)
    first = e.analyse(start)
    e.close()
    assert e.analyse(start) == first                               # cached answers still served
    with pytest.raises(EngineError, match="closed"):
        e.analyse("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1")
    assert e.pids() == []


def test_step_cli_reports_a_missing_engine_and_exits_2(monkeypatch, capsys, tmp_path):
    from rookworld_debug.cli import main

    monkeypatch.setenv("ROOKWORLD_STOCKFISH", str(tmp_path / "missing-sf"))
    assert main(["step", "--set", "reward_mode=engine", "--set", "task=P", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "EngineNotFound" in err and "missing-sf" in err
    assert not (tmp_path / "out").exists()


def _stockfish_children() -> list:
    import psutil
    return [p for p in psutil.Process().children(recursive=True) if "stockfish" in (p.name() or "")]


def _slowest_start_up(n: int = 3) -> float:
    """Seconds of the slowest of `n` engine start-ups (start, configure) on this machine, now."""
    from rookworld_debug.chess.engine import _Worker
    with Engine(depth=DEPTH, multipv=MULTIPV, workers=1, cache=False) as probe:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            worker = _Worker(probe.path, probe.uci_options)
            times.append(time.perf_counter() - t0)
            worker.close()
    return max(times)


def test_engine_under_fire_same_rewards_and_no_process_outlives_close(batch, undisturbed):
    """Every Stockfish child is SIGKILLed every `period` s (also during start-ups and restarts) while a
    batch is scored several times; the rewards equal the undisturbed run's, and after close() no engine
    process of ours is alive. The period is 0.7 s, or three times the slowest start-up measured just before on
    a loaded machine, whichever is longer: a killer faster than a start-up kills every start-up, and no engine
    could start at all (about one start-up in three is still hit)."""
    import threading

    prompts, completions, labels = batch
    period = max(0.7, 3 * _slowest_start_up())
    stop, kills = threading.Event(), []

    def killer():
        while not stop.wait(period):
            for p in _stockfish_children():
                try:
                    p.kill()
                    kills.append(p.pid)
                except Exception:
                    pass

    t = threading.Thread(target=killer, daemon=True)
    with Engine(depth=DEPTH, multipv=MULTIPV, workers=2, cache=False) as e:
        t.start()
        try:
            deadline = time.time() + max(6, 4 * period)
            while time.time() < deadline:          # long enough for several kills, some during start-ups
                assert R.score_p_batch(prompts, completions, e, labels) == undisturbed
        finally:
            stop.set()
            t.join()
        restarts = e.stats.restarts
    print(f"\nkill period {period:.2f} s: {len(kills)} kills, {restarts} restarts")
    assert len(kills) >= 3 and restarts >= 1, "the fault was not injected"
    time.sleep(0.3)
    assert [p.pid for p in _stockfish_children() if p.status() != "zombie"] == []
