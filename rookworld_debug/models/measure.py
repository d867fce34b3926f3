"""Measure a RookWorld model on held-out prompts (issue 3 targets).

``measure(model_or_path, n_prompts=..., seed=...)`` samples at the toolkit's default settings
(P: T=0.5, top-p 0.9; A: T=0.95, top-p 0.95; top-k off; 160 new tokens) on the bundled held-out split
(positions from games never used for training) and returns:

* ``p_well_formed`` — P: completions that parse (M: 1–5 UCI moves, E: one number per move, B: UCI);
* ``p_all5_legal`` — P: completions with exactly five M: moves, all legal in the position;
* ``p_best_legal`` — P: completions whose B: move is legal;
* ``a_fen_exact`` — A: completions whose new FEN equals the arbiter's (python-chess) FEN;
  ``a_exact`` (whole completion incl. reward/flags) and ``a_well_formed`` alongside;
* ``p_group_nonzero_std`` — share of P: prompts whose group of ``group_size`` (8) samples has a
  non-zero reward std under the default P: reward (:mod:`rookworld_debug.chess.rewards`, Stockfish).

All P: rates are over every sample (``n_prompts`` × ``group_size``); A: over ``n_prompts`` × ``a_samples``.
``model_or_path``: a loaded model (then pass ``tokenizer=``), ``"tiny"``, a local folder, or an HF id
(fails with ModelLoadError when offline). ``main(argv)`` is the CLI (``python -m
rookworld_debug.models.measure tiny --n-prompts 100 --json out.json``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import chess

from rookworld_debug.errors import ModelLoadError

P_SAMPLING = dict(temperature=0.5, top_p=0.9)
A_SAMPLING = dict(temperature=0.95, top_p=0.95)
TARGETS = {"p_well_formed": 0.95, "p_all5_legal": 0.50, "p_best_legal": 0.80, "a_fen_exact": 0.50,
           "p_group_nonzero_std": 0.75}
TINY_DIR = Path(__file__).resolve().parent / "tiny"


def _load(model_or_path, tokenizer=None):
    if not isinstance(model_or_path, (str, Path)):
        if tokenizer is None:
            raise ModelLoadError("measure(model) needs tokenizer= when given a loaded model")
        return model_or_path, tokenizer, getattr(model_or_path, "name_or_path", type(model_or_path).__name__)
    name = str(model_or_path)
    path = TINY_DIR if name == "tiny" else Path(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.is_dir():
        src = str(path)
    else:
        from rookworld_debug.models.loading import hub_offline, probe_hub

        if hub_offline():
            raise ModelLoadError(f"{name!r} is not a local folder and HF_HUB_OFFLINE is set: cannot fetch it")
        problem = probe_hub()
        if problem:
            raise ModelLoadError(f"{name!r} is not a local folder and the hub is unreachable ({problem})")
        src = name
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype="float32")
    except Exception as e:
        raise ModelLoadError(f"cannot load {name!r}: {type(e).__name__}: {e}") from None
    return model, tok, name


def sample_completions(model, tok, prompts, *, n: int, temperature: float, top_p: float, max_new_tokens: int = 160,
                       seed: int = 0, batch_size: int = 64) -> list[list[str]]:
    """``n`` sampled completions per prompt (left padding, eos = pad); returns a list per prompt."""
    import torch

    model.eval()
    old_side = tok.padding_side
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    out: list[list[str]] = []
    per = max(1, batch_size // n)
    torch.manual_seed(seed)
    try:
        for i in range(0, len(prompts), per):
            chunk = prompts[i:i + per]
            enc = tok(chunk, return_tensors="pt", padding=True)
            with torch.no_grad():
                gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                     max_new_tokens=max_new_tokens, num_return_sequences=n,
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # (b*n, P+T)
            texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            for j in range(len(chunk)):
                out.append(texts[j * n:(j + 1) * n])
    finally:
        tok.padding_side = old_side
    return out


def _legal(board: chess.Board, uci: str | None) -> bool:
    if not uci:
        return False
    try:
        return board.is_legal(chess.Move.from_uci(uci))
    except ValueError:
        return False


def p_metrics(fen: str, completion: str) -> dict:
    from rookworld_debug.chess.formats import parse_p_completion

    c = parse_p_completion(completion)
    board = chess.Board(fen)
    legal = [_legal(board, m) for m in c.moves]
    return dict(well_formed=c.ok, all5_legal=c.ok and len(c.moves) == 5 and all(legal) and len(set(c.moves)) == 5,
                best_legal=_legal(board, c.best))


def _default_p_reward(engine_depth: int = 10):
    """A function (prompts, completions) -> rewards using the project's default P: reward."""
    from rookworld_debug.chess import rewards

    return rewards.default_p_reward_fn(depth=engine_depth)


def measure(model_or_path="tiny", *, tokenizer=None, n_prompts: int = 50, seed: int = 0, group_size: int = 8,
            a_samples: int = 1, max_new_tokens: int = 160, engine_depth: int = 10, reward_fn=None,
            with_rewards: bool = True, batch_size: int = 96, progress=None) -> dict:
    """Sample on held-out prompts and compute the issue-3 metrics (see module doc)."""
    import torch

    from rookworld_debug.chess.arbiter import expected_a_completion
    from rookworld_debug.chess.formats import parse_a_completion
    from rookworld_debug.data.loaders import load_heldout

    t0 = time.time()
    model, tok, name = _load(model_or_path, tokenizer)
    p_held = load_heldout("P")[:n_prompts]
    a_held = load_heldout("A")[:n_prompts]
    torch.manual_seed(seed)
    p_prompts = [s.prompt for s in p_held]
    p_out = sample_completions(model, tok, p_prompts, n=group_size, max_new_tokens=max_new_tokens, seed=seed,
                               batch_size=batch_size, **P_SAMPLING)
    t_p = time.time()
    rows = []
    for s, comps in zip(p_held, p_out):
        fen = s.prompt[3:].strip()
        rows.append([p_metrics(fen, c) for c in comps])
    flat = [m for r in rows for m in r]
    res = dict(model=name, n_p_prompts=len(p_held), n_p_samples=len(flat), group_size=group_size,
               p_well_formed=_rate(m["well_formed"] for m in flat), p_all5_legal=_rate(m["all5_legal"] for m in flat),
               p_best_legal=_rate(m["best_legal"] for m in flat))
    if progress:
        progress(f"P sampled in {t_p - t0:.1f}s")
    a_prompts = [s.prompt for s in a_held]
    a_out = sample_completions(model, tok, a_prompts, n=a_samples, max_new_tokens=max_new_tokens, seed=seed + 1,
                               batch_size=batch_size, **A_SAMPLING)
    exact_fen, exact_all, wf = [], [], []
    for s, comps in zip(a_held, a_out):
        want = expected_a_completion(s.prompt)
        want_fen = want.split("+")[0]
        for c in comps:
            pc = parse_a_completion(c)
            wf.append(pc.ok)
            exact_fen.append(pc.new_fen == want_fen)
            exact_all.append(c.strip() == want)
    res.update(n_a_prompts=len(a_held), n_a_samples=len(exact_fen), a_fen_exact=_rate(exact_fen),
               a_exact=_rate(exact_all), a_well_formed=_rate(wf))
    t_a = time.time()
    if progress:
        progress(f"A sampled in {t_a - t_p:.1f}s")
    if with_rewards:
        fn = reward_fn or _default_p_reward(engine_depth)
        stds, means = [], []
        try:
            for s, comps in zip(p_held, p_out):
                r = [float(x) for x in fn([s.prompt] * len(comps), comps)]
                stds.append(statistics.pstdev(r))
                means.append(statistics.fmean(r))
        finally:
            if reward_fn is None and hasattr(fn, "close"):
                fn.close()
        res.update(p_group_nonzero_std=_rate(sd > 1e-9 for sd in stds), p_reward_mean=round(statistics.fmean(means), 4),
                   p_reward_std_mean=round(statistics.fmean(stds), 4))
        if progress:
            progress(f"rewards in {time.time() - t_a:.1f}s")
    res["targets"] = {k: dict(target=v, value=res.get(k), met=(res.get(k) is not None and res[k] >= v))
                      for k, v in TARGETS.items()}
    res["settings"] = dict(seed=seed, p_sampling=P_SAMPLING, a_sampling=A_SAMPLING, top_k=0,
                           max_new_tokens=max_new_tokens, engine_depth=engine_depth, prompts="bundled heldout split")
    res["examples"] = dict(p=[p_prompts[0] + p_out[0][0]] if p_out else [],
                           a=[a_prompts[0] + a_out[0][0]] if a_out else [])
    res["seconds"] = round(time.time() - t0, 1)
    return res


def _rate(xs) -> float:
    xs = list(xs)
    return round(sum(bool(x) for x in xs) / len(xs), 4) if xs else float("nan")


def format_table(res: dict) -> str:
    lines = [f"model {res['model']}: P {res['n_p_prompts']} prompts x {res['group_size']} samples, "
             f"A {res['n_a_samples']} samples, {res['seconds']} s"]
    for k, t in res["targets"].items():
        v = t["value"]
        lines.append(f"  {k:22s} {('%.1f%%' % (100 * v)) if v is not None else 'n/a':>8}   target >= {100 * t['target']:.0f}%"
                     f"   {'met' if t['met'] else 'NOT met'}")
    for k in ("a_exact", "a_well_formed", "p_reward_mean", "p_reward_std_mean"):
        if k in res:
            lines.append(f"  {k:22s} {res[k]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld-debug measure", description="Re-measure the issue-3 metrics.")
    ap.add_argument("model", nargs="?", default="tiny", help="'tiny', a local folder, or an HF id")
    ap.add_argument("--n-prompts", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--engine-depth", type=int, default=10)
    ap.add_argument("--no-rewards", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the result dict here")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    torch.set_num_threads(a.threads)
    try:
        res = measure(a.model, n_prompts=a.n_prompts, seed=a.seed, group_size=a.group_size,
                      engine_depth=a.engine_depth, with_rewards=not a.no_rewards,
                      progress=lambda m: print(f"[measure] {m}", file=sys.stderr, flush=True))
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
