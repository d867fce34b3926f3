"""Per-completion rewards as pure functions over strings, every component visible.

Each reward returns a ``RewardBreakdown`` with ``total == clamp(Σ weights[k]·components[k], *BOUNDS[kind])``
(true by construction). Nothing here raises on model output: malformed completions get a flagged
breakdown. ``flags`` holds the lenient parser's problems verbatim (``"missing B:"``) plus this module's
snake_case flags (``bad_prompt``, ``no_tags``, ``illegal_best``, ``illegal_moves``, ``no_engine_moves``,
``no_eval_overlap``, ``invalid_fen``, ``king_count``).

P: with Stockfish — ``p_stockfish`` (rookworld-trl ``ChessRewardScorer``, same piecewise values;
weights best 0.5, candidates 0.3, eval 0.2; total clamped to [−1, 1]). SF = the engine's top
``engine.multipv`` moves at ``engine.depth`` (defaults 5 and 10, as rookworld-trl's):

- best: −0.5 B missing/not UCI (or no engine moves); −1.0 illegal; 1.0 − 0.2·rank if in SF (1.0, 0.8,
  …, 0.2); 0.1 legal but outside SF.
- candidates: −0.3 no moves; 0.0 no engine moves; with p = 0.3·#illegal: −p if every move is illegal
  (not clamped, as in rookworld-trl: down to −1.5), else clamp(Jaccard(SF, legal) + Σ_{i<3, legal_i = SF_i}
  0.1·(3−i)/3 − p, −1, 1).
- eval: −0.2 no E (or no M); −0.4 #E ≠ #M; −0.5 any M illegal; else with t_i = the engine's score
  after move i from the mover's view (multipv 1, cached): max(−1, max(0, 1 − MAE) − 0.4·#sign errors),
  a sign error being |t| > 0.2 with sign(e) ≠ sign(t). Mate is ±(1000 − n/100) pawns here (the data's
  scale); rookworld-trl used ±100, which only matters inside the saturated max(0, 1 − MAE).
- details say both whether B matches the dataset label and whether it is Stockfish's #1: for black to
  move the data's B is the 5th-ranked move (label quirk), so the two disagree on about half the data.

P: against the dataset label — ``p_dataset`` (no engine; same weights and gates, label = PSample):

- best: −0.5 missing; −1.0 illegal; 1.0 exact match with the label's B; 0.0 another legal move.
- candidates: −0.3 no moves; clamp(|set(legal) ∩ set(label M)| / #label M − 0.3·#illegal, −1, 1)
  (RookWorld's top-5 accuracy, minus rookworld-trl's illegal-move penalty).
- eval: the same gates; over the predicted moves that are in the label's M, the same MAE/sign formula
  against the label's evals; 0.0 (flag ``no_eval_overlap``) when none is.

A: — ``a`` (ground truth from the arbiter). Every component is +1 (right) or −1 (wrong or missing):
format 0.05 (``parse_a_completion`` finds no problem), board 0.5, side 0.05, castling 0.05,
en_passant 0.05, halfmove 0.05, fullmove 0.05 (``fen_diff`` against the arbiter's FEN), reward_value 0.1
(numeric equality), terminated 0.05, truncated 0.05. Weights sum to 1: an exact completion scores 1.0,
empty/garbage −1.0, a right answer with a wrong board 0.0. The board dominates because rookworld-trl's
lenient FEN similarity rewarded 0.9 with 0% exact matches.

Choices (documented deviations):

- a P: completion with none of the tags (empty or garbage) scores the minimum −1 (all components −1,
  flag ``no_tags``); rookworld-trl gave it −0.38, more than a well-formed answer with illegal moves, which
  rewards saying nothing.
- a malformed PROMPT (bad FEN, bad A: prompt) is not the model's fault: every component is 0, total 0.0,
  flag ``bad_prompt`` (a constant reward inside a group gives zero advantage, so it teaches nothing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import takewhile
from typing import Sequence

from ..errors import FormatError
from .arbiter import prompt_transition
from .engine import Analysis, Engine, after_move_fens
from .formats import (MAX_CANDIDATES, PCompletion, PSample, check_fen, fen_diff, is_uci, parse_a_completion,
                      parse_number, parse_p_completion, strip_p_prefix)

BOUNDS = {"p_stockfish": (-1.0, 1.0), "p_dataset": (-1.0, 1.0), "a": (-1.0, 1.0)}
P_WEIGHTS = {"best": 0.5, "candidates": 0.3, "eval": 0.2}
A_WEIGHTS = {"format": 0.05, "board": 0.5, "side": 0.05, "castling": 0.05, "en_passant": 0.05,
             "halfmove": 0.05, "fullmove": 0.05, "reward_value": 0.1, "terminated": 0.05,
             "truncated": 0.05}
ILLEGAL_MOVE_PENALTY = 0.3   # per illegal candidate (rookworld-trl's value)
SIGN_ERROR_PENALTY = 0.4     # per eval with the wrong sign (rookworld-trl's value)
SIGN_THRESHOLD = 0.2         # pawns: smaller true evals have no meaningful sign


@dataclass(frozen=True)
class RewardBreakdown:
    """One completion's reward: total, the components and weights behind it, flags and details."""
    total: float
    components: dict[str, float]
    weights: dict[str, float]
    flags: tuple[str, ...]
    details: dict
    kind: str

    def weighted(self) -> dict[str, float]:
        """Each component's contribution to the (unclamped) total."""
        return {k: self.weights[k] * v for k, v in self.components.items()}

    @property
    def format_ok(self) -> bool:
        """The completion parsed without any problem (prompt problems are not format problems)."""
        return not self.details.get("problems")


def _breakdown(kind: str, components: dict[str, float], weights: dict[str, float],
               flags: Sequence[str] = (), details: dict | None = None) -> RewardBreakdown:
    """The only constructor used here, so the total invariant holds by construction."""
    lo, hi = BOUNDS[kind]
    raw = sum(weights[k] * components[k] for k in weights)
    return RewardBreakdown(total=min(hi, max(lo, raw)), components=dict(components), weights=dict(weights),
                           flags=tuple(dict.fromkeys(flags)), details=details or {}, kind=kind)


def _constant(kind: str, weights: dict[str, float], value: float, flags: Sequence[str],
              details: dict) -> RewardBreakdown:
    return _breakdown(kind, {k: value for k in weights}, weights, flags, details)


def _bad_prompt(kind: str, weights: dict[str, float], error: Exception) -> RewardBreakdown:
    return _constant(kind, weights, 0.0, ["bad_prompt"], {"error": str(error)})


# ------------------------------------------------------------------------------ P: shared pieces

def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _eval_accuracy(pred: Sequence[float], truth: Sequence[float]) -> tuple[float, dict]:
    """max(−1, max(0, 1 − MAE) − 0.4·#sign errors): rookworld-trl's eval score, for both P: modes."""
    mae = sum(abs(p - t) for p, t in zip(pred, truth)) / len(pred)
    signs = sum(abs(t) > SIGN_THRESHOLD and _sign(p) != _sign(t) for p, t in zip(pred, truth))
    return max(-1.0, max(0.0, 1.0 - mae) - SIGN_ERROR_PENALTY * signs), {"mae": mae, "sign_errors": signs}


def _numeric_evals(pc: PCompletion) -> list[float]:
    """The leading run of numeric evals (what rookworld-trl's regex reads)."""
    return list(takewhile(lambda e: e is not None, pc.evals))


def _eval_gate(pc: PCompletion, evals: list[float], legal: list[bool]) -> float | None:
    """The eval score's early exits (−0.2 / −0.4 / −0.5), or None when the evals are to be compared."""
    if not evals or not pc.moves:
        return -0.2
    if len(evals) != len(pc.moves):
        return -0.4
    if not all(legal):
        return -0.5
    return None


@dataclass(frozen=True)
class _PContext:
    """A parsed P: completion with its legality facts, computed once for every component."""
    fen: str
    pc: PCompletion
    evals: list[float]
    after: list[str | None]          # FEN after each predicted move (None: illegal)
    best_after: str | None

    @classmethod
    def build(cls, fen: str, completion: str) -> _PContext:
        pc = parse_p_completion(completion)
        *after, best_after = after_move_fens(fen, [*pc.moves, pc.best or ""])
        return cls(fen, pc, _numeric_evals(pc), after, best_after)

    @property
    def legal(self) -> list[bool]:
        return [a is not None for a in self.after]

    @property
    def legal_moves(self) -> list[str]:
        return [m for m, a in zip(self.pc.moves, self.after) if a is not None]

    @property
    def illegal_penalty(self) -> float:
        return ILLEGAL_MOVE_PENALTY * (len(self.pc.moves) - len(self.legal_moves))

    def best_gate(self) -> float | None:
        """The best-move score's early exits (−0.5 missing, −1.0 illegal), or None when it is legal."""
        if self.pc.best is None:
            return -0.5
        return -1.0 if self.best_after is None else None

    @property
    def needs_after_evals(self) -> bool:
        return _eval_gate(self.pc, self.evals, self.legal) is None

    def flags(self) -> list[str]:
        flags = list(self.pc.problems)
        if self.pc.best and self.best_after is None:
            flags.append("illegal_best")
        if not all(self.legal):
            flags.append("illegal_moves")
        return flags

    def base_details(self, label: PSample | None) -> dict:
        return {"best": self.pc.best, "moves": list(self.pc.moves), "evals": self.evals,
                "illegal_moves": [m for m in self.pc.moves if m not in self.legal_moves],
                "label_best": label.best if label else None,
                "best_matches_label": (self.pc.best == label.best) if label else None,
                "problems": list(self.pc.problems)}


def _garbage(kind: str, ctx: _PContext) -> RewardBreakdown | None:
    if ctx.pc.has_any_tag:
        return None
    problems = list(ctx.pc.problems)
    return _constant(kind, P_WEIGHTS, -1.0, ["no_tags", *problems], {"problems": problems})


# ------------------------------------------------------------------------------ P: with Stockfish

def _p_stockfish(ctx: _PContext, sf: Analysis, after_evals: dict[str, float],
                 label: PSample | None) -> RewardBreakdown:
    pc, sf_moves, flags = ctx.pc, list(sf.moves), ctx.flags()
    if not sf_moves:
        flags.append("no_engine_moves")
    rank = sf_moves.index(pc.best) if pc.best in sf_moves else None
    best = -0.5 if not sf_moves else ctx.best_gate()
    if best is None:
        best = 1.0 - 0.2 * rank if rank is not None else 0.1

    legal_moves, penalty = ctx.legal_moves, ctx.illegal_penalty
    jaccard = order_bonus = None
    if not pc.moves:
        cand = -0.3
    elif not sf_moves:
        cand = 0.0
    elif not legal_moves:
        cand = -penalty
    else:
        top, pred = set(sf_moves[:5]), set(legal_moves)
        jaccard = len(top & pred) / len(top | pred)
        order_bonus = sum((0.1 * (3 - i) / 3 for i, m in enumerate(legal_moves[:3])
                           if i < len(sf_moves) and m == sf_moves[i]), 0.0)
        cand = max(-1.0, min(1.0, jaccard + order_bonus - penalty))

    details = {**ctx.base_details(label), "sf_moves": sf_moves, "sf_scores": list(sf.scores),
               "sf_rank": rank, "best_matches_sf1": bool(sf_moves) and pc.best == sf_moves[0],
               "jaccard": jaccard, "order_bonus": order_bonus, "true_evals": None}
    ev = _eval_gate(pc, ctx.evals, ctx.legal)
    if ev is None:
        truth = [after_evals[f] for f in ctx.after]
        ev, stats = _eval_accuracy(ctx.evals, truth)
        details.update(stats, true_evals=truth)
    components = {"best": best, "candidates": cand, "eval": ev}
    return _breakdown("p_stockfish", components, P_WEIGHTS, flags, details)


def score_p_batch(fens: Sequence[str], completions: Sequence[str], engine: Engine,
                  labels: Sequence[PSample | None] | None = None) -> list[RewardBreakdown]:
    """The rookworld-trl P: reward for many completions with ONE ``engine.analyse_many`` call.

    ``fens`` may be FENs or ``"P: <fen>"`` prompts. Every position needed (the prompts at
    ``engine.multipv``, the positions after the predicted moves at multipv 1) is collected first,
    de-duplicated and analysed together; scoring is then pure.
    """
    if len(fens) != len(completions) or (labels is not None and len(labels) != len(fens)):
        raise ValueError(f"{len(fens)} prompts, {len(completions)} completions, "
                         f"{None if labels is None else len(labels)} labels: lengths must match")
    labels = list(labels) if labels is not None else [None] * len(fens)
    contexts: list[_PContext | RewardBreakdown] = []
    requests: dict[tuple[str, int], None] = {}
    for fen, completion in zip(fens, completions):
        fen = strip_p_prefix(fen) if isinstance(fen, str) else fen
        try:
            check_fen(fen)
        except FormatError as exc:
            contexts.append(_bad_prompt("p_stockfish", P_WEIGHTS, exc))
            continue
        ctx = _PContext.build(fen, completion)
        contexts.append(_garbage("p_stockfish", ctx) or ctx)
        if isinstance(contexts[-1], _PContext):
            requests[(fen, engine.multipv)] = None
            if ctx.needs_after_evals:
                requests.update(((f, 1), None) for f in ctx.after)
    keys = list(requests)
    analyses = dict(zip(keys, engine.analyse_many([f for f, _ in keys], [m for _, m in keys])))
    after_evals = {f: -a.value for (f, m), a in analyses.items() if m == 1}
    return [c if isinstance(c, RewardBreakdown)
            else _engine_failed(c, analyses, engine.multipv)
            or _p_stockfish(c, analyses[(c.fen, engine.multipv)], after_evals, label)
            for c, label in zip(contexts, labels)]


def _engine_failed(ctx: _PContext, analyses: dict, multipv: int) -> RewardBreakdown | None:
    """A row whose engine searches failed (Engine(on_failure="flag")): unscorable, total NaN (advantage 0),
    flagged ``engine_failed`` with what the engine did, instead of a made-up number."""
    needed = [(ctx.fen, multipv), *(((f, 1) for f in ctx.after if f is not None) if ctx.needs_after_evals else ())]
    failures = [analyses[k].failure for k in needed if k in analyses and analyses[k].failure]
    if not failures:
        return None
    return RewardBreakdown(total=math.nan, components={k: math.nan for k in P_WEIGHTS}, weights=dict(P_WEIGHTS),
                           flags=("engine_failed",), details={"error": failures[0], "problems": list(ctx.pc.problems)},
                           kind="p_stockfish")


def score_p(fen: str, completion: str, engine: Engine, label: PSample | None = None) -> RewardBreakdown:
    """One P: completion with Stockfish (prefer ``score_p_batch`` for many)."""
    return score_p_batch([fen], [completion], engine, [label])[0]


# ------------------------------------------------------------------------------ P: dataset label

def _check_label(label: PSample) -> None:
    """The dataset-reward ground truth must have 1..5 UCI moves, one ASCII number per move and a UCI best."""
    moves, evals = tuple(label.moves), tuple(label.evals)
    if not moves or len(moves) > MAX_CANDIDATES or not all(isinstance(m, str) and is_uci(m) for m in moves):
        raise FormatError(f"label M: must hold 1..{MAX_CANDIDATES} UCI moves, got {moves!r}")
    if len(evals) != len(moves) or any(parse_number(str(e)) is None for e in evals):
        raise FormatError(f"label E: must hold one number per move, got {evals!r} for {len(moves)} moves")
    if not isinstance(label.best, str) or not is_uci(label.best):
        raise FormatError(f"label B: is not a UCI move: {label.best!r}")


def score_p_dataset(completion: str, label: PSample) -> RewardBreakdown:
    """The P: reward against the dataset label alone (no engine); formulas in the module docstring."""
    try:
        check_fen(label.fen)
        _check_label(label)
    except FormatError as exc:        # a degenerate label is a flagged row, never a crash (e.g. moves=())
        return _bad_prompt("p_dataset", P_WEIGHTS, exc)
    ctx = _PContext.build(label.fen, completion)
    garbage = _garbage("p_dataset", ctx)
    if garbage is not None:
        return garbage
    pc, flags = ctx.pc, ctx.flags()
    best = ctx.best_gate()
    if best is None:
        best = 1.0 if pc.best == label.best else 0.0
    overlap = set(ctx.legal_moves) & set(label.moves)
    share = len(overlap) / len(label.moves)
    cand = -0.3 if not pc.moves else max(-1.0, min(1.0, share - ctx.illegal_penalty))

    details = {**ctx.base_details(label), "label_moves": list(label.moves), "overlap": sorted(overlap),
               "best_matches_sf1": None, "true_evals": None}
    ev = _eval_gate(pc, ctx.evals, ctx.legal)
    if ev is None:
        truth = dict(zip(label.moves, (float(e) for e in label.evals)))
        pairs = [(e, truth[m]) for m, e in zip(pc.moves, ctx.evals) if m in truth]
        if pairs:
            ev, stats = _eval_accuracy([p for p, _ in pairs], [t for _, t in pairs])
            details.update(stats, true_evals=[t for _, t in pairs])
        else:
            ev = 0.0
            flags.append("no_eval_overlap")
    components = {"best": best, "candidates": cand, "eval": ev}
    return _breakdown("p_dataset", components, P_WEIGHTS, flags, details)


# ------------------------------------------------------------------------------ A:

def score_a(prompt: str, completion: str) -> RewardBreakdown:
    """The A: reward: field-wise agreement with the arbiter's ground truth (module docstring)."""
    try:
        truth = prompt_transition(prompt)
    except FormatError as exc:
        return _bad_prompt("a", A_WEIGHTS, exc)
    ac = parse_a_completion(completion)
    diff = fen_diff(truth.new_fen, ac.new_fen)
    reward_ok = ac.reward_value is not None and math.isclose(ac.reward_value, float(truth.reward))
    right = {"format": ac.ok, **diff.fields(), "reward_value": reward_ok,
             "terminated": ac.terminated == str(truth.terminated),
             "truncated": ac.truncated == str(truth.truncated)}
    flags = list(ac.problems)
    if ac.new_fen is not None and not diff.valid:
        flags.append("invalid_fen")
    if ac.new_fen is not None and (diff.white_kings, diff.black_kings) != (1, 1):
        flags.append("king_count")
    details = {"expected": truth.completion, "predicted_fen": ac.new_fen, "outcome": truth.outcome,
               "fen_exact": diff.exact, "fen_valid": diff.valid, "n_fields_match": diff.n_fields_match,
               "kings": (diff.white_kings, diff.black_kings), "problems": list(ac.problems)}
    return _breakdown("a", {k: 1.0 if right[k] else -1.0 for k in A_WEIGHTS}, A_WEIGHTS, flags, details)


def score_batch(prompts: Sequence[str], completions: Sequence[str], engine: Engine | None = None,
                labels: Sequence[PSample | None] | None = None) -> list[RewardBreakdown]:
    """Mixed P:/A: batch by prompt prefix: A: → ``score_a``; P: → Stockfish when ``engine`` is given
    (one batched engine call), else against the dataset label. Without engine AND labels, P: rows are
    a ValueError (a set-up mistake); a single missing label gives a neutral breakdown flagged
    ``no_label``."""
    if len(prompts) != len(completions) or (labels is not None and len(labels) != len(prompts)):
        raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions, "
                         f"{None if labels is None else len(labels)} labels: lengths must match")
    no_labels = labels is None
    labels = list(labels) if labels is not None else [None] * len(prompts)
    out: list[RewardBreakdown | None] = [None] * len(prompts)
    p_idx = [i for i, p in enumerate(prompts) if not str(p).lstrip().startswith("A:")]
    for i in set(range(len(prompts))) - set(p_idx):
        out[i] = score_a(prompts[i], completions[i])
    if engine is not None and p_idx:
        scored = score_p_batch([prompts[i] for i in p_idx], [completions[i] for i in p_idx], engine,
                               [labels[i] for i in p_idx])
        for i, b in zip(p_idx, scored):
            out[i] = b
    if engine is None and no_labels and p_idx:
        raise ValueError("P: prompts need an engine (reward against Stockfish) or dataset labels")
    for i in p_idx:
        if out[i] is None:
            out[i] = (score_p_dataset(completions[i], labels[i]) if labels[i] is not None else
                      _constant("p_dataset", P_WEIGHTS, 0.0, ["no_label"], {"error": "no dataset label"}))
    return out


class StockfishPReward:
    """A TRL-style reward function ``f(prompts, completions, **kw) -> list[float]``.

    P: prompts get the Stockfish reward (one batched engine call), A: prompts the arbiter reward. The
    engine is started on first use unless one is given; ``close()`` stops an engine it started.
    """
    __name__ = "rookworld"        # TRL logs rewards/<__name__>

    def __init__(self, depth: int = 10, multipv: int = 5, engine: Engine | None = None):
        self.depth, self.multipv, self._engine, self._owned = depth, multipv, engine, engine is None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine(depth=self.depth, multipv=self.multipv)
        return self._engine

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: object) -> list[float]:
        return [b.total for b in score_batch(prompts, completions, self.engine)]

    def close(self) -> None:
        if self._owned and self._engine is not None:
            self._engine.close()
            self._engine = None


def default_p_reward_fn(depth: int = 10, multipv: int = 5, engine: Engine | None = None) -> StockfishPReward:
    """The project's default reward as a plain function object (see ``StockfishPReward``)."""
    return StockfishPReward(depth=depth, multipv=multipv, engine=engine)
