"""Measure a RookWorld model: format, legality and A: exactness.

``measure_fresh(model_or_path, n_positions=..., seed=...)`` (the default of ``rookworld-debug measure``)
judges the model on **fresh random-play positions made at run time** (:mod:`rookworld_debug.data.positions`;
nothing stored, the seed is not one of the training data's):

* ``p_well_formed`` — sampled P: completions (T 0.5, top-p 0.9, top-k off; ``group_size`` per position)
  that follow the P: grammar (M: 1–5 UCI moves, E: one number per move, B: UCI). A repeated M: move is
  grammatical (a greedy ``M: d7d5 d7d5 …`` counts as well-formed); ``strict_rates``
  adds ``p_well_formed_distinct`` / ``p_greedy_well_formed_distinct`` (no repeats: the reward's
  ``format_ok``), and ``p_all5_legal`` needs five distinct moves;
* ``p_best_legal`` — sampled P: completions whose B: move is legal in the position;
* ``p_all5_legal`` — sampled P: completions with exactly five distinct M: moves, all legal;
* ``p_greedy_well_formed`` — greedy P: completions (one per position) that follow the grammar;
* ``a_greedy_exact`` — greedy A: completions equal to the arbiter's (python-chess) whole completion
  (new FEN + reward + terminated + truncated), over a case mix that includes illegal moves (``-1.0``,
  truncated) and game ends (``1.0``/``0.5``, terminated); broken down by case kind.

These are **the fresh-position rates**, with their targets in ``FRESH_TARGETS``. Beside them,
``measure_fresh`` measures greedy A: exact **by band of game length and by case kind** (a second generator,
:func:`rookworld_debug.data.positions.band_a_cases`; targets ``BAND_TARGETS``) and the P: rates on real
RookWorld P: lines (``--real-p``).

Every rate comes with its n and a Wilson 95 % interval. ``measure(...)`` is **the held-out measurement** on
the bundled held-out split (kept so the earliest weights compare; targets ``TARGETS``). ``model_or_path``: a loaded model (then pass
``tokenizer=``), ``"tiny"``, a local folder, or an HF id (fails with ModelLoadError when offline).
CLI: ``rookworld-debug measure tiny --n-positions 200 --seed 777 --json out.json`` (``--heldout`` for the
held-out measurement).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rookworld_debug import cliargs

import chess

from rookworld_debug.errors import ConfigError, ModelLoadError

P_SAMPLING = dict(temperature=0.5, top_p=0.9)
A_SAMPLING = dict(temperature=0.95, top_p=0.95)
TARGETS = {"p_well_formed": 0.95, "p_all5_legal": 0.50, "p_best_legal": 0.80, "a_fen_exact": 0.50,
           "p_group_nonzero_std": 0.75}  # the held-out measurement (bundled held-out split)
FRESH_TARGETS = {"p_well_formed": 0.95, "p_best_legal": 0.80, "p_all5_legal": 0.50, "p_greedy_well_formed": 0.95,
                 "a_greedy_exact": 0.80}  # the fresh-position rates (fresh random-play positions)
BAND_TARGETS = {"a_band_exact": 0.95, "a_kind_legal": 0.97, "a_kind_illegal": 0.95, "a_kind_game_end": 0.90,
                "real_p_best_legal": 0.90, "real_p_all5_legal": 0.75}  # by band / kind of A: case, real P: lines
# 250 real P: lines of RookWorld's validation file, beside the checkout (present in the project's workspace)
REAL_P_LINES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "rook_p_lines.txt"


def _load(model_or_path, tokenizer=None, device: str = "cpu"):
    from rookworld_debug.models.devices import check_device
    dev = check_device(device, "--device")             # a typo or a missing GPU: before any loading
    if not isinstance(model_or_path, (str, Path)):
        if tokenizer is None:
            raise ModelLoadError("measure(model) needs tokenizer= when given a loaded model")
        return model_or_path, tokenizer, getattr(model_or_path, "name_or_path", type(model_or_path).__name__)
    from rookworld_debug.models.loading import TINY_DIR    # the bundled weights stay in models/ (imports torch)
    name = str(model_or_path)
    path = TINY_DIR if name == "tiny" else Path(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.is_dir():
        from rookworld_debug.models.custom_code import refuse_custom_code
        refuse_custom_code(path)
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
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(src, dtype="float32", trust_remote_code=False)
    except Exception as e:
        raise ModelLoadError(f"cannot load {name!r}: {type(e).__name__}: {e}") from None
    return model.to(dev), tok, name


def sample_completions(model, tok, prompts, *, n: int, temperature: float | None, top_p: float = 1.0,
                       max_new_tokens: int = 160, seed: int = 0, batch_size: int = 64) -> list[list[str]]:
    """``n`` sampled completions per prompt (left padding, eos = pad); returns a list per prompt.
    ``temperature=None`` decodes greedily."""
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
            enc = tok(chunk, return_tensors="pt", padding=True).to(model.device)   # the prompts cross here
            with torch.no_grad():
                decode = (dict(do_sample=False) if temperature is None
                          else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0))
                gen = model.generate(**enc, **decode, max_new_tokens=max_new_tokens, num_return_sequences=n,
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
    # well-formed = the P: grammar (a greedy "M: d7d5 d7d5 …" is well-formed: the grammar allows repeats);
    # distinct moves are judged by all5_legal and by the strict well_formed_distinct (= the reward's format_ok)
    grammar = all(p == "repeated move" for p in c.problems)
    return dict(well_formed=grammar, well_formed_distinct=c.ok,
                all5_legal=c.ok and len(c.moves) == 5 and all(legal) and len(set(c.moves)) == 5,
                best_legal=_legal(board, c.best))


def _default_p_reward(engine_depth: int = 10):
    """A function (prompts, completions) -> rewards using the project's default P: reward."""
    from rookworld_debug.chess import rewards

    return rewards.default_p_reward_fn(depth=engine_depth)


def measure(model_or_path="tiny", *, tokenizer=None, n_prompts: int = 50, seed: int = 0, group_size: int = 8,
            a_samples: int = 1, max_new_tokens: int = 160, engine_depth: int = 10, reward_fn=None,
            with_rewards: bool = True, batch_size: int = 96, progress=None, device: str = "cpu") -> dict:
    """Sample on held-out prompts and compute the held-out measurement's metrics (see module doc)."""
    import torch

    from rookworld_debug.chess.arbiter import expected_a_completion
    from rookworld_debug.chess.formats import parse_a_completion
    from rookworld_debug.data.loaders import load_heldout

    t0 = time.time()
    model, tok, name = _load(model_or_path, tokenizer, device)
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
               p_well_formed=_rate(m["well_formed_distinct"] for m in flat), p_all5_legal=_rate(m["all5_legal"] for m in flat),
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


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion k/n (good near 0 and 1, unlike the normal one)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return (round(max(0.0, c - h), 4), round(min(1.0, c + h), 4))


def _stat(flags) -> dict:
    flags = [bool(x) for x in flags]
    k, n = sum(flags), len(flags)
    return dict(value=round(k / n, 4) if n else float("nan"), k=k, n=n, ci95=wilson(k, n))


def measure_fresh(model_or_path="tiny", *, tokenizer=None, n_positions: int = 200, seed: int = 777,
                  group_size: int = 8, max_new_tokens: int = 160, batch_size: int = 96, progress=None,
                  n_per_band: int = 60, real_p=REAL_P_LINES, n_real_p: int | None = None, device: str = "cpu") -> dict:
    """The fresh-position rates on fresh random-play positions (see module doc); each as value/k/n/ci95."""
    from rookworld_debug.data.positions import a_cases, random_play_positions

    t0 = time.time()
    model, tok, name = _load(model_or_path, tokenizer, device)
    t_load = time.time() - t0
    fens = [f for f, _ in random_play_positions(n_positions, seed)]
    prompts = [f"P: {f}" for f in fens]
    sampled = sample_completions(model, tok, prompts, n=group_size, max_new_tokens=max_new_tokens, seed=seed,
                                 batch_size=batch_size, **P_SAMPLING)
    greedy = sample_completions(model, tok, prompts, n=1, temperature=None, max_new_tokens=max_new_tokens,
                                batch_size=batch_size)
    sm = [p_metrics(f, c) for f, cs in zip(fens, sampled) for c in cs]
    gm = [p_metrics(f, cs[0]) for f, cs in zip(fens, greedy)]
    if progress:
        progress(f"P sampled + greedy in {time.time() - t0:.1f}s")
    cases = a_cases(n_positions, seed)
    a_out = sample_completions(model, tok, [c.prompt for c in cases], n=1, temperature=None,
                               max_new_tokens=max_new_tokens, batch_size=batch_size)
    exact = [out[0].strip() == c.expected for c, out in zip(cases, a_out)]
    rates = dict(p_well_formed=_stat(m["well_formed"] for m in sm), p_best_legal=_stat(m["best_legal"] for m in sm),
                 p_all5_legal=_stat(m["all5_legal"] for m in sm),
                 p_greedy_well_formed=_stat(m["well_formed"] for m in gm), a_greedy_exact=_stat(exact))
    strict = dict(p_well_formed_distinct=_stat(m["well_formed_distinct"] for m in sm),
                  p_greedy_well_formed_distinct=_stat(m["well_formed_distinct"] for m in gm))
    by_kind = {k: _stat(e for e, c in zip(exact, cases) if c.kind == k) for k in ("legal", "illegal", "game_end")}
    bands = measure_bands(model, tok, n_per_band=n_per_band, seed=seed, max_new_tokens=max_new_tokens,
                          batch_size=batch_size) if n_per_band > 0 else None
    if progress:
        progress(f"A by band in {time.time() - t0:.1f}s")
    real = (measure_real_p(model, tok, real_p, group_size=group_size, seed=seed, max_new_tokens=max_new_tokens,
                           batch_size=batch_size, limit=n_real_p) if real_p and Path(real_p).is_file() else None)
    return dict(model=name, bands=bands, real_p=real, band_targets=band_targets(bands, real), rates=rates, strict_rates=strict, a_greedy_exact_by_kind=by_kind,
                load_seconds=round(t_load, 2),
                targets={k: dict(target=v, value=rates[k]["value"], met=rates[k]["value"] >= v)
                         for k, v in FRESH_TARGETS.items()},
                settings=dict(positions="fresh random play (data.positions)", seed=seed, n_positions=n_positions,
                              group_size=group_size, p_sampling=P_SAMPLING, top_k=0, greedy="do_sample=False",
                              max_new_tokens=max_new_tokens, a_case_mix="10% illegal, 10% game end, 80% legal"),
                examples=dict(p_sampled=prompts[0] + sampled[0][0], p_greedy=prompts[0] + greedy[0][0],
                              a_greedy=cases[0].prompt + a_out[0][0]),
                seconds=round(time.time() - t0, 1))


def read_real_p_lines(path) -> list[tuple[str, str]]:
    """(fen, B: label) of each real P: line (``P: <fen padded> M: … E: … B: <move>``; parsed by tags, as the
    fixture's README says). A line that does not parse is a FormatError naming the file and line."""
    from rookworld_debug.chess.formats import check_fen, parse_p_completion
    from rookworld_debug.errors import FormatError

    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        head, sep, tail = line.partition("M: ")
        c = parse_p_completion("M: " + tail) if sep and head.startswith("P: ") else None
        if c is None or not c.best:
            raise FormatError(f"{path}:{i}: not a P: line with a B: label: {line[:60]!r}")
        fen = head[3:].strip()
        check_fen(fen)
        out.append((fen, c.best))
    return out


def measure_real_p(model, tok, path, *, group_size: int = 8, seed: int = 777, max_new_tokens: int = 160,
                   batch_size: int = 96, limit: int | None = None) -> dict:
    """Sampled (P_SAMPLING) and greedy P: on real RookWorld positions: B: legal, all 5 M: legal, B: = label.
    ``limit``: the first n lines only (None: all)."""
    rows = read_real_p_lines(path)[:limit]
    prompts = [f"P: {f}" for f, _ in rows]
    sampled = sample_completions(model, tok, prompts, n=group_size, max_new_tokens=max_new_tokens, seed=seed,
                                 batch_size=batch_size, **P_SAMPLING)
    greedy = sample_completions(model, tok, prompts, n=1, temperature=None, max_new_tokens=max_new_tokens,
                                batch_size=batch_size)
    from rookworld_debug.chess.formats import parse_p_completion

    def rates(outs, tag):
        m = [(p_metrics(f, c), parse_p_completion(c).best == label) for (f, label), cs in zip(rows, outs) for c in cs]
        return {f"{tag}_best_legal": _stat(x["best_legal"] for x, _ in m),
                f"{tag}_all5_legal": _stat(x["all5_legal"] for x, _ in m),
                f"{tag}_best_eq_label": _stat(eq for _, eq in m),
                f"{tag}_well_formed": _stat(x["well_formed"] for x, _ in m)}

    return dict(file=str(path), n_positions=len(rows), **rates(sampled, "real_p"), **rates(greedy, "real_p_greedy"))


def measure_bands(model, tok, *, n_per_band: int = 60, seed: int = 777, max_new_tokens: int = 160,
                  batch_size: int = 96) -> dict:
    """Greedy A: exact by band of fullmove number and by case kind, on :func:`band_a_cases` (uniformly
    random play to a ply in the band: a generator that differs from the training data's)."""
    from rookworld_debug.data.positions import band_a_cases

    cases = band_a_cases(n_per_band, seed)
    outs = sample_completions(model, tok, [c.prompt for _, c in cases], n=1, temperature=None,
                              max_new_tokens=max_new_tokens, batch_size=batch_size)
    exact = [o[0].strip() == c.expected for (_, c), o in zip(cases, outs)]
    bands = dict.fromkeys(b for b, _ in cases)
    wrong = [dict(band=b, kind=c.kind, prompt=c.prompt, expected=c.expected, got=o[0].strip())
             for (b, c), o, e in zip(cases, outs, exact) if not e]
    return dict(generator="data.positions.band_a_cases: uniformly random play to a ply drawn in the band "
                          "(training data: data.games, engine-mixed games played to their end)",
                n_per_band=n_per_band, seed=seed,
                by_band={b: _stat(e for e, (bb, _) in zip(exact, cases) if bb == b) for b in bands},
                by_kind={k: _stat(e for e, (_, c) in zip(exact, cases) if c.kind == k)
                         for k in ("legal", "illegal", "game_end")},
                wrong_examples=wrong[:10])


def band_targets(bands: dict | None, real: dict | None) -> dict:
    """The band targets: each band's greedy A: exact, each case kind's, and the real P: lines' sampled rates."""
    out = {}
    if bands:
        for b, r in bands["by_band"].items():
            out[f"a_band_exact[{b}]"] = (r, BAND_TARGETS["a_band_exact"])
        for k, r in bands["by_kind"].items():
            out[f"a_kind_{k}"] = (r, BAND_TARGETS[f"a_kind_{k}"])
    if real:
        for k in ("real_p_best_legal", "real_p_all5_legal"):
            out[k] = (real[k], BAND_TARGETS[k])
    return {k: dict(target=t, value=r["value"], n=r["n"], ci95=r["ci95"], met=r["value"] >= t)
            for k, (r, t) in out.items()}


def format_fresh_table(res: dict) -> str:
    s = res["settings"]
    lines = [f"model {res['model']} (loaded in {res['load_seconds']} s): {s['n_positions']} fresh random-play "
             f"positions, seed {s['seed']}, {s['group_size']} samples each, {res['seconds']} s"]
    for k, t in res["targets"].items():
        r = res["rates"][k]
        lines.append(f"  {k:22s} {100 * r['value']:6.1f}%  [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]"
                     f"  n={r['n']:<5d} target >= {100 * t['target']:.0f}%  {'met' if t['met'] else 'NOT met'}")
    for k, r in res.get("strict_rates", {}).items():
        lines.append(f"    {k:30s} {100 * r['value']:6.1f}%  n={r['n']}  (grammar and no repeated M: move)")
    for k, r in res["a_greedy_exact_by_kind"].items():
        lines.append(f"    A exact, {k:9s} {100 * r['value']:6.1f}%  n={r['n']}")
    if res.get("band_targets"):
        lines.append(f"A: exact by game-length band and case kind ({res['bands']['generator']}, seed "
                     f"{res['bands']['seed']}); real P: {res['real_p']['file'] if res.get('real_p') else 'not measured'}")
        for k, t in res["band_targets"].items():
            lines.append(f"  {k:24s} {100 * t['value']:6.1f}%  [{100 * t['ci95'][0]:.1f}, {100 * t['ci95'][1]:.1f}]"
                         f"  n={t['n']:<5d} target >= {100 * t['target']:.0f}%  {'met' if t['met'] else 'NOT met'}")
        if res.get("real_p"):
            for k in ("real_p_best_eq_label", "real_p_well_formed", "real_p_greedy_best_legal", "real_p_greedy_all5_legal"):
                r = res["real_p"][k]
                lines.append(f"    {k:28s} {100 * r['value']:6.1f}%  [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]"
                             f"  n={r['n']}")
    return "\n".join(lines)


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
    ap = argparse.ArgumentParser(prog="rookworld-debug measure",
                                 description="Format/legality/A:-exact rates of a model on fresh random-play positions.")
    ap.add_argument("model", nargs="?", default="tiny", help="'tiny', a local folder, or an HF id")
    ap.add_argument("--model", dest="model_opt", default=None, metavar="MODEL", help="the same, as an option")
    ap.add_argument("--n-positions", type=int, default=200, help="fresh positions (P: and A: each)")
    ap.add_argument("--n-per-band", type=int, default=60,
                    help="A: cases per band of fullmove number (1-20 … 81+); 0 = skip the band measurement")
    ap.add_argument("--n-real-p", type=int, default=None, help="measure only the first N real P: lines (default all)")
    ap.add_argument("--real-p", default=str(REAL_P_LINES),
                    help="real RookWorld P: lines to measure on when the file exists ('' = skip)")
    ap.add_argument("--heldout", action="store_true", help="the held-out measurement (bundled held-out split) instead")
    ap.add_argument("--n-prompts", type=int, default=50, help="--heldout: prompts of the held-out split")
    ap.add_argument("--seed", type=int, default=777)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--engine-depth", type=int, default=10)
    ap.add_argument("--no-rewards", action="store_true")
    cliargs.add_threads(ap)
    ap.add_argument("--device", default="cpu", help="'cpu' (default), 'cuda', 'cuda:N', 'mps' or 'auto'")
    ap.add_argument("--json", default=None, help="write the result dict here")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    a.model = a.model_opt or a.model
    for flag, v, lo in (("--n-positions", a.n_positions, 1), ("--group-size", a.group_size, 1),
                        ("--n-per-band", a.n_per_band, 0), ("--n-prompts", a.n_prompts, 1), ("--threads", a.threads, 1),
                        ("--n-real-p", 1 if a.n_real_p is None else a.n_real_p, 1)):
        if v < lo:
            ap.error(f"{flag} must be ≥ {lo}, got {v}")
    import torch

    torch.set_num_threads(a.threads)
    progress = lambda m: print(f"[measure] {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if a.heldout:
            res = measure(a.model, n_prompts=a.n_prompts, seed=a.seed, group_size=a.group_size,
                          engine_depth=a.engine_depth, with_rewards=not a.no_rewards, progress=progress,
                          device=a.device)
        else:
            res = measure_fresh(a.model, n_positions=a.n_positions, seed=a.seed, group_size=a.group_size,
                                progress=progress, n_per_band=a.n_per_band, real_p=a.real_p or None,
                                n_real_p=a.n_real_p, device=a.device)
    except (ModelLoadError, ConfigError) as e:
        print(f"rookworld-debug measure: error: {e}", file=sys.stderr)
        return 2
    print(format_table(res) if a.heldout else format_fresh_table(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
