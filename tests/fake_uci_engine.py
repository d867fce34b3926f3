"""A real UCI engine process that misbehaves on purpose: the engine-fault tests start it as
the "Stockfish" of an Engine. Usage: ``fake_uci_engine.py MODE [COUNTER_FILE]``.

Modes (what it does on ``go``; everything else is answered like a normal UCI engine):

- ``ok``       one ``info ... multipv k score cp .. pv <legal move>`` per requested line, then bestmove;
- ``mute``     nothing: the search never ends (``stop`` is ignored too);
- ``deaf``     never answers anything, not even ``uci`` (cannot be started);
- ``zzzz``     ``bestmove zzzz`` (unparsable);
- ``a1a1``     ``bestmove a1a1`` (well-formed, not a legal move);
- ``nolines``  a legal bestmove but no scored ``info`` line;
- ``flaky``    the first process (counted in COUNTER_FILE) is ``mute``, later ones are ``ok``;
- ``diesN``    the first N processes (counted in COUNTER_FILE) are killed (SIGKILL) during their start-up, before
               answering ``uci``, like a process killed by a fault injector; later ones are ``ok``.
"""
import os
import signal
import sys

mode = sys.argv[1]
if mode == "flaky" or mode.startswith("dies"):
    counter = sys.argv[2]
    try:
        with open(counter) as f:
            n = int(f.read() or 0)
    except FileNotFoundError:
        n = 0
    with open(counter, "w") as f:
        f.write(str(n + 1))
    if mode == "flaky":
        mode = "mute" if n == 0 else "ok"
    elif n < int(mode[4:]):
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        mode = "ok"

import chess  # noqa: E402 (a process that dies at start-up dies before this import)

board, multipv = chess.Board(), 1


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


for raw in sys.stdin:
    cmd = raw.split()
    if not cmd or mode == "deaf":
        continue
    if cmd[0] == "uci":
        say("id name FakeUCI " + mode)
        say("option name MultiPV type spin default 1 min 1 max 500")
        say("option name Threads type spin default 1 min 1 max 1")
        say("option name Hash type spin default 16 min 1 max 1024")
        say("uciok")
    elif cmd[0] == "isready":
        say("readyok")
    elif cmd[:4] == ["setoption", "name", "MultiPV", "value"]:
        multipv = int(cmd[4])
    elif cmd[0] == "position":
        fen = " ".join(cmd[2:8]) if cmd[1] == "fen" else chess.STARTING_FEN
        board = chess.Board(fen)
        if "moves" in cmd:
            for m in cmd[cmd.index("moves") + 1:]:
                board.push_uci(m)
    elif cmd[0] == "go":
        moves = [m.uci() for m in board.legal_moves]
        if mode == "mute":
            continue
        if mode in ("zzzz", "a1a1"):
            say("bestmove " + mode)
            continue
        if mode == "ok":
            for k, m in enumerate(moves[:multipv], 1):
                say(f"info depth 1 seldepth 1 multipv {k} score cp {10 - k} nodes 1 pv {m}")
        say("bestmove " + moves[0])
    elif cmd[0] == "quit":
        break
