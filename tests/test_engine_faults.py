"""Nothing waits on an engine without a deadline, no engine outlives the code that made it.

The misbehaving engines are REAL processes speaking UCI (``tests/fake_uci_engine.py``): one that goes
mute on ``go``, one that never answers ``uci``, one whose ``bestmove`` is unparsable (``zzzz``), illegal
(``a1a1``) or comes without any scored line, and one that hangs only in its first process (the restart
must heal it). Every hang case is bounded by a subprocess/test timeout, never by luck.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import rookworld_debug.chess.engine as engine_mod
from rookworld_debug.chess.engine import Engine
from rookworld_debug.errors import EngineError

REPO = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).with_name("fake_uci_engine.py")
FEN = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def fake_engine(tmp_path: Path, mode: str) -> str:
    """An executable that runs the fake UCI engine in `mode` (Engine(path=...) wants an executable)."""
    exe = tmp_path / f"fake-{mode}"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} {mode} {tmp_path / ('count-' + mode)}\n")
    exe.chmod(0o755)
    return str(exe)


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def _fake_pids(tmp_path: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,said", [
    ("mute", "no answer within the 1 s search deadline"),
    ("zzzz", "invalid uci: 'zzzz'"),
    ("a1a1", "'a1a1'"),
    ("nolines", "without any scored 'info ... pv' line"),
])
def test_bad_engine_gives_named_error_with_position_and_answer(tmp_path, mode, said):
    """Restart + retry, then EngineError naming the position and what the engine said; bounded time,
    and the faulty processes are gone afterwards."""
    t0 = time.perf_counter()
    with Engine(path=fake_engine(tmp_path, mode), depth=3, multipv=3, workers=1, timeout=1.0) as e:
        with pytest.raises(EngineError) as err:
            e.analyse(FEN)
        assert e.stats.restarts == engine_mod.MAX_RESTARTS_PER_SEARCH
    elapsed = time.perf_counter() - t0
    msg = str(err.value)
    assert FEN in msg and said in msg and f"{engine_mod.MAX_RESTARTS_PER_SEARCH} restarts" in msg
    assert elapsed < 30, f"{mode}: {elapsed:.1f} s to the named error"
    print(f"\nfake engine {mode!r}: EngineError after {elapsed:.2f} s (timeout=1 s, "
          f"{engine_mod.MAX_RESTARTS_PER_SEARCH} restarts)")
    time.sleep(0.3)
    assert not [p for p in _fake_pids(tmp_path) if _alive(p)], "a faulty engine process outlived the Engine"


@pytest.mark.timeout(120)
def test_bad_engine_in_a_pool_fails_the_batch_without_hanging(tmp_path):
    """Two workers, several positions at once: the first failing search ends the batch with the named error."""
    fens = [FEN, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
            "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"]
    t0 = time.perf_counter()
    with Engine(path=fake_engine(tmp_path, "mute"), depth=3, multipv=2, workers=2, timeout=1.0) as e:
        with pytest.raises(EngineError, match="search deadline"):
            e.analyse_many(fens)
    assert time.perf_counter() - t0 < 60


@pytest.mark.timeout(120)
def test_engine_that_hangs_once_is_restarted_and_answers(tmp_path):
    """Only the first process goes mute: one restart, then the search succeeds (no error, no flag needed)."""
    with Engine(path=fake_engine(tmp_path, "flaky"), depth=3, multipv=3, workers=1, timeout=1.0) as e:
        a = e.analyse(FEN)
        assert e.stats.restarts == 1
    assert len(a.moves) == 3 and a.moves[0] in {"g8h6", "g8f6", "b8c6", "b8a6"}


@pytest.mark.timeout(120)
def test_engine_that_never_answers_uci_fails_to_start_with_a_deadline(tmp_path, monkeypatch):
    """Each attempt waits START_TIMEOUT; the start deadline (shorter here than one attempt's wait) still allows
    START_ATTEMPTS of them (the floor), then the named error."""
    monkeypatch.setattr(engine_mod, "START_TIMEOUT", 2.0)
    monkeypatch.setattr(engine_mod, "START_DEADLINE", 1.0)
    t0 = time.perf_counter()
    with pytest.raises(EngineError, match="could not start") as err:
        Engine(path=fake_engine(tmp_path, "deaf"), depth=3, workers=1)
    elapsed = time.perf_counter() - t0
    assert f"within the 1 s start deadline ({engine_mod.START_ATTEMPTS} start attempt(s)" in str(err.value)
    assert 3 * 2.0 <= elapsed < 20
    print(f"\nfake engine 'deaf' (never answers uci): EngineError after {elapsed:.2f} s (start timeout 2 s)")
    time.sleep(0.3)
    assert not [p for p in _fake_pids(tmp_path) if _alive(p)]


@pytest.mark.timeout(120)
def test_start_ups_killed_more_often_than_the_attempt_floor_are_retried_until_the_deadline(tmp_path):
    """The start-up budget is time: a process killed during its first five start-ups (more than START_ATTEMPTS)
    is started on the sixth, well within START_DEADLINE, and answers."""
    assert engine_mod.START_ATTEMPTS < 6
    with Engine(path=fake_engine(tmp_path, "dies5"), depth=3, multipv=2, workers=1, timeout=5.0) as e:
        a = e.analyse(FEN)
    assert (tmp_path / "count-dies5").read_text() == "6"
    assert len(a.moves) == 2


@pytest.mark.timeout(120)
def test_start_ups_killed_until_the_deadline_give_the_named_error(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod, "START_DEADLINE", 1.5)
    t0 = time.perf_counter()
    with pytest.raises(EngineError, match=r"could not start .* within the 1\.5 s start deadline") as err:
        Engine(path=fake_engine(tmp_path, "dies1000"), depth=3, workers=1)
    elapsed = time.perf_counter() - t0
    attempts = int((tmp_path / "count-dies1000").read_text())
    assert attempts > engine_mod.START_ATTEMPTS and f"({attempts} start attempt(s)" in str(err.value)
    assert elapsed < 1.5 + engine_mod.START_TIMEOUT + 5
    time.sleep(0.3)
    assert not [p for p in _fake_pids(tmp_path) if _alive(p)]


def test_engine_timeout_is_validated():
    from rookworld_debug.config import StepConfig
    from rookworld_debug.errors import ConfigError
    for bad in (0, -1.0, float("inf"), "soon", True):
        with pytest.raises(ConfigError, match="engine.timeout"):
            Engine(timeout=bad)
    with pytest.raises(ConfigError, match="engine_timeout"):
        StepConfig(engine_timeout=0)
    assert StepConfig().engine_timeout >= 10          # generous for depth 10


def _run(args, timeout=110, **kw):
    t0 = time.perf_counter()
    out = subprocess.run(args, cwd=kw.pop("cwd", REPO), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout, env={**ENV, **kw.pop("env", {})})
    return out, time.perf_counter() - t0


@pytest.mark.timeout(120)
def test_engine_dropped_without_close_does_not_hang_exit_or_leak_processes(tmp_path):
    """The root cause of the `step` and ModelLoadError exit hangs: an Engine garbage-collected without
    close() left python-chess's non-daemon loop threads (and Stockfish) running, so Python never exited."""
    code = textwrap.dedent(f"""
        import gc
        from rookworld_debug.chess.engine import Engine
        e = Engine(depth=1, multipv=2, workers=2)
        e.analyse_many([{FEN!r}, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"])
        print("pids", *e.pids(), flush=True)
        del e
        gc.collect()
    """)
    out, elapsed = _run([sys.executable, "-c", code], timeout=60, cwd=tmp_path)   # the installed package
    assert out.returncode == 0, out.stderr
    assert elapsed < 30
    time.sleep(0.2)
    assert not [p for p in map(int, out.stdout.split()[1:]) if _alive(p)], "stockfish outlived its Engine"


@pytest.mark.timeout(120)
def test_step_cli_with_a_mute_engine_exits_2_naming_the_engine_error(tmp_path):
    """`rookworld-debug step` with a Stockfish that stops answering: a named EngineError, exit 2, no hang."""
    out, elapsed = _run([str(REPO / ".venv/bin/rookworld-debug"), "step", "--set", "engine_timeout=1",
                         "--set", "batch_size=2", "--set", "num_generations=2", "--set", "max_new_tokens=16",
                         "--set", "heldout_n=0", "--out", str(tmp_path / "out")],
                        env={"ROOKWORLD_STOCKFISH": fake_engine(tmp_path, "mute")})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "EngineError" in out.stderr and "search deadline" in out.stderr and "Traceback" not in out.stderr
    print(f"\nstep CLI with a mute engine: exit 2 after {elapsed:.1f} s")


@pytest.mark.timeout(120)
def test_step_cli_model_load_error_exits_2_without_hanging(tmp_path):
    """The exit hang: an HF id while offline → ModelLoadError printed, then Python hung at exit on the
    engine setup() had started before the model load failed."""
    out, elapsed = _run([str(REPO / ".venv/bin/rookworld-debug"), "step", "--set", "model=jrahn/RookWorld-LM-124M",
                         "--out", str(tmp_path / "out")], timeout=100)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "ModelLoadError" in out.stderr and "Traceback" not in out.stderr
    assert elapsed < 60, f"exit took {elapsed:.1f} s"


@pytest.mark.timeout(120)
def test_default_step_cli_exits_0_with_stdin_closed(tmp_path):
    """THE acceptance case: the default `rookworld-debug step` printed its log, wrote trace.json and then
    never exited (python-chess threads of the engine run_step created)."""
    out, elapsed = _run([str(REPO / ".venv/bin/rookworld-debug"), "step", "--out", str(tmp_path / "out")],
                        timeout=115)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "out" / "trace.json").exists()
    print(f"\ndefault `rookworld-debug step`: exit 0 after {elapsed:.1f} s (stdin closed)")


@pytest.mark.timeout(120)
def test_flag_mode_marks_rows_unscorable_instead_of_raising(tmp_path):
    """Engine(on_failure='flag'): the failed position comes back flagged (never cached); score_p_batch makes
    every row that needed it unscorable (NaN total, flag engine_failed naming what the engine said)."""
    from rookworld_debug.chess import rewards as R

    completion = "M: g8f6 b8c6 E: 0.1 0.2 B: g8f6"
    with Engine(path=fake_engine(tmp_path, "zzzz"), depth=3, multipv=2, workers=1, timeout=1.0,
                on_failure="flag") as e:
        a = e.analyse(FEN)
        assert a.failure and "zzzz" in a.failure and FEN in a.failure and a.moves == ()
        assert e.analyse(FEN).failure and e.stats.cache_hits == 0                 # retried, not cached
        rows = R.score_p_batch([FEN, "P: " + FEN], [completion, "garbage"], e)
    assert rows[0].flags == ("engine_failed",) and rows[0].total != rows[0].total      # NaN
    assert "zzzz" in rows[0].details["error"]
    assert rows[1].flags[0] == "no_tags"           # a row that needs no engine keeps its reward
    with pytest.raises(Exception, match="on_failure"):
        Engine(on_failure="ignore")


@pytest.mark.timeout(120)
def test_step_with_engine_on_failure_flag_returns_a_flagged_trace(tmp_path, monkeypatch, tiny_byte_model_dir):
    """run_step with an engine that answers an illegal bestmove and engine_on_failure='flag': the step finishes,
    the row that needed the engine is unscorable and the trace's flags say so."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.data.loaders import load_bundled, select_batch
    from rookworld_debug.grpo.step import run_step

    monkeypatch.setenv("ROOKWORLD_STOCKFISH", fake_engine(tmp_path, "a1a1"))
    cfg = StepConfig(model=str(tiny_byte_model_dir), task="P", batch_size=1, num_generations=2, max_new_tokens=8,
                     eval_max_new_tokens=8, heldout_n=0, top_k_alternatives=0, engine_timeout=1.0,
                     engine_on_failure="flag")
    label = select_batch(load_bundled(split="train"), task="P", batch_size=1, seed=0).completions[0]
    t0 = time.perf_counter()
    trace = run_step(cfg, inject={0: label})          # a well-formed row: it needs the engine's answer
    elapsed = time.perf_counter() - t0
    assert "engine_failed" in trace.rewards.flags[0]
    assert bool(trace.rewards.rewards[0] != trace.rewards.rewards[0])             # NaN: unscorable
    assert any("unscorable" in f for f in trace.flags)
    assert elapsed < 100
    with pytest.raises(EngineError, match="a1a1"):
        run_step(cfg.replace(engine_on_failure="raise"), inject={0: label})
