"""A: ground truth with ArbiterSim semantics (jorahn/RookWorld dev/data/arbiter/generate_rollouts.py).

One step of the environment, from a FEN and a UCI move:

- legal, game goes on    → ``<board.fen()>+0.001+0+0``
- legal, game ends       → reward ``1.0`` (the mover wins: only the mover can deliver mate) or ``0.5``
  (draw: stalemate, insufficient material, 75-move rule), terminated ``1``
- illegal or unparsable  → reward ``-1.0``, truncated ``1``, and the new state is the *unchanged*
  position (``board.fen()`` of the prompt, so its en-passant field is normalised); terminated is
  ``is_game_over()`` of that unchanged position, as in the generator.

States are ``board.fen()`` with python-chess's default en-passant convention (the square is written
only when a legal en-passant capture exists).

Deliberate differences from the original generator, which kept a whole game on one ``Board``:

- the generator ``push``-ed any *parseable* move without a legality check, so pseudo-legal/impossible
  moves could reach the data as "legal"; here a move must be legal (``Board.is_legal``), so the null
  move ``0000`` is illegal (king-takes-rook ``e1h1`` is read as castling, as python-chess always did);
- repetition draws (fivefold) need the game's move stack, which a FEN plus ≤10 moves of history cannot
  rebuild, so they are never detected; the 75-move rule works from the FEN's halfmove clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import chess

from .formats import check_fen, parse_a_prompt

LEGAL_REWARD, WIN_REWARD, DRAW_REWARD, ILLEGAL_REWARD = "0.001", "1.0", "0.5", "-1.0"


@dataclass(frozen=True)
class ATransition:
    """The environment's answer to one move.

    ``outcome`` is None while the game goes on, the python-chess termination name in lower case when
    it ends (``checkmate``, ``stalemate``, ``insufficient_material``, ``seventyfive_moves``), or
    ``illegal_move`` / ``unparsable_move`` when the move was refused.
    """
    new_fen: str
    reward: str
    terminated: int
    truncated: int
    legal: bool
    outcome: str | None

    @property
    def completion(self) -> str:
        """The A: completion the model should generate."""
        return f"{self.new_fen}+{self.reward}+{self.terminated}+{self.truncated}"


def transition(fen: str, move: str, history: Sequence[str] = ()) -> ATransition:
    """Apply ``move`` to ``fen``. A malformed FEN raises FormatError; a bad move is a -1.0 transition.

    ``history`` is accepted to mirror the A: prompt but cannot change the result (see module doc).
    """
    return apply_move(check_fen(fen), move)


def apply_move(board: chess.Board, move: str) -> ATransition:
    """``transition`` on an already parsed board (left unchanged), for callers trying many moves."""
    try:
        parsed = chess.Move.from_uci(move)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or not board.is_legal(parsed):
        return ATransition(new_fen=board.fen(), reward=ILLEGAL_REWARD,
                           terminated=int(board.is_game_over()), truncated=1, legal=False,
                           outcome="unparsable_move" if parsed is None else "illegal_move")
    board = board.copy(stack=False)
    board.push(parsed)
    outcome = board.outcome()
    if outcome is None:
        return ATransition(board.fen(), LEGAL_REWARD, 0, 0, True, None)
    reward = WIN_REWARD if outcome.winner is not None else DRAW_REWARD
    return ATransition(board.fen(), reward, 1, 0, True, outcome.termination.name.lower())


def prompt_transition(prompt: str) -> ATransition:
    """The transition an A: prompt asks for (FormatError when the prompt itself is malformed)."""
    p = parse_a_prompt(prompt)
    return transition(p.fen, p.move, p.history)


def expected_a_completion(prompt: str) -> str:
    """Ground-truth completion ``<new_fen>+<reward>+<terminated>+<truncated>`` for an A: prompt."""
    return prompt_transition(prompt).completion
