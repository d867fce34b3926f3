"""pandas Stylers for the step's tables: advantages per group, reward components, before/after,
step-0 invariants, provenance, metrics.

Every function takes plain lists/arrays (or tensors) and labels, returns a `pandas.io.formats.style.Styler`
(renders in Jupyter; `.to_html()` for reports). Styler ids are derived from the content, so output is
deterministic yet two tables in one notebook never share CSS selectors. No matplotlib needed: colours
come from `_style` (same palette as the token strips).

No GRPO math here: advantages, group mean/std and zero-std groups are taken from the Advantages record.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

from ._style import (FAIL_BG, FAIL_FG, FONT_MONO, PASS_BG, PASS_FG, WARN_BG, WARN_FG, finite_abs_max, fmt,
                     fmt_signed, signed_cell_css, stable_id, to_numpy, truncate, visible_ws_text)

__all__ = ["advantage_table", "reward_components_table", "before_after_table", "invariants_table",
           "provenance_table", "metrics_table", "advantage_table_from_records"]

_TABLE_STYLES = [
    {"selector": "", "props": "border-collapse:collapse;font-size:12.5px;"},
    {"selector": "caption", "props": "caption-side:top;text-align:left;font-size:12.5px;color:#222;"
                                     "padding:4px 0 6px 0;min-width:36em;max-width:70em;"},
    {"selector": "th", "props": "background:#f3f3f3;color:#111;padding:3px 8px;border:1px solid #ddd;"
                                "text-align:left;vertical-align:top;font-weight:600;"},
    {"selector": "td", "props": "padding:3px 8px;border:1px solid #e3e3e3;vertical-align:top;"},
]


def _styler(df: pd.DataFrame, caption: str, *parts: Any) -> Styler:
    # escape="html" everywhere: completions are raw model output. Every later .format() call must pass
    # escape="html" again (a dict format resets the other columns to a non-escaping default).
    st = Styler(df, uuid=stable_id(caption, df.to_json(default_handler=str), *parts), cell_ids=False,
                escape="html", caption=caption)
    st = st.format_index(escape="html", axis=0).format_index(escape="html", axis=1)
    return st.set_table_styles(_TABLE_STYLES, overwrite=True)


def _col(x: Any, n: int | None = None, name: str = "values") -> list:
    """A column as a python list of floats (torch/numpy/list in)."""
    arr = to_numpy(x, dtype=float).ravel().tolist()
    if n is not None and len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} entries, expected {n}")
    return arr


def _components_frame(components: Mapping[str, Sequence[float]] | Sequence[Mapping[str, float]] | None,
                      n: int, weights: Mapping[str, float] | None = None) -> pd.DataFrame:
    """{name: (N,)} or [{name: value}] per completion -> DataFrame with one column per component."""
    if components is None:
        return pd.DataFrame(index=range(n))
    if isinstance(components, Mapping):
        data = {k: _col(v, n, f"components[{k!r}]") for k, v in components.items()}
    else:
        if len(components) != n:
            raise ValueError(f"components has {len(components)} rows, expected {n}")
        keys: list[str] = []
        for row in components:
            keys.extend(k for k in row if k not in keys)
        data = {k: [float(row[k]) if row.get(k) is not None else math.nan for row in components] for k in keys}
    df = pd.DataFrame(data)
    if weights:
        df.columns = [f"{c} (w={fmt(weights[c])})" if c in weights else c for c in df.columns]
    return df


def _isnan(v: Any) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def _component_format(v: Any) -> str:
    """A reward component that does not apply to the task (NaN in Rewards.components) is shown as '—'."""
    return "—" if _isnan(v) else fmt(v)


def _num_format(v: Any) -> str:
    if isinstance(v, float) and math.isnan(v):
        return ""      # missing cell in a ragged record, not a NaN measurement
    return fmt(v) if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) else \
        ("" if v is None else str(v))


# ----------------------------------------------------------------------------------------- advantages
def _group_labels(prompts_b, mu, sd, den, zero: set, r, a, G: int) -> tuple[list, list]:
    """Each group's block label (prompt, μ, σ[, σ+ε]) and its badge (zero-std / undefined-std reason, or "")."""
    group_labels, badges = [], []
    for b in range(len(prompts_b)):
        lab = f"#{b} · {truncate(visible_ws_text(prompts_b[b].strip()), 44)}\nμ={fmt(mu[b])}  σ={fmt(sd[b])}"
        if den is not None:
            lab += f"  σ+ε={fmt(den[b * G])}"
        if b in zero:
            lab = "⚠ ZERO-STD · " + lab
        group_labels.append(lab)
        if b in zero:
            vals = [r[b * G + g] for g in range(G)]
            same = fmt(vals[0]) if vals else "?"
            ag = [a[b * G + g] for g in range(G)]
            pushed = max((abs(x) for x in ag if math.isfinite(x)), default=0.0) > 1e-6
            badges.append(f"⚠ zero-std: all {G} rewards = {same}, yet A = {fmt(ag[0])} from the batch-wide "
                          "normalisation: a push with no reward difference" if pushed else
                          f"⚠ zero-std: all {G} rewards = {same} → A = 0, no PG signal from this group")
        elif not math.isfinite(sd[b]):
            badges.append("⚠ std undefined (< 2 valid rewards) → A = 0")
        else:
            badges.append("")
    return group_labels, badges


def advantage_table(prompts: Sequence[str], completions: Sequence[str], rewards: Any, advantages: Any, *,
                    num_generations: int, group_mean: Any, group_std: Any, normalization: str,
                    components: Mapping[str, Sequence[float]] | Sequence[Mapping[str, float]] | None = None,
                    weights: Mapping[str, float] | None = None, zero_std_groups: Iterable[int] | None = None,
                    denominator: Any = None, row_flags: Sequence[str] | None = None, max_chars: int = 60,
                    batch_label: str = "rollout batch of this step") -> Styler:
    """One block per prompt: G rows (completion, reward components, reward, advantage), μ/σ per group.

    prompts: N (each prompt repeated G times consecutively, as in the rollout) or B entries.
    zero_std_groups: group indices from the Advantages record; those blocks get an amber
    "⚠ zero-std" badge with the reason. denominator (N,): what (r − μ) was divided by, if recorded.
    row_flags: an extra note per completion (e.g. "truncated", "NaN reward").
    """
    G = int(num_generations)
    n = len(completions)
    if G < 1 or n % G:
        raise ValueError(f"{n} completions are not a whole number of groups of {G}")
    B = n // G
    r, a = _col(rewards, n, "rewards"), _col(advantages, n, "advantages")
    mu, sd = _col(group_mean, B, "group_mean"), _col(group_std, B, "group_std")
    den = None if denominator is None else _col(denominator, n, "denominator")
    if len(prompts) == n:
        prompts_b = [prompts[i * G] for i in range(B)]
    elif len(prompts) == B:
        prompts_b = list(prompts)
    else:
        raise ValueError(f"prompts has {len(prompts)} entries; expected N={n} or B={B}")
    if zero_std_groups is None:
        # Fallback only for callers without a record: the record's own list is authoritative.
        zero = {b for b in range(B) if math.isfinite(sd[b]) and math.isclose(sd[b], 0.0, abs_tol=1e-8)}
    else:
        zero = {int(b) for b in zero_std_groups}

    comp = _components_frame(components, n, weights)
    group_labels, badges = _group_labels(prompts_b, mu, sd, den, zero, r, a, G)
    idx = pd.MultiIndex.from_tuples([(group_labels[i // G], i % G) for i in range(n)], names=["prompt (group)", "g"])
    df = pd.DataFrame({"completion": [truncate(visible_ws_text(c), max_chars) for c in completions]}, index=idx)
    for c in comp.columns:
        df[c] = comp[c].to_numpy()
    df["reward"] = r
    df["advantage"] = a
    # the full reason once per block (first row), a short badge on the others
    notes = [badges[i // G] if i % G == 0 or not badges[i // G] else badges[i // G].split(":")[0]
             for i in range(n)]
    if row_flags is not None:
        if len(row_flags) != n:
            raise ValueError(f"row_flags has {len(row_flags)} entries, expected {n}")
        notes = ["; ".join(x for x in (notes[i], row_flags[i]) if x) for i in range(n)]
    if any(notes):
        df["flags"] = notes

    half = finite_abs_max(a)
    caption = (f"Advantages — {batch_label} (B={B} prompts × G={G} generations). "
               f"normalization: {normalization}. μ, σ = group reward mean and std as recorded "
               f"(Advantages.group_mean / group_std). Advantage colour: orange < 0 < blue, "
               f"white = 0, scale ±{fmt(half)}. ⚠ ZERO-STD: every reward in the group is equal, so "
               f"every advantage is 0 and the group adds no policy-gradient signal (KL/entropy still act). "
               f"Completions truncated to {max_chars} chars; ␣ = space, ␣×n = n spaces.")
    if zero:
        caption += f" Zero-std groups: {sorted(zero)} of {B}."
    st = _styler(df, caption, normalization)
    numeric = [c for c in df.columns if c not in ("completion", "flags")]
    comp_cols = list(comp.columns)
    st = st.format({c: (_component_format if c in comp_cols else fmt) for c in numeric}, escape="html")
    st = st.apply(lambda col: [signed_cell_css(v, half) + ";font-weight:600" for v in col], subset=["advantage"])

    def block_css(frame: pd.DataFrame) -> pd.DataFrame:
        css = pd.DataFrame("", index=frame.index, columns=frame.columns)
        for i in range(n):
            base = "border-top:2px solid #666;" if i % G == 0 else ""
            for j, col in enumerate(frame.columns):
                extra = ""
                if (i // G) in zero and col != "advantage":
                    extra = f"background-color:{WARN_BG};color:{WARN_FG};"
                if col == "completion":
                    extra += f"font-family:{FONT_MONO};white-space:pre;text-align:left;"
                css.iat[i, j] = base + extra      # iat: row views are copies under copy-on-write
        return css

    st = st.apply(block_css, axis=None)
    if "flags" in df.columns:
        st = st.map(lambda v: f"color:{WARN_FG};font-weight:600;min-width:16em" if v else "min-width:16em",
                    subset=["flags"])
    st = st.map_index(lambda v: (f"background-color:{WARN_BG};color:{WARN_FG};white-space:pre-line"
                                 if isinstance(v, str) and v.startswith("⚠") else "white-space:pre-line"), level=0)
    return st


def advantage_table_from_records(rollout: Any, advantages: Any, rewards: Any = None, **kw: Any) -> Styler:
    """Thin adapter: Rollout (+ Advantages record, + per-completion RewardBreakdowns) -> advantage_table.

    rewards: a sequence of RewardBreakdown-like objects (components/weights) or a record with
    `.breakdowns`; the total reward comes from the Advantages record (what was normalised).
    """
    completions = list(getattr(rollout, "completions"))
    prompts = list(getattr(rollout, "prompts"))
    comps = weights = None
    breakdowns = getattr(rewards, "breakdowns", rewards)
    if breakdowns is not None:
        breakdowns = list(breakdowns)
        comps = [dict(getattr(b, "components", {}) or {}) for b in breakdowns]
        weights = dict(getattr(breakdowns[0], "weights", {}) or {}) if breakdowns else None
    row_flags = None
    trunc = getattr(rollout, "is_truncated", None)
    if trunc is not None:
        row_flags = ["truncated (no EOS)" if bool(t) else "" for t in to_numpy(trunc, dtype=bool).ravel()]
    return advantage_table(
        prompts, completions, advantages.rewards, advantages.advantages,
        num_generations=advantages.num_generations, group_mean=advantages.group_mean,
        group_std=advantages.group_std, normalization=advantages.normalization, components=comps,
        weights=weights, zero_std_groups=advantages.zero_std_groups,
        denominator=getattr(advantages, "denominator", None), row_flags=row_flags, **kw)


# ----------------------------------------------------------------------------------------- rewards
def reward_components_table(completions: Sequence[str],
                            components: Mapping[str, Sequence[float]] | Sequence[Mapping[str, float]], *,
                            totals: Any, weights: Mapping[str, float] | None = None,
                            flags: Sequence[Iterable[str]] | None = None, labels: Sequence[str] | None = None,
                            definitions: Mapping[str, str] | None = None, max_chars: int = 60,
                            batch_label: str = "rollout batch of this step") -> Styler:
    """One row per completion: each reward component's raw score, the total, and the reward flags.

    components: {name: (N,)} or one {name: score} per completion (RewardBreakdown.components);
    weights: shown in the column header (RewardBreakdown.weights); totals: RewardBreakdown.total as
    computed by the reward function (the view does not recombine the components). A NaN component
    means "does not apply to this task" (e.g. eval MAE for an A: completion) and is shown as "—".
    """
    n = len(completions)
    tot = _col(totals, n, "totals")
    comp = _components_frame(components, n, weights)
    idx = pd.Index(list(labels) if labels is not None else [f"#{i}" for i in range(n)], name="completion #")
    df = pd.DataFrame({"completion": [truncate(visible_ws_text(c), max_chars) for c in completions]}, index=idx)
    for c in comp.columns:
        df[c] = comp[c].to_numpy()
    df["total"] = tot
    if flags is not None:
        df["flags"] = [", ".join(map(str, f)) if not isinstance(f, str) else f for f in flags]
    defs = "; ".join(f"{k}: {v}" for k, v in (definitions or {}).items())
    caption = (f"Reward components — {batch_label}. Columns: raw component scores"
               f"{' (w = weight from RewardBreakdown.weights)' if weights else ''}; total = RewardBreakdown.total "
               f"as returned by the reward function. Colour per column: orange < 0 < blue; — = component does not "
               f"apply to this task.")
    if defs:
        caption += " " + defs + "."
    st = _styler(df, caption)
    numeric = [c for c in df.columns if c not in ("completion", "flags")]
    comp_cols = list(comp.columns)
    st = st.format({c: (_component_format if c in comp_cols else fmt) for c in numeric}, escape="html")
    for c in numeric:
        half = finite_abs_max(df[c].tolist())
        na_css = "color:#888" if c in comp_cols else None
        st = st.apply(lambda col, half=half, na_css=na_css: [na_css if na_css and _isnan(v) else signed_cell_css(v, half)
                                                             for v in col], subset=[c])
    st = st.map(lambda v: f"font-family:{FONT_MONO};white-space:pre;text-align:left", subset=["completion"])
    if "flags" in df.columns:
        st = st.map(lambda v: f"color:{WARN_FG};font-weight:600" if v else "", subset=["flags"])
    return st


def before_after_table(prompts: Sequence[str], before: Any, after: Any, *, metric: str = "reward",
                       label: str = "greedy decode of the same B prompts, before vs after the update",
                       before_text: Sequence[str] | None = None, after_text: Sequence[str] | None = None,
                       max_chars: int = 48) -> Styler:
    """Per-prompt before/after table on the SAME batch. Δ = after − before (display difference only)."""
    n = len(prompts)
    b, a = _col(before, n, "before"), _col(after, n, "after")
    df = pd.DataFrame({"prompt": [truncate(visible_ws_text(p.strip()), max_chars) for p in prompts]},
                      index=pd.Index(range(n), name="prompt #"))
    if before_text is not None:
        df["completion before"] = [truncate(visible_ws_text(t), max_chars) for t in before_text]
    if after_text is not None:
        df["completion after"] = [truncate(visible_ws_text(t), max_chars) for t in after_text]
    df[f"{metric} before"] = b
    df[f"{metric} after"] = a
    df["Δ (after − before)"] = [y - x for x, y in zip(b, a)]
    caption = (f"Before/after — {label}. Same batch, same prompts, same scoring; "
               f"Δ = {metric} after − {metric} before (blue = improved if higher is better).")
    st = _styler(df, caption)
    nums = [f"{metric} before", f"{metric} after", "Δ (after − before)"]
    # one format() call: a second dict-format would reset the other columns to the default formatter
    st = st.format({nums[0]: fmt, nums[1]: fmt, nums[2]: fmt_signed}, escape="html")
    half = finite_abs_max(df[nums[2]].tolist())
    st = st.apply(lambda col: [signed_cell_css(v, half) for v in col], subset=[nums[2]])
    text_cols = [c for c in df.columns if c == "prompt" or c.startswith("completion")]
    st = st.map(lambda v: f"font-family:{FONT_MONO};white-space:pre;text-align:left", subset=text_cols)
    return st


# ----------------------------------------------------------------------------------------- invariants
def _check_rows(checks: Any) -> list[dict]:
    """Normalise the many shapes an invariants record may take into row dicts."""
    rows = []
    if isinstance(checks, Mapping):
        items = list(checks.items())
    else:
        items = [(None, c) for c in checks]
    for name, c in items:
        if isinstance(c, (bool, np.bool_)):
            rows.append({"check": name, "passed": bool(c)})
            continue
        if dataclasses.is_dataclass(c) and not isinstance(c, type):
            c = dataclasses.asdict(c)
        elif not isinstance(c, Mapping):
            c = dict(vars(c)) if hasattr(c, "__dict__") else {"passed": bool(c)}
        c = dict(c)
        row = {"check": c.pop("name", None) or name, "passed": bool(c.pop("passed", c.pop("ok", False)))}
        row.update(c)
        rows.append(row)
    return rows


def invariants_table(checks: Any, *, title: str = "Step-0 invariants") -> Styler:
    """Pass/fail table. checks: {name: bool}, {name: {passed, value, expected, tolerance, definition}},
    or a list of such dicts/objects (with a `name`). Status is spelled (✓ PASS / ✗ FAIL), not colour only."""
    rows = _check_rows(checks)
    df = pd.DataFrame(rows)
    if df.empty:
        df = pd.DataFrame({"check": [], "passed": []})
    df.insert(1, "status", ["✓ PASS" if p else "✗ FAIL" for p in df["passed"]])
    df = df.drop(columns=["passed"]).set_index("check")
    n_fail = int((df["status"] == "✗ FAIL").sum())
    caption = (f"{title} — {len(df) - n_fail}/{len(df)} pass. Before any update the policy IS the reference: "
               "per-token logps equal, KL = 0, ratio = 1, dropout off (eval mode). A failure here makes "
               "every later number suspect.")
    st = _styler(df, caption)
    st = st.format(_num_format, subset=[c for c in df.columns if c != "status"], escape="html")
    st = st.map(lambda v: (f"background-color:{PASS_BG};color:{PASS_FG};font-weight:700" if v == "✓ PASS" else
                           f"background-color:{FAIL_BG};color:{FAIL_FG};font-weight:700"), subset=["status"])
    return st


# ----------------------------------------------------------------------------------------- provenance
def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    elif hasattr(obj, "_asdict"):
        obj = obj._asdict()
    elif hasattr(obj, "to_dict") and not isinstance(obj, (pd.DataFrame, pd.Series)):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
                out.update(_flatten(v, key))
            else:
                out[key] = v
        return out
    return {prefix or "value": obj}


def provenance_table(provenance: Any, *, title: str = "Provenance") -> Styler:
    """Key/value table of where the numbers came from (git SHA, versions, device/dtype, model hash,
    Stockfish settings, config). Nested mappings/dataclasses are flattened to dotted keys."""
    flat = _flatten(provenance)
    df = pd.DataFrame({"value": [v if isinstance(v, str) else repr(v) if not isinstance(v, (int, float)) else fmt(v)
                                 for v in flat.values()]}, index=pd.Index(list(flat), name="key"))
    st = _styler(df, f"{title} — recorded with the run; enough to reproduce it.")
    return st.map(lambda v: f"font-family:{FONT_MONO};white-space:pre-wrap", subset=["value"])


def metrics_table(metrics: Mapping[str, Any], *, definitions: Mapping[str, str] | None = None,
                  title: str = "Metrics (TRL keys)",
                  batch_label: str = "each definition names its batch: rollout (sampled), greedy batch "
                                     "before/after, or held-out") -> Styler:
    """Scalar metrics with their definitions: `definitions` overrides, else `metrics.definition(key)`
    (GLOSSARY and the rewards/<func>/* patterns); a key with no definition anywhere reads 'undefined'."""
    from rookworld_debug.metrics import batch_of, definition as glossary_definition

    defs = definitions or {}
    df = pd.DataFrame({"value": [metrics[k] for k in metrics],
                       "definition": [defs.get(k) or glossary_definition(k) or "(no definition in GLOSSARY)"
                                      for k in metrics],
                       "batch": [batch_of(k) for k in metrics]}, index=pd.Index(list(metrics), name="metric"))
    st = _styler(df, f"{title} — {batch_label}.")
    na = lambda v: "n/a" if isinstance(v, float) and math.isnan(v) else _num_format(v)  # noqa: E731 (see definition)
    return st.format(na, subset=["value"], escape="html").map(lambda v: f"font-family:{FONT_MONO}", subset=["value"])
