"""The RookWorld text formats, byte-exact: P: (policy with chain of thought) and A: (ArbiterSim).

P: ``P: <fen padded to 90>M: <5 uci padded to 30>E: <5 evals padded to 40>B: <uci>``
A: ``A: <fen>+<uci>+<history>+<new_fen>+<reward>+<terminated>+<truncated>``

Two kinds of parser live here, on purpose:

- strict ones for *data* (``parse_p``, ``parse_a``, ``parse_a_prompt``) raise ``FormatError`` so a
  bad dataset line is noticed at load time;
- lenient ones for *model outputs* (``parse_p_completion``, ``parse_a_completion``) never raise and
  list what is wrong in ``problems``, because rewards must score garbage, not crash on it.

P: lines are parsed by their tags (``M: ``, ``E: ``, ``B: ``), never by column: the published
validation file pads the FEN to 89 while the generator and the model use 90.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import chess

from ..errors import FormatError

FEN_WIDTH = 90        # generator layout (and what the model emits); rook_val_500 used 89
MOVES_WIDTH = 30
EVALS_WIDTH = 40
MAX_CANDIDATES = 5    # multipv of the P: data
MAX_HISTORY = 10      # ArbiterSim's deque(maxlen=10)
A_REWARDS = ("0.001", "1.0", "0.5", "-1.0")   # str(float) spellings used by the data
A_FLAGS = ("0", "1")

_UCI_RE = re.compile(r"[a-h][1-8][a-h][1-8][qrbn]?\Z")
# Plain ASCII decimal numbers only: float() would also accept "nan", "inf", "1_0", "１２" and "١٢.٥".
_NUMBER_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z", re.ASCII)
_P_TAGS = ("M:", "E:", "B:")


def non_ascii_problem(text: str) -> str | None:
    """RookWorld text is ASCII: name the first non-ASCII character (full-width digits, U+3000 spaces...)."""
    if text.isascii():
        return None
    i, ch = next((i, c) for i, c in enumerate(text) if not c.isascii())
    return f"non-ASCII character U+{ord(ch):04X} at {i}"


def ascii_split(text: str) -> list[str]:
    """``str.split()`` on ASCII whitespace only: a U+3000 "space" must not make a malformed field parse."""
    return [t for t in re.split(r"[ \t\n\r\f\v]+", text) if t]


def is_uci(token: str) -> bool:
    """True when ``token`` looks like a UCI move (``e2e4``, ``e7e8q``); legality is not checked."""
    return bool(_UCI_RE.match(token))


def parse_number(token: str) -> float | None:
    """A plain finite decimal number as float, else None (nan/inf/1e999 would poison an MAE)."""
    value = float(token) if _NUMBER_RE.match(token) else None
    return value if value is not None and math.isfinite(value) else None


def strip_p_prefix(text: str) -> str:
    """``"P: <fen>"`` or a bare FEN → the FEN, so callers may pass prompts or FENs."""
    text = text.strip()
    return text[2:].strip() if text.startswith("P:") else text


def strip_a_prefix(text: str) -> str:
    """Drop an optional ``A:`` prefix (the hub's arbiter lines may lack it)."""
    text = text.strip()
    return text[2:].lstrip() if text.startswith("A:") else text


def check_fen(fen: str) -> chess.Board:
    """A FEN as a python-chess Board, or FormatError naming what is wrong.

    Accepts non-capturable en-passant squares (lichess FENs) but rejects positions python-chess calls
    invalid (missing kings, pawns on the back rank, side not to move in check): Stockfish may crash on
    those, and no RookWorld sample contains one.
    """
    if not isinstance(fen, str) or len(fen.split()) != 6:
        raise FormatError(f"FEN must have 6 space-separated fields, got {fen!r}")
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        raise FormatError(f"python-chess rejects FEN {fen!r}: {exc}") from None
    if not board.is_valid():
        raise FormatError(f"impossible position {fen!r}: {board.status()!r}")
    return board


# ----------------------------------------------------------------------------------------------- P:

@dataclass(frozen=True)
class PSample:
    """One P: data line. ``evals`` keep the data's spelling (``-2.0``, ``999.85``) so lines round-trip."""
    fen: str
    moves: tuple[str, ...]
    evals: tuple[str, ...]
    best: str


def _split_p_line(text: str) -> dict[str, str] | None:
    """``P: <fen> M: <moves> E: <evals> B: <best>`` → the four field texts, or None; linear time.

    Each tag must occur exactly once, in order (a valid line cannot hold a second one: FENs, UCI moves
    and numbers contain no ':'). A regex with lazy groups did this before and backtracked cubically on
    repetitive garbage such as ``"P: " + "M: E: " * 100`` (over a second per line).
    """
    body = text.lstrip()
    if not body.startswith("P:"):
        return None
    body = body[2:]
    pos = [body.find(tag) for tag in _P_TAGS]
    if min(pos) < 0 or pos != sorted(pos) or any(body.count(tag) != 1 for tag in _P_TAGS):
        return None
    (m, e, b), w = pos, 2
    best = body[b + w:].split()
    if len(best) > 1:
        return None
    return {"fen": body[:m].strip(), "moves": body[m + w:e].strip(), "evals": body[e + w:b].strip(),
            "best": best[0] if best else ""}


def parse_p(text: str) -> PSample:
    """Strictly parse a full P: line (any padding); FormatError says which part is wrong."""
    if not isinstance(text, str):
        raise FormatError(f"P: line must be a string, got {type(text).__name__}")
    bad = non_ascii_problem(text)
    if bad:
        raise FormatError(f"P: line has a {bad}: {text[:120]!r}")
    m = _split_p_line(text)
    if m is None:
        raise FormatError(f"not a P: line (need 'P: <fen> M: ... E: ... B: <uci>'): {text[:120]!r}")
    fen = m["fen"]
    check_fen(fen)
    moves, evals, best = tuple(m["moves"].split()), tuple(m["evals"].split()), m["best"]
    if not moves or len(moves) > MAX_CANDIDATES:
        raise FormatError(f"M: needs 1..{MAX_CANDIDATES} moves, got {len(moves)}: {text[:120]!r}")
    bad = [t for t in moves + (best,) if not is_uci(t)]
    if bad:
        raise FormatError(f"not UCI moves {bad} in {text[:120]!r}")
    if len(evals) != len(moves):
        raise FormatError(f"{len(moves)} moves but {len(evals)} evals in {text[:120]!r}")
    bad = [e for e in evals if parse_number(e) is None]
    if bad:
        raise FormatError(f"evals {bad} are not numbers in {text[:120]!r}")
    return PSample(fen=fen, moves=moves, evals=evals, best=best)


def format_p(sample: PSample, fen_width: int = FEN_WIDTH) -> str:
    """The generator's exact layout; ``fen_width=89`` reproduces the published validation file."""
    return (f"P: {sample.fen:{fen_width}}" + f"M: {' '.join(sample.moves):{MOVES_WIDTH}}"
            + f"E: {' '.join(sample.evals):{EVALS_WIDTH}}" + f"B: {sample.best}")


def p_prompt(fen: str) -> str:
    """The P: prompt as RookWorld's trainers build it: padding stripped, so the model generates the pad."""
    return f"P: {strip_p_prefix(fen)}"


def split_p(line: str) -> tuple[str, str]:
    """A P: line → (prompt, completion) with ``prompt + completion == line`` (line without its newline).

    The prompt ends at the FEN (no pad); the completion starts with the pad spaces and ``M:``: that is
    what the model must generate, token for token.
    """
    line = line.rstrip("\r\n").lstrip() if isinstance(line, str) else line
    parse_p(line)  # validate first: a malformed line gives a FormatError, not a wrong split
    prompt = line[:line.index("M:")].rstrip()
    return prompt, line[len(prompt):]


@dataclass(frozen=True)
class PCompletion:
    """A model's P: completion, read leniently. ``problems`` is empty exactly when it is well formed.

    ``moves`` keeps the UCI-looking tokens of M: (at most 5, in order); ``evals`` holds one entry per
    E: token (None where it is not a number); ``best`` is B:'s first token if it is UCI. ``raw_*``
    are the field texts (None when the tag is missing) for views.
    """
    moves: tuple[str, ...]
    evals: tuple[float | None, ...]
    best: str | None
    raw_moves: str | None
    raw_evals: str | None
    raw_best: str | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def has_any_tag(self) -> bool:
        return not (self.raw_moves is None and self.raw_evals is None and self.raw_best is None)


def _tag_fields(text: str, tags: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Split ``text`` at the first occurrence of each tag → ({tag: field text}, problems)."""
    found = sorted((text.find(t), t) for t in tags if t in text)
    fields, problems = {}, []
    for i, (pos, tag) in enumerate(found):
        end = found[i + 1][0] if i + 1 < len(found) else len(text)
        fields[tag] = text[pos + len(tag):end].strip()
    if [t for _, t in found] != [t for t in tags if t in fields]:
        problems.append("tags out of order")
    if found and text[:found[0][0]].strip():
        problems.append(f"text before {found[0][1]}")
    return fields, problems


def parse_p_completion(text: str) -> PCompletion:
    """Read a model's P: completion (pad spaces included or not); never raises."""
    text = text if isinstance(text, str) else ""
    fields, problems = _tag_fields(text, ("M:", "E:", "B:"))
    if non_ascii_problem(text):        # str.split() and \d would otherwise accept U+3000 and '１２'
        problems.append(non_ascii_problem(text))
    if not text.strip():
        problems.append("empty")
    raw_moves, raw_evals, raw_best = fields.get("M:"), fields.get("E:"), fields.get("B:")
    moves: tuple[str, ...] = ()
    evals: tuple[float | None, ...] = ()
    best = None
    if raw_moves is None:
        problems.append("missing M:")
    else:
        tokens = ascii_split(raw_moves)
        if any(not is_uci(t) for t in tokens):
            problems.append("move not UCI")
        moves = tuple(t for t in tokens if is_uci(t))
        if len(set(moves)) < len(moves):
            problems.append("repeated move")
        if not moves:
            problems.append("no moves")
        elif len(moves) > MAX_CANDIDATES:
            problems.append(f"more than {MAX_CANDIDATES} moves")
            moves = moves[:MAX_CANDIDATES]
    if raw_evals is None:
        problems.append("missing E:")
    else:
        evals = tuple(parse_number(t) for t in ascii_split(raw_evals))
        if not evals:
            problems.append("no evals")
        if any(e is None for e in evals):
            problems.append("eval not a number")
        if moves and len(evals) != len(moves):
            problems.append("evals/moves count mismatch")
    if raw_best is None:
        problems.append("missing B:")
    else:
        tokens = ascii_split(raw_best)
        if tokens and is_uci(tokens[0]):
            best = tokens[0]
        else:
            problems.append("best not UCI")
        if len(tokens) > 1:
            problems.append("text after B: move")
    return PCompletion(moves=moves, evals=evals, best=best, raw_moves=raw_moves, raw_evals=raw_evals,
                       raw_best=raw_best, problems=tuple(problems))


# ----------------------------------------------------------------------------------------------- A:

@dataclass(frozen=True)
class APrompt:
    """An A: prompt. ``move`` is kept verbatim even when it is garbage: the arbiter scores that."""
    fen: str
    move: str
    history: tuple[str, ...]


@dataclass(frozen=True)
class ASample:
    """A full A: line; reward and flags keep the data's spelling (``0.001``, ``1.0``, ``0``/``1``)."""
    fen: str
    move: str
    history: tuple[str, ...]
    new_fen: str
    reward: str
    terminated: str
    truncated: str

    @property
    def prompt(self) -> APrompt:
        return APrompt(self.fen, self.move, self.history)

    @property
    def completion(self) -> str:
        return f"{self.new_fen}+{self.reward}+{self.terminated}+{self.truncated}"


def _history(text: str) -> tuple[str, ...]:
    """Space-separated history; comma lists (a mistake in rookworld-trl's docs and tests) and >10 moves are rejected."""
    if "," in text:
        raise FormatError(f"history must be space-separated UCI (the data never uses commas): {text!r}")
    moves = tuple(text.split())
    if len(moves) > MAX_HISTORY:
        raise FormatError(f"history holds at most {MAX_HISTORY} moves, got {len(moves)}: {text!r}")
    return moves


def _a_fields(text: str, n: int, what: str) -> list[str]:
    if not isinstance(text, str):
        raise FormatError(f"{what} must be a string, got {type(text).__name__}")
    if non_ascii_problem(text):
        raise FormatError(f"{what} has a {non_ascii_problem(text)}: {text[:160]!r}")
    parts = strip_a_prefix(text).split("+")
    if len(parts) != n:
        raise FormatError(f"{what} needs {n} '+'-separated fields, got {len(parts)}: {text[:160]!r}")
    if len(parts[0].split()) != 6:
        raise FormatError(f"{what}: first field is not a 6-field FEN: {parts[0]!r}")
    return parts


def parse_a_prompt(text: str) -> APrompt:
    """``A: <fen>+<uci>+<history>+`` (prefix and final ``+`` optional) → APrompt."""
    body = strip_a_prefix(text) if isinstance(text, str) else text
    if isinstance(body, str) and body.endswith("+"):
        body = body[:-1]
    fen, move, history = _a_fields(body, 3, "A: prompt")
    return APrompt(fen=fen, move=move, history=_history(history))


def parse_a(text: str) -> ASample:
    """A full A: line, with or without the ``A: `` prefix; reward/flags must use the data spelling."""
    fen, move, history, new_fen, reward, terminated, truncated = _a_fields(text, 7, "A: line")
    if parse_number(reward) is None:
        raise FormatError(f"A: reward is not a number: {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if flag not in A_FLAGS:
            raise FormatError(f"A: {name} must be 0 or 1 (data never uses true/false), got {flag!r}")
    if len(new_fen.split()) != 6:
        raise FormatError(f"A: new state is not a 6-field FEN: {new_fen!r}")
    return ASample(fen=fen, move=move, history=_history(history), new_fen=new_fen, reward=reward,
                   terminated=terminated, truncated=truncated)


def format_a_prompt(fen: str, move: str, history: Iterable[str] | str) -> str:
    """``A: <fen>+<move>+<history>+``; history is space-joined (a string is taken as already joined)."""
    joined = history if isinstance(history, str) else " ".join(history)
    return f"A: {fen}+{move}+{joined}+"


def format_a(sample: ASample, prefix: bool = True) -> str:
    """A full A: line; ``prefix=False`` gives the hub ``arbiter_2m`` spelling without ``A: ``."""
    line = format_a_prompt(sample.fen, sample.move, sample.history) + sample.completion
    return line if prefix else line[3:]


@dataclass(frozen=True)
class ACompletion:
    """A model's A: completion, read leniently; fields are None when missing."""
    new_fen: str | None
    reward: str | None
    terminated: str | None
    truncated: str | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reward_value(self) -> float | None:
        return None if self.reward is None else parse_number(self.reward)


def parse_a_completion(text: str) -> ACompletion:
    """Read ``<new_fen>+<reward>+<terminated>+<truncated>`` leniently; never raises."""
    text = text if isinstance(text, str) else ""
    problems = []
    if not text.strip():
        return ACompletion(None, None, None, None, ("empty",))
    if text[0].isspace():
        problems.append("leading whitespace")
    if non_ascii_problem(text):
        problems.append(non_ascii_problem(text))
    parts = [p.strip() for p in text.strip().split("+")]
    if len(parts) > 4:
        problems.append("extra fields")
    names = ("new_fen", "reward", "terminated", "truncated")
    values = {name: (parts[i] if i < len(parts) and parts[i] else None) for i, name in enumerate(names)}
    problems += [f"missing {name}" for name in names if values[name] is None]
    new_fen = values["new_fen"]
    if new_fen is not None and len(new_fen.split()) != 6:
        problems.append("fen not 6 fields")
    reward = values["reward"]
    if reward is not None:
        if parse_number(reward) is None:
            problems.append("reward not a number")
        elif reward not in A_REWARDS:
            problems.append("reward not a data value")
    for name in ("terminated", "truncated"):
        if values[name] is not None and values[name] not in A_FLAGS:
            problems.append(f"{name} not 0/1")
    return ACompletion(new_fen=new_fen, reward=reward, terminated=values["terminated"],
                       truncated=values["truncated"], problems=tuple(problems))


# ----------------------------------------------------------------------------------------- FEN diff

FEN_FIELDS = ("board", "side", "castling", "en_passant", "halfmove", "fullmove")


@dataclass(frozen=True)
class FenDiff:
    """Field-wise comparison of a predicted FEN with the expected one (for rewards and views).

    ``exact`` is byte equality of the two strings; ``valid`` means python-chess parses the prediction
    and calls the position possible (``Board.is_valid``); king counts come from the board field text,
    so they are reported even when the prediction does not parse.
    """
    board: bool
    side: bool
    castling: bool
    en_passant: bool
    halfmove: bool
    fullmove: bool
    valid: bool
    white_kings: int
    black_kings: int
    exact: bool
    n_fields_match: int

    def fields(self) -> dict[str, bool]:
        return {name: getattr(self, name) for name in FEN_FIELDS}


def _is_valid_fen(fen: str) -> bool:
    try:
        check_fen(fen)
    except FormatError:
        return False
    return True


def fen_diff(expected: str, predicted: str | None) -> FenDiff:
    """Compare two FEN strings field by field; never raises, whatever ``predicted`` holds."""
    predicted = predicted if isinstance(predicted, str) else ""
    exp, pred = expected.split(), predicted.split()
    matches = [i < len(pred) and i < len(exp) and pred[i] == exp[i] for i in range(len(FEN_FIELDS))]
    board_text = pred[0] if pred else ""
    return FenDiff(*matches, valid=_is_valid_fen(predicted), white_kings=board_text.count("K"),
                   black_kings=board_text.count("k"), exact=predicted == expected,
                   n_fields_match=sum(matches))
