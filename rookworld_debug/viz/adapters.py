"""Thin adapters: phase records (Rollout, Rewards, Advantages, LossBreakdown, UpdateResult, Evaluation,
Setup) or a whole StepTrace → the plain-array views. Only field picking and slicing happens here;
the one arithmetic product (A·logp for the `adv_x_logp` strip) is a labelled display quantity.

A `trace` is a `StepTrace` (the panel's and one PPO pass's views are StepTraces too, built with
`dataclasses.replace`); a phase it lacks (None: no update, no evaluation, a TRL capture's missing eval) is
skipped.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from ._style import to_numpy, truncate, visible_ws_text
from .banners import Flag, flags_from_records, warning_banner
from .board import BoardView, board_from_prompt
from .htmlview import HTMLView
from .plots import (before_after_figure, delta_logp_scatter, grad_norm_figure, loss_waterfall, per_sequence_bar,
                    reward_breakdown_figure, token_heatmap)
from .tables import advantage_table, before_after_table, invariants_table, provenance_table, reward_components_table
from .tokens import METRICS, Metric, TokenStrip, TokenText, token_metric_stack, token_strips, token_text_from_raw

__all__ = ["decode_bpe_token", "completion_token_texts", "rollout_token_strips", "token_strips_from_trace",
           "completion_metrics_from_trace",
           "advantage_table_from_trace", "reward_components_table_from_trace", "reward_breakdown_from_trace",
           "loss_waterfall_from_trace", "token_heatmap_from_trace", "per_sequence_kl_from_trace",
           "grad_norms_from_trace", "before_after_table_from_trace", "before_after_figure_from_trace",
           "delta_logp_scatter_from_trace", "board_from_trace", "banner_from_trace", "invariants_table_from_trace",
           "provenance_table_from_trace", "flags_from_trace"]


# ----------------------------------------------------------------------------------------- tokens
def decode_bpe_token(tok: str) -> str:
    """A recorded token string ('ĠM', 'Ã©', '<|endoftext|>') → its decoded text (' M', 'é'); bytes of an
    incomplete UTF-8 character decode to U+FFFD. For display use `token_text_from_raw(tok).label`."""
    return token_text_from_raw(tok).text


def completion_token_texts(rollout: Any) -> list[list[TokenText]]:
    """Per completion, its tokens rendered from their bytes (Rollout.completion_tokens, byte-level)."""
    return [[token_text_from_raw(t) for t in row] for row in rollout.completion_tokens]


def _topk_rows(rollout: Any, row: int, n: int) -> list[list[tuple[TokenText, float, int]]]:
    """Per position, the top-k alternatives as (token, logp, id): the id lets the view mark the sampled one."""
    toks, lp = rollout.topk_tokens[row], _opt(rollout, "topk_logps")
    ids = getattr(rollout, "topk_ids", None)
    ids = to_numpy(ids, dtype=np.int64) if ids is not None else None
    out = []
    for t in range(n):
        if t >= len(toks):
            out.append([])
            continue
        out.append([(token_text_from_raw(a), float(lp[row, t, k])) + ((int(ids[row, t, k]),) if ids is not None else ())
                    for k, a in enumerate(toks[t])])
    return out


def _opt(record: Any, name: str) -> np.ndarray | None:
    v = getattr(record, name, None) if record is not None else None
    return None if v is None else to_numpy(v, dtype=float)


def _metric_values(metric: str, rollout: Any, loss: Any, advantages: Any, evaluation: Any) -> np.ndarray:
    """(N, T) values of a metric preset, from the record that owns it."""
    src = {
        "logp": ("rollout", rollout, "per_token_logps"), "ref_logp": ("rollout", rollout, "ref_per_token_logps"),
        "entropy": ("rollout", rollout, "per_token_entropy"), "full_kl": ("rollout", rollout, "per_token_full_kl"),
        "kl": ("loss", loss, "per_token_kl"), "ratio": ("loss", loss, "per_token_ratio"),
        "pg": ("loss", loss, "per_token_pg"), "loss": ("loss", loss, "per_token_loss"),
        "delta_logp": ("evaluation", evaluation, "delta_logp"),
    }
    if metric == "adv_x_logp":
        if advantages is None:
            raise ValueError("metric 'adv_x_logp' needs the Advantages record")
        a = to_numpy(advantages.advantages).ravel()
        # display product A_i · logp_t (labelled in METRICS["adv_x_logp"]); no loss semantics implied
        return a[:, None] * to_numpy(rollout.per_token_logps)
    if metric not in src:
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(src) + ['adv_x_logp']}")
    owner, record, field = src[metric]
    vals = _opt(record, field)
    if vals is None:
        raise ValueError(f"metric {metric!r} needs {owner}.{field}, which is missing (pass the {owner} record)")
    return vals


def _metric_for(metric: str, loss: Any) -> Metric:
    """The preset, with the KL estimator and the loss formula of THIS record (k1/k2/k3/full, bias
    correction), so a strip never claims k3 when the run used another estimator."""
    m = METRICS[metric]
    if loss is None:
        return m
    if metric == "kl":
        est = str(getattr(loss, "kl_estimator", "k3"))
        try:
            from rookworld_debug.grpo.objective.loss import KL_FORMULAS
            formula = KL_FORMULAS.get(est, est)
        except ImportError:
            formula = est
        bias = bool(getattr(loss, "use_bias_correction_kl", False)) and est != "full"
        return replace(m, name=f"per-token KL ({est})",
                       definition=f"per-token KL to the reference, {formula}{' × r (bias-corrected)' if bias else ''}, "
                                  "raw (not β-scaled), logits / T, sampled tokens (LossBreakdown.per_token_kl).")
    if metric in ("pg", "loss", "ratio") and getattr(loss, "definition", None):
        return replace(m, definition=f"{m.definition} Loss as recorded: {loss.definition}.")
    return m


def rollout_token_strips(rollout: Any, metric: str = "logp", *, rows: Sequence[int] | None = None, loss: Any = None,
                         advantages: Any = None, evaluation: Any = None, rewards: Any = None, topk: bool = True,
                         title: str | None = None, vocab_size: int | None = None,
                         scale: "str | float" = "batch", highlight: Mapping[tuple, Any] | None = None,
                         highlight_label: str = "highlighted") -> TokenStrip:
    """Token strips of the rollout's completions coloured by `metric`, with every other available
    per-token metric and the top-k alternatives in the hover; rows labelled p·g, reward, advantage.
    ratio strips outline the tokens the loss counted as clipped (low/high).

    `scale` (signed metrics: pg, adv_x_logp, Δlogp, …, and the advantage chips): "batch" = ±the largest
    |value| over ALL N rows even when `rows` shows a few (an advantage of −0.017 is then pale next to
    ±1.5, not saturated); "rows" = fitted to the shown rows; a number = an absolute ±scale.
    `highlight`: {(row, t): True or a tooltip string} of tokens to mark (`highlight_label` says why)."""
    N = len(rollout.completions)
    rows = list(range(N)) if rows is None else [int(r) for r in rows]
    G = int(getattr(rollout, "num_generations", 0) or getattr(advantages, "num_generations", 0) or 1)
    values = _metric_values(metric, rollout, loss, advantages, evaluation)
    toks = completion_token_texts(rollout)
    mask = to_numpy(rollout.completion_mask, dtype=bool)
    ids = to_numpy(rollout.completion_ids, dtype=np.int64)
    extra: dict[str, np.ndarray] = {}
    for name, rec, field in (("logp", rollout, "per_token_logps"), ("ref_logp", rollout, "ref_per_token_logps"),
                             ("entropy", rollout, "per_token_entropy"), ("full_kl", rollout, "per_token_full_kl"),
                             ("kl (k3)", loss, "per_token_kl"), ("ratio", loss, "per_token_ratio"),
                             ("pg", loss, "per_token_pg"), ("Δlogp", evaluation, "delta_logp")):
        v = _opt(rec, field)
        if v is not None:
            extra[name] = v
    topk_toks = getattr(rollout, "topk_tokens", None) if topk else None
    topk_lp = _opt(rollout, "topk_logps") if topk else None
    lo = _opt(loss, "is_clipped_low")
    hi = _opt(loss, "is_clipped_high")
    adv = _opt(advantages, "advantages")
    rew = _opt(advantages, "rewards") if advantages is not None else _opt(rewards, "rewards")
    trunc = _opt(rollout, "is_truncated")
    tasks = getattr(rollout, "tasks", None)

    T_rows, V_rows, M_rows, O_rows, H_rows, K_rows, I_rows, labels, infos = [], [], [], [], [], [], [], [], []
    for i in rows:
        n = len(toks[i])
        T_rows.append(toks[i])
        V_rows.append(values[i, :n])
        M_rows.append(mask[i, :n].tolist())
        I_rows.append(ids[i, :n].tolist())
        H_rows.append([{k: float(v[i, t]) for k, v in extra.items()} for t in range(n)])
        if metric == "ratio" and lo is not None and hi is not None:
            O_rows.append(["low" if lo[i, t] else "high" if hi[i, t] else False for t in range(n)])
        else:
            O_rows.append([False] * n)
        if topk_toks is not None and topk_lp is not None:
            K_rows.append(_topk_rows(rollout, i, n))
        task = f" {tasks[i]}:" if tasks is not None else ""
        labels.append(f"p{i // G}·g{i % G}{task}")
        info: dict[str, Any] = {}
        if rew is not None:
            info["reward"] = float(rew[i])
        if adv is not None:
            info["advantage"] = float(adv[i])
        if trunc is not None and trunc[i]:
            info["⚠"] = "truncated (no EOS)"
        infos.append(info)
    temps = _opt(rollout, "temperatures")
    note = ""
    if temps is not None and temps.size:
        uniq = sorted({float(t) for t in temps.ravel()})
        note = "Sampling temperature T = " + ", ".join(f"{t:g}" for t in uniq) + " (logits ÷ T in every logp/KL/entropy)."
    m = _metric_for(metric, loss)
    vmax = adv_half = None
    if scale != "rows":
        if isinstance(scale, (int, float)) and not isinstance(scale, bool):
            vmax, what = float(scale), "absolute scale chosen by the caller"
        elif scale == "batch":
            finite = values[mask & np.isfinite(values)]
            vmax, what = (float(np.abs(finite).max()) if finite.size else 0.0), f"largest |value| over all {N} rows"
        else:
            raise ValueError(f"scale must be 'batch', 'rows' or a number, got {scale!r}")
        if m.scale != "signed":
            vmax = None                    # sequential/ratio metrics keep their own (batch-percentile) range
        else:
            note = (note + " " if note else "") + f"Colour scale ±{vmax:.3g}: {what}."
        if adv is not None:
            fin = adv[np.isfinite(adv)]
            adv_half = float(scale) if isinstance(scale, (int, float)) else (float(np.abs(fin).max()) if fin.size else 0.0)
    return token_strips(T_rows, V_rows, metric=m, labels=labels, row_info=infos, masks=M_rows, outlines=O_rows,
                        hovers=H_rows, topk=K_rows if K_rows else None, token_ids=I_rows,
                        title=title if title is not None else f"{m.name} — rollout batch of this step",
                        note=note, outline_label="clipped by the loss (low: r < 1−ε_low, A<0 · high: r > 1+ε_high, A>0)",
                        vocab_size=vocab_size, vmax=vmax, adv_half=adv_half, highlight_label=highlight_label,
                        highlights=[[(highlight or {}).get((i, t), False) for t in range(len(toks[i]))] for i in rows]
                        if highlight else None)


def completion_metrics_from_trace(trace: Any, row: int = 0,
                                  metrics: Sequence[str] = ("logp", "ref_logp", "entropy", "kl", "ratio", "pg",
                                                            "delta_logp")) -> HTMLView:
    """One completion, one strip per available metric (each on its own scale), hover = all of them."""
    ro = trace.rollout
    loss, adv, ev = getattr(trace, "loss", None), getattr(trace, "advantages", None), getattr(trace, "evaluation", None)
    toks = completion_token_texts(ro)[row]
    n = len(toks)
    arrays = {}
    for m in metrics:
        try:
            arrays[m] = _metric_values(m, ro, loss, adv, ev)[row, :n]
        except ValueError:      # that phase is absent from this trace: skip its strip
            continue
    outline = None
    lo, hi = _opt(loss, "is_clipped_low"), _opt(loss, "is_clipped_high")
    if lo is not None and hi is not None:
        outline = ["low" if lo[row, t] else "high" if hi[row, t] else False for t in range(n)]
    topk_tok, topk_lp = getattr(ro, "topk_tokens", None), _opt(ro, "topk_logps")
    topk = None
    if topk_tok is not None and topk_lp is not None:
        topk = _topk_rows(ro, row, n)
    G = int(getattr(ro, "num_generations", 1) or 1)
    a = _opt(adv, "advantages")
    label = f"p{row // G}·g{row % G}: {truncate(visible_ws_text(str(ro.prompts[row]).strip()), 60)}"
    if a is not None:
        label += f" · advantage {float(a[row]):+.4g}"
    return token_metric_stack(toks, arrays, label=label, mask=to_numpy(ro.completion_mask, dtype=bool)[row, :n].tolist(),
                              outline=outline, topk=topk, token_ids=to_numpy(ro.completion_ids, dtype=np.int64)[row, :n].tolist(),
                              vocab_size=vocab_size_from_trace(trace))


def vocab_size_from_trace(trace: Any) -> int | None:
    """V of the model (its output rows, what the softmax runs over), from the setup's provenance."""
    prov = getattr(getattr(trace, "setup", None), "provenance", None) or getattr(trace, "provenance", None) or {}
    v = prov.get("embedding_rows") if isinstance(prov, Mapping) else getattr(prov, "embedding_rows", None)
    return int(v) if v else None


def token_strips_from_trace(trace: Any, metric: str = "logp", *, rows: Sequence[int] | None = None, **kw: Any) -> TokenStrip:
    kw.setdefault("vocab_size", vocab_size_from_trace(trace))
    return rollout_token_strips(trace.rollout, metric, rows=rows, loss=getattr(trace, "loss", None),
                                advantages=getattr(trace, "advantages", None),
                                evaluation=getattr(trace, "evaluation", None), rewards=getattr(trace, "rewards", None), **kw)


# ----------------------------------------------------------------------------------------- tables
def _breakdown_components(rewards: Any, n: int) -> tuple[list[dict] | None, dict | None]:
    if rewards is None:
        return None, None
    comps = getattr(rewards, "components", None)
    bds = getattr(rewards, "breakdowns", None)
    weights = None
    if bds:
        first = next((b for b in bds if b is not None), None)
        weights = dict(getattr(first, "weights", {}) or {}) if first is not None else None
    if isinstance(comps, Mapping) and comps:
        return [{k: float(v[i]) if v[i] is not None else math.nan for k, v in comps.items()} for i in range(n)], weights
    if bds:
        return [dict(getattr(b, "components", {}) or {}) if b is not None else {} for b in bds], weights
    return None, weights


def advantage_table_from_trace(trace: Any, **kw: Any):
    ro, adv = trace.rollout, trace.advantages
    n = len(ro.completions)
    comps, weights = _breakdown_components(getattr(trace, "rewards", None), n)
    trunc = _opt(ro, "is_truncated")
    row_flags = ["truncated (no EOS)" if trunc is not None and trunc[i] else "" for i in range(n)]
    rflags = getattr(getattr(trace, "rewards", None), "flags", None)
    if rflags is not None and len(rflags) == n:
        row_flags = ["; ".join(x for x in (row_flags[i], ", ".join(map(str, rflags[i] or ()))) if x) for i in range(n)]
    return advantage_table(ro.prompts, ro.completions, adv.rewards, adv.advantages,
                           num_generations=adv.num_generations, group_mean=adv.group_mean, group_std=adv.group_std,
                           normalization=adv.normalization, components=comps, weights=weights,
                           zero_std_groups=adv.zero_std_groups, denominator=getattr(adv, "denominator", None),
                           row_flags=row_flags if any(row_flags) else None, **kw)


def reward_components_table_from_trace(trace: Any, **kw: Any):
    ro, rw = trace.rollout, trace.rewards
    n = len(ro.completions)
    comps, weights = _breakdown_components(rw, n)
    G = int(getattr(ro, "num_generations", 1) or 1)
    return reward_components_table(ro.completions, comps or [{} for _ in range(n)], totals=rw.rewards, weights=weights,
                                   flags=getattr(rw, "flags", None), labels=[f"p{i // G}·g{i % G}" for i in range(n)],
                                   **kw)


def reward_breakdown_from_trace(trace: Any):
    """Stacked contributions: per reward function w_k·r_k when several functions are used, else the
    built-in reward's components w_k·c_k (RewardBreakdown weights)."""
    rw = trace.rewards
    G = int(getattr(trace.rollout, "num_generations", 1) or 1)
    names = list(getattr(rw, "func_names", ()) or ())
    per_func = _opt(rw, "rewards_per_func")
    if per_func is not None and len(names) > 1:
        w = list(getattr(rw, "weights", ()) or [1.0] * len(names))
        contrib = {f"{n} (w={w[k]:g})": w[k] * per_func[:, k] for k, n in enumerate(names)}
        definition = "bars: w_k·r_k per reward function (Rewards.rewards_per_func × weights); ◆ total = Rewards.rewards"
    else:
        bds = list(getattr(rw, "breakdowns", None) or ())
        if bds and all(b is not None and hasattr(b, "weighted") for b in bds):
            rows = [b.weighted() for b in bds]                       # the record's own w_k·c_k
        else:
            comps, weights = _breakdown_components(rw, len(trace.rollout.completions))
            rows = [{k: (weights or {}).get(k, 1.0) * v for k, v in c.items()} for c in (comps or [])]
        keys = list(dict.fromkeys(k for r in rows for k in r))
        contrib = {k: np.array([r.get(k, math.nan) for r in rows], dtype=float) for k in keys}
        definition = ("bars: w_k·c_k per component (RewardBreakdown.weighted(); absent = not applicable to the task); "
                      "◆ total = Rewards.rewards (as the reward function returned it, e.g. after clamping)")
    return reward_breakdown_figure(contrib, rw.rewards, num_generations=G, definition=definition)


# ----------------------------------------------------------------------------------------- loss
def loss_waterfall_from_trace(trace: Any):
    from rookworld_debug.metrics import GLOSSARY, term_balance
    lb = trace.loss
    f = lambda x: float(to_numpy(x).reshape(()))  # noqa: E731
    bal = term_balance(lb, getattr(trace, "update", None))
    norm = str(getattr(lb, "normalizer", ""))
    if getattr(lb, "definition", None):
        norm += f". Loss: {lb.definition}"
    return loss_waterfall(f(lb.pg_loss), f(lb.kl_loss), f(getattr(lb, "entropy_term", 0.0)), f(lb.loss),
                          kl_share=bal.kl_value_share, normalizer=norm, headline=bal.headline,
                          kl_share_definition="kl_share: " + GLOSSARY["kl_share"], beta=getattr(lb, "beta", None))


def token_heatmap_from_trace(trace: Any, metric: str = "kl"):
    ro = trace.rollout
    vals = _metric_values(metric, ro, getattr(trace, "loss", None), getattr(trace, "advantages", None),
                          getattr(trace, "evaluation", None))
    return token_heatmap(vals, ro.completion_mask, metric=_metric_for(metric, getattr(trace, "loss", None)),
                         tokens=completion_token_texts(ro),
                         num_generations=int(getattr(ro, "num_generations", 0) or 0) or None)


def per_sequence_kl_from_trace(trace: Any):
    lb = trace.loss
    if getattr(lb, "per_seq_kl", None) is None:
        raise ValueError("loss.per_seq_kl is None (no reference model / β = 0 without KL)")
    return per_sequence_bar(lb.per_seq_kl, metric=f"per-sequence KL ({getattr(lb, 'kl_estimator', 'k3')})",
                            unit="nats/token",
                            definition=f"masked mean over tokens of the raw per-token {getattr(lb, 'kl_estimator', 'k3')} "
                                       "KL (not β-scaled), LossBreakdown.per_seq_kl",
                            num_generations=getattr(lb, "num_generations", None))


def grad_norms_from_trace(trace: Any, **kw: Any):
    up = trace.update
    cfg = getattr(trace, "config", None) or getattr(getattr(trace, "setup", None), "config", None)
    return grad_norm_figure(up.per_layer, global_pre=up.grad_norm_pre_clip, global_post=up.grad_norm_post_clip,
                            max_grad_norm=getattr(cfg, "max_grad_norm", None), **kw)


# ----------------------------------------------------------------------------------------- evaluation
def _greedy_pair(trace: Any, which: str):
    ev = trace.evaluation
    before, after = getattr(ev, f"{which}_before"), getattr(ev, f"{which}_after")
    if before is None or after is None:
        raise ValueError(f"evaluation.{which}_before/after is None (disabled in this run)")
    return before, after


def before_after_table_from_trace(trace: Any, which: str = "batch"):
    b, a = _greedy_pair(trace, which)
    label = ("greedy decode of this step's B prompts" if which == "batch" else "greedy decode of the fixed held-out prompts")
    return before_after_table(b.prompts, b.rewards, a.rewards, before_text=b.completions, after_text=a.completions,
                              label=label + ", before vs after the update")


def before_after_figure_from_trace(trace: Any, which: str = "batch"):
    b, a = _greedy_pair(trace, which)
    labels = [f"#{i} {truncate(visible_ws_text(str(p).strip()), 18)}" for i, p in enumerate(b.prompts)]
    label = ("greedy decode of this step's B prompts" if which == "batch" else "greedy decode of the fixed held-out prompts")
    return before_after_figure(labels, b.rewards, a.rewards, label=label + ", before vs after the update")


def delta_logp_scatter_from_trace(trace: Any):
    ev, ro = trace.evaluation, trace.rollout
    r = float(ev.corr_adv_delta_logp)
    # the record's r when it has one; otherwise the view computes one and labels it as its own
    rec = math.isfinite(r)
    return delta_logp_scatter(trace.advantages.advantages, ev.delta_logp, ro.completion_mask,
                              correlation=r if rec else None,
                              correlation_label=("Pearson(A_i, per-sequence mean Δlogp_i) over rows, "
                                                 "Evaluation.corr_adv_delta_logp") if rec else None,
                              num_generations=int(getattr(ro, "num_generations", 0) or 0) or None)


# ----------------------------------------------------------------------------------------- misc
def board_from_trace(trace: Any, row: int = 0, **kw: Any) -> BoardView:
    ro = trace.rollout
    return board_from_prompt(ro.prompts[row], ro.completions[row], **kw)


def flags_from_trace(trace: Any) -> list[Flag]:
    """Structured checks on the records + the trace's own `flags` (every phase's warnings, in order),
    without repeating what a structured flag already says (zero-std groups, invariant failures)."""
    trace_flags = getattr(trace, "flags", None)
    flags = flags_from_records(rollout=getattr(trace, "rollout", None), advantages=getattr(trace, "advantages", None),
                               loss=getattr(trace, "loss", None), setup=getattr(trace, "setup", None),
                               update=getattr(trace, "update", None), record_flags=trace_flags is None)
    if trace_flags is not None:
        inv = getattr(getattr(getattr(trace, "setup", None), "invariants", None), "failures", ()) or ()
        covered = {str(x) for x in inv}
        for msg in trace_flags:
            msg = str(msg)
            if msg in covered or "zero reward std" in msg or "zero-std" in msg:
                continue
            refused = msg.startswith("update refused")
            if msg.startswith("policy looks untrained"):       # grpo.phases.generation.untrained_warning
                flags.append(Flag("looks_untrained", msg, "warning", "rollout.per_token_entropy vs ln V"))
                continue
            flags.append(Flag("update_refused" if refused else "step", msg, "error" if refused else "warning",
                              "trace.flags"))
    if getattr(trace, "update", "absent") is None:
        if not any(f.code == "update_refused" for f in flags):
            flags.append(Flag("no_update", "no optimizer step was taken (trace.update is None)", "error", "trace.update"))
    rw = getattr(trace, "rewards", None)
    per_row = getattr(rw, "flags", None) if rw is not None else None
    if per_row:
        counts: dict[str, int] = {}
        for fl in per_row:
            for f in fl or ():
                counts[str(f)] = counts.get(str(f), 0) + 1
        n = len(per_row)
        for code, c in sorted(counts.items(), key=lambda kv: -kv[1]):
            flags.append(Flag(f"reward:{code}", f"{c} of {n} completions", "info", "rewards.flags"))
    return flags


def banner_from_trace(trace: Any, **kw: Any) -> HTMLView:
    return warning_banner(flags_from_trace(trace), **kw)


def invariants_table_from_trace(trace: Any):
    inv = getattr(getattr(trace, "setup", None), "invariants", None) or getattr(trace, "invariants", None)
    if inv is None:
        raise ValueError("no setup.invariants in this trace")
    crit = "exactly 0 (criterion of grpo.phases.setup)"
    checks = {
        "policy logps == reference logps": {"passed": inv.max_abs_logp_diff == 0.0, "value": inv.max_abs_logp_diff,
                                            "expected": crit, "definition": "max |logπ − logπ_ref| over tokens"},
        "KL == 0": {"passed": inv.max_k3_kl == 0.0, "value": inv.max_k3_kl, "expected": crit,
                    "definition": "max per-token k3 KL(π‖π_ref)"},
        "ratio == 1": {"passed": inv.max_ratio_dev == 0.0, "value": inv.max_ratio_dev, "expected": crit,
                       "definition": "max |exp(logπ − logπ_old) − 1| between two identical forwards"},
        "dropout off": {"passed": not inv.dropout_active and not inv.policy_training_mode,
                        "value": f"{len(inv.dropout_active)} active module(s); training mode {inv.policy_training_mode}",
                        "expected": "0 active, eval mode", "definition": "modules with p > 0 in training mode"},
    }
    return invariants_table(checks, title=f"Step-0 invariants on {inv.n_tokens} tokens")


def provenance_table_from_trace(trace: Any):
    setup = getattr(trace, "setup", None)
    prov = dict(getattr(setup, "provenance", None) or getattr(trace, "provenance", None) or {})
    cfg = getattr(trace, "config", None) or getattr(setup, "config", None)
    if cfg is not None:
        prov["config"] = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
    return provenance_table(prov)
