"""Stockfish over python-chess: fixed depth, deterministic, cached, pooled, self-healing.

Why each choice:

- fixed depth (default 10, as rookworld-trl's reward) + ``Threads=1`` + a fresh game (``ucinewgame``,
  i.e. a cleared hash) before every search → a position always gets the same answer, so cached,
  uncached, pooled and sequential results are identical and rewards are reproducible;
- scores in pawns from the side to move, mate as ±(100000−n)/100 — the P: data's convention
  (``score.relative.score(mate_score=100000) / 100``; "mated now" is −1000.0);
- an in-memory cache keyed by (normalised FEN, depth, multipv): GRPO groups repeat positions a lot
  (same prompt G times, identical completions), and rookworld-trl's uncached post-move evals cost seconds
  per step;
- a small pool of engine processes (one ``SimpleEngine`` per worker thread) because a batch is many
  independent searches; a worker whose process died is restarted and the search retried;
- every search has a deadline (``timeout`` seconds, generous for depth 10): an engine that goes mute,
  or answers with an unparsable/illegal ``bestmove`` or no scored line, is restarted and the search
  retried; after ``MAX_RESTARTS_PER_SEARCH`` restarts :class:`EngineError` names the position and what
  the engine said. A start-up that dies is retried until a start deadline (``START_DEADLINE``; time, not a
  count, so a slow machine gets as many tries as its start-ups fit). Nothing waits on an engine without a deadline;
- every engine process this module starts is tracked until it is closed, so none outlives the
  interpreter (an ``Engine`` dropped without ``close()`` is closed when collected, and at exit).

Positions without legal moves (checkmate, stalemate) are not sent to the engine: their value is known
(−1000.0 / 0.0) and Stockfish has nothing to search.
"""
from __future__ import annotations

import asyncio
import math
import os
import queue
import random
import shutil
import threading
import time
import weakref
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Sequence

import chess
import chess.engine

from ..errors import ConfigError, EngineError, EngineNotFound
from .arbiter import apply_move
from .formats import check_fen

MATE_SCORE = 100_000     # centipawns, as the P: data generator
SEARCH_PATHS = ("/usr/games/stockfish", "/usr/local/bin/stockfish", "/opt/homebrew/bin/stockfish")
MAX_RESTARTS_PER_SEARCH = 2
ON_FAILURE = ("raise", "flag")   # after the restarts: raise EngineError, or return a flagged Analysis
DEFAULT_TIMEOUT = 30.0   # s per search: depth 10 takes ~0.05–0.5 s here; 30 s only trips on a stuck engine
START_TIMEOUT = 10.0     # s for a process to answer ``uci``/``isready`` (python-chess's default)
# A process killed or dead during its start-up is started again, like a killed search: until START_DEADLINE s have
# passed since the first attempt, and at least START_ATTEMPTS times however long each takes. The budget is time, not
# a count: on a loaded machine a start-up is slower, and a fixed count of attempts is spent sooner by the same faults.
START_ATTEMPTS = 3
START_DEADLINE = START_ATTEMPTS * START_TIMEOUT   # s for all the start attempts of one process together
# s between attempts: a random wait in [0, w], w doubling from the first value up to the second. Random, because a
# fixed wait can fall into step with a periodic fault (a killer every 0.7 s met each 1 s-later start-up mid-way).
START_BACKOFF = (0.05, 0.5)
_JITTER = random.Random()    # its own generator: the waits never draw from (or reseed) the caller's `random`
QUIT_TIMEOUT = 2.0       # s for a polite ``quit`` before the process is killed

# python-chess runs each SimpleEngine's event loop on a NON-daemon thread, so an engine process that was
# never closed keeps Python from exiting (``rookworld-debug step`` hung after printing its log). A
# WeakSet of Engines is not enough: an Engine dropped without close() leaves the set while its
# SimpleEngine threads live on. So every live process is held STRONGLY here until its worker closes it,
# and threading's pre-join hook (``atexit`` runs too late: CPython joins non-daemon threads first)
# kills whatever is left.
_LIVE_WORKERS: "set[_Worker]" = set()
_LIVE_LOCK = threading.Lock()
_EXITING = threading.Event()     # set at exit: a search still running must not restart its killed process


def _close_live_workers() -> None:
    _EXITING.set()
    with _LIVE_LOCK:
        workers = list(_LIVE_WORKERS)
    for worker in workers:
        worker.kill()


if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_close_live_workers)


def _kill_workers(workers: list) -> None:
    for worker in list(workers):
        worker.kill()


def find_stockfish(path: str | os.PathLike | None = None) -> str:
    """The Stockfish binary to use.

    Order: ``path``, ``$ROOKWORLD_STOCKFISH``, ``stockfish`` on PATH, then the usual install places.
    A configured path (argument or variable) that is not an executable raises instead of silently
    falling back to another binary.
    """
    configured = path if path is not None else os.environ.get("ROOKWORLD_STOCKFISH")
    if configured:
        found = shutil.which(str(configured))
        if found is None:
            raise EngineNotFound([configured])
        return found
    searched = ["stockfish (PATH)", *SEARCH_PATHS]
    for candidate in ("stockfish", *SEARCH_PATHS):
        found = shutil.which(candidate)
        if found is not None:
            return found
    raise EngineNotFound(searched)


@dataclass(frozen=True)
class Analysis:
    """One search: the top ``multipv`` moves (best first) with scores in pawns for the side to move.

    ``fen`` is python-chess's normalised FEN (en-passant square only when capturable) that was searched.
    ``terminal`` names why there was nothing to search (``checkmate``/``stalemate``), else None.
    ``failure`` (only with ``Engine(on_failure="flag")``) says why the engine gave no usable answer after
    its restarts; such an analysis has no moves, a NaN value and is never cached.
    """
    fen: str
    moves: tuple[str, ...]
    scores: tuple[float, ...]
    depth: int
    multipv: int
    terminal: str | None = None
    failure: str | None = None

    @property
    def value(self) -> float:
        """The position's score for the side to move (best line, or the terminal value; NaN if it failed)."""
        if self.failure is not None:
            return math.nan
        if self.terminal == "checkmate":
            return -MATE_SCORE / 100
        return self.scores[0] if self.scores else 0.0


@dataclass(frozen=True)
class EngineStats:
    """Counters since the engine started; subtract two snapshots to measure one phase.

    ``calls`` = positions requested = ``cache_hits + cache_misses`` (a repeat inside one batch counts
    as a hit); ``seconds`` is wall time spent inside ``analyse_many``.
    """
    calls: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    restarts: int = 0
    seconds: float = 0.0

    def __sub__(self, other: EngineStats) -> EngineStats:
        return EngineStats(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def after_move_fens(fen: str, moves: Sequence[str]) -> list[str | None]:
    """FEN after each move from ``fen`` (None for an illegal/unparsable move); arbiter semantics."""
    board = check_fen(fen)
    return [t.new_fen if t.legal else None for t in (apply_move(board, m) for m in moves)]


class _BadAnswer(Exception):
    """The engine answered, but not with a usable search result (garbage or illegal bestmove, no lines)."""


class _Worker:
    """One engine process; ``search`` has a deadline, ``restart`` replaces the process after a fault."""

    def __init__(self, path: str, options: dict):
        self.path, self.options = path, options
        self._fault: asyncio.Future | None = None   # set by the loop's exception handler during a search
        self.engine = self._start()

    def _start(self) -> chess.engine.SimpleEngine:
        """A started and configured process. A start-up that dies (killed, no answer) is retried until
        START_DEADLINE s after the first attempt, and at least START_ATTEMPTS times; then EngineError names the
        deadline, the attempts and the last failure. A binary that cannot be executed at all is not retried."""
        t0 = time.monotonic()
        deadline, wait, cap = t0 + START_DEADLINE, *START_BACKOFF
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._start_once()
            except EngineError as exc:
                permanent = isinstance(exc.__cause__, (FileNotFoundError, PermissionError))
                if permanent or _EXITING.is_set():
                    raise EngineError(f"{exc} ({attempt} start attempt(s))") from exc.__cause__
                if attempt >= START_ATTEMPTS and time.monotonic() + wait >= deadline:
                    raise EngineError(f"{exc}; no start-up succeeded within the {START_DEADLINE:g} s start deadline "
                                      f"({attempt} start attempt(s) in {time.monotonic() - t0:.1f} s)"
                                      ) from exc.__cause__
            time.sleep(_JITTER.uniform(0.0, wait))
            wait = min(2 * wait, cap)

    def _start_once(self) -> chess.engine.SimpleEngine:
        if _EXITING.is_set():
            raise EngineError("the interpreter is exiting: no new engine process is started")
        try:
            engine = chess.engine.SimpleEngine.popen_uci(self.path, timeout=START_TIMEOUT)
        except (chess.engine.EngineError, OSError, TimeoutError) as exc:
            raise EngineError(f"could not start the engine at {self.path} (no answer to 'uci' within "
                              f"{START_TIMEOUT:g} s, or it exited): {exc!r}") from exc
        with _LIVE_LOCK:
            _LIVE_WORKERS.add(self)
        self.engine = engine
        try:
            engine.configure(self.options)
            # python-chess only LOGS an unparsable/illegal bestmove (and the search never finishes):
            # route it to the running search instead (this loop belongs to this one process)
            engine.protocol.loop.call_soon_threadsafe(engine.protocol.loop.set_exception_handler, self._on_fault)
        except (chess.engine.EngineError, OSError, TimeoutError, RuntimeError) as exc:
            self.kill()
            raise EngineError(f"could not configure the engine at {self.path} with {self.options}: {exc!r}"
                              ) from exc
        return engine

    def _on_fault(self, loop, context: dict) -> None:
        said = context.get("exception") or context.get("message")
        if self._fault is not None and not self._fault.done():
            self._fault.set_result(said)
        else:
            loop.default_exception_handler(context)

    async def _analyse(self, board: chess.Board, limit: chess.engine.Limit, multipv: int) -> list:
        self._fault = asyncio.get_running_loop().create_future()
        analysis = await self.engine.protocol.analysis(board, limit, multipv=multipv, game=object())
        with analysis:
            # not cancelled on a fault (that would cancel the analysis' own future under python-chess);
            # it ends when the restart kills the process, and its exception is consumed then
            finished = asyncio.ensure_future(analysis.wait())
            finished.add_done_callback(lambda f: f.cancelled() or f.exception())
            await asyncio.wait([finished, self._fault], return_when=asyncio.FIRST_COMPLETED)
            if not finished.done():
                raise _BadAnswer(str(self._fault.result()))
            best = finished.result()        # EngineTerminatedError if the process died meanwhile
        lines = [i for i in analysis.multipv if i.get("pv") and "score" in i]
        if not lines:
            raise _BadAnswer(f"bestmove {best.move} without any scored 'info ... pv' line")
        return lines

    def search(self, board: chess.Board, depth: int, multipv: int, timeout: float) -> list:
        """The scored lines of one search; TimeoutError after ``timeout`` s, _BadAnswer, EngineError..."""
        if self.engine.returncode.done():
            raise chess.engine.EngineTerminatedError(f"engine process dead (exit code "
                                                     f"{self.engine.returncode.result()})")
        coro = asyncio.wait_for(self._analyse(board, chess.engine.Limit(depth=depth), multipv), timeout)
        future = asyncio.run_coroutine_threadsafe(coro, self.engine.protocol.loop)
        try:
            return future.result(timeout + 1.0)    # the loop thread itself could be wedged
        except TimeoutError:
            future.cancel()
            raise

    @property
    def pid(self) -> int:
        return self.engine.transport.get_pid()

    def restart(self) -> None:
        self.close()
        self.engine = self._start()

    def close(self) -> None:
        """Ask the process to quit (bounded wait), then kill it and stop its event-loop thread."""
        loop = self.engine.protocol.loop
        if loop.is_running():                 # a closed loop cannot run the goodbye (and would leak its coroutine)
            coro = asyncio.wait_for(self.engine.protocol.quit(), QUIT_TIMEOUT)
            try:
                future = asyncio.run_coroutine_threadsafe(coro, loop)
            except Exception:  # the loop stopped in between: the coroutine never ran
                coro.close()
            else:
                try:
                    future.result(QUIT_TIMEOUT + 1.0)
                except Exception:  # a dead or stuck process cannot say goodbye; it is killed below
                    pass
        self.kill()

    def kill(self) -> None:
        """Kill the process and stop the loop thread now, without waiting (safe from any thread)."""
        try:
            self.engine.close()
        except Exception:  # the loop is already closed: nothing left to stop
            pass
        with _LIVE_LOCK:
            _LIVE_WORKERS.discard(self)


class Engine:
    """A pool of deterministic Stockfish processes with a shared result cache.

    Use as a context manager (or call ``close()``); one dropped without ``close()`` kills its processes
    when it is garbage-collected. ``cache=False`` searches every requested position (no memo, no
    de-duplication): rookworld-trl's behaviour, kept as a benchmark baseline. ``timeout`` is the deadline
    of ONE search in seconds (see the module docstring for what happens when it passes).
    """

    def __init__(self, path: str | None = None, depth: int = 10, multipv: int = 5, threads: int = 1,
                 hash_mb: int = 16, workers: int = 2, cache: bool = True, timeout: float = DEFAULT_TIMEOUT,
                 on_failure: str = "raise"):
        for name, value in (("depth", depth), ("multipv", multipv), ("threads", threads),
                            ("hash_mb", hash_mb), ("workers", workers)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine.{name}", f"must be a positive integer, got {value!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ConfigError("engine.timeout", f"must be a positive number of seconds, got {timeout!r}")
        if on_failure not in ON_FAILURE:
            raise ConfigError("engine.on_failure", f"must be one of {list(ON_FAILURE)}, got {on_failure!r}")
        self.path = find_stockfish(path)
        self.depth, self.multipv, self.workers, self.cache = depth, multipv, workers, cache
        self.timeout, self.on_failure = float(timeout), on_failure
        self._options = {"Threads": threads, "Hash": hash_mb}
        self._memo: dict[tuple[str, int, int], Analysis] = {}
        self._lock = threading.Lock()
        self._counts = {f.name: 0 for f in fields(EngineStats)}
        self._workers = [_Worker(self.path, self._options)]   # start one now: fail fast, read version
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._idle.put(self._workers[0])
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.version: str = self._workers[0].engine.id.get("name", "unknown engine")
        # dropped without close(): kill the processes (never blocks, so safe from the GC in any thread)
        self._finalizer = weakref.finalize(self, _kill_workers, self._workers)

    # -- lifecycle
    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pool and every engine process (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)   # running searches end by their deadline
            self._pool = None
        for worker in self._workers:
            worker.close()
        self._workers.clear()
        self._closed = True
        self._finalizer.detach()

    @property
    def uci_options(self) -> dict:
        """The UCI options every search runs with (``Threads``, ``Hash``): part of what a result depends on."""
        return dict(self._options)

    def pids(self) -> list[int]:
        """Process ids of the running engines (diagnostics, and the crash test)."""
        return [w.pid for w in self._workers]

    @property
    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(**self._counts)

    def _count(self, **deltas) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    # -- searching
    def analyse(self, fen: str, multipv: int | None = None) -> Analysis:
        """Top moves and scores of one position (FormatError for a malformed/impossible FEN)."""
        return self.analyse_many([fen], multipv)[0]

    def analyse_many(self, fens: Sequence[str], multipv: int | Sequence[int] | None = None
                     ) -> list[Analysis]:
        """Analyses in input order; ``multipv`` may be one value or one per FEN (default ``self.multipv``).

        Repeats and cached positions are looked up; the remaining searches run on the pool. Every
        FEN is validated before any search starts, so a bad one fails the batch early and clearly.
        """
        fens = list(fens)
        if multipv is None or isinstance(multipv, int):
            multipvs = [multipv or self.multipv] * len(fens)
        else:
            multipvs = list(multipv)
            if len(multipvs) != len(fens):
                raise ConfigError("multipv", f"{len(multipvs)} values for {len(fens)} positions")
        keys = [(check_fen(f).fen(), self.depth, m) for f, m in zip(fens, multipvs)]
        start = time.perf_counter()
        if not self.cache:
            results = self._search_all(keys)
            self._count(calls=len(keys), cache_misses=len(keys), seconds=time.perf_counter() - start)
            return results
        misses = [k for k in dict.fromkeys(keys) if k not in self._memo]
        fresh = dict(zip(misses, self._search_all(misses)))
        self._memo.update((k, a) for k, a in fresh.items() if a.failure is None)   # a failure is retried later
        self._count(calls=len(keys), cache_hits=len(keys) - len(misses), cache_misses=len(misses),
                    seconds=time.perf_counter() - start)
        return [fresh[k] if k in fresh else self._memo[k] for k in keys]

    def eval_after_moves(self, fen: str, moves: Sequence[str]) -> list[float | None]:
        """Score after each move from the MOVER's view (pawns); None for an illegal move.

        This is the P: eval reward's ground truth: multipv 1 at the engine depth, cached.
        """
        after = after_move_fens(fen, moves)
        legal = [f for f in after if f is not None]
        values = iter([-a.value for a in self.analyse_many(legal, multipv=1)])
        return [None if f is None else next(values) for f in after]

    def _search_all(self, keys: list[tuple[str, int, int]]) -> list[Analysis]:
        if keys and self._closed:  # a closed worker would be silently "restarted" into an untracked process
            raise EngineError("this Engine is closed (cached positions still answer); create a new Engine")
        if len(keys) <= 1 or self.workers == 1:
            return [self._search(k) for k in keys]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="stockfish")
        futures = [self._pool.submit(self._search, k) for k in keys]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:          # the batch failed: don't run the queued searches into a broken engine
                f.cancel()
            raise

    def _acquire(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            grow = len(self._workers) < self.workers
        if grow:
            worker = _Worker(self.path, self._options)
            with self._lock:
                self._workers.append(worker)
            return worker
        return self._idle.get()

    def _search(self, key: tuple[str, int, int]) -> Analysis:
        fen, depth, multipv = key
        board = chess.Board(fen)
        if not any(board.legal_moves):
            terminal = "checkmate" if board.is_check() else "stalemate"
            return Analysis(fen, (), (), depth, multipv, terminal)
        worker = self._acquire()
        try:
            for attempt in range(MAX_RESTARTS_PER_SEARCH + 1):
                try:
                    lines = worker.search(board, depth, multipv, self.timeout)
                    break
                # a killed process surfaces as EngineTerminatedError, BrokenPipe or a cancelled future
                except (chess.engine.EngineError, OSError, CancelledError, RuntimeError, TimeoutError,
                        _BadAnswer) as exc:
                    said = (f"no answer within the {self.timeout:g} s search deadline" if isinstance(exc, TimeoutError)
                            else f"unusable answer: {exc}" if isinstance(exc, _BadAnswer) else repr(exc))
                    if attempt == MAX_RESTARTS_PER_SEARCH:
                        msg = (f"engine {self.path} failed on position {fen!r} (depth {depth}, multipv "
                               f"{multipv}) {attempt + 1} times, {attempt} restarts; last failure: {said}")
                        if self.on_failure == "flag":
                            return Analysis(fen, (), (), depth, multipv, failure=msg)
                        raise EngineError(msg) from exc
                    try:
                        worker.restart()
                    except EngineError as restart_exc:
                        msg = (f"engine {self.path} failed on position {fen!r} ({said}) and could not be "
                               f"restarted: {restart_exc}")
                        if self.on_failure == "flag":
                            return Analysis(fen, (), (), depth, multipv, failure=msg)
                        raise EngineError(msg) from exc
                    self._count(restarts=1)
        finally:
            self._idle.put(worker)
        return Analysis(fen=fen, moves=tuple(i["pv"][0].uci() for i in lines),
                        scores=tuple(i["score"].relative.score(mate_score=MATE_SCORE) / 100 for i in lines),
                        depth=depth, multipv=multipv)
