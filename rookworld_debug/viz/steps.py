"""Views over a multi-step run (`grpo.multistep.loop.MultiStepResult.table` / `.per_prompt`): reward before/after
curves, KL share and β/lr across steps, a per-prompt reward heatmap, and the summary as a table.

Views only format: every number is a column of the per-step table (defined in
`grpo.multistep.loop.TABLE_COLUMNS`) or a key of `summary_stats`; nothing here computes GRPO math.
"""
from __future__ import annotations

import math
from typing import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .plots import OKABE_ITO, _layout

__all__ = ["reward_curves_figure", "kl_share_figure", "schedule_figure", "per_prompt_heatmap", "summary_table"]


def _col(table, name):
    return [float(x) for x in table[name]] if name in table else [math.nan] * len(table)


def reward_curves_figure(table, *, title: str = "Reward per step: before vs after the update (same batch)"
                         ) -> go.Figure:
    """reward_before / reward_after (greedy, the SAME B prompts, ± 95% CI over prompts), the mean sampled
    (rollout) reward, and the held-out reward where it was evaluated."""
    steps = [int(s) for s in table["step"]]
    fig = go.Figure()
    for k, (name, col, ci) in enumerate((("before (greedy)", "reward_before", "reward_before_ci95"),
                                         ("after (greedy)", "reward_after", "reward_after_ci95"))):
        err = [0.0 if math.isnan(x) else x for x in _col(table, ci)]
        fig.add_scatter(x=steps, y=_col(table, col), name=name, mode="lines+markers",
                        line={"color": OKABE_ITO[k]}, error_y={"type": "data", "array": err, "visible": True,
                                                                "thickness": 1},
                        hovertemplate=f"step %{{x}}<br>{name}: %{{y:.4f}}<extra></extra>")
    fig.add_scatter(x=steps, y=_col(table, "rollout_reward"), name="rollout (sampled mean)", mode="lines",
                    line={"color": OKABE_ITO[2], "dash": "dot"})
    held = _col(table, "heldout_reward_after")
    if any(math.isfinite(x) for x in held):
        fig.add_scatter(x=steps, y=held, name="held-out after (greedy)", mode="markers",
                        marker={"color": OKABE_ITO[3], "symbol": "diamond"})
    definition = ("before/after: mean training reward of greedy completions on this step's B prompts, measured "
                  "just before and just after its optimizer step (error bars: t·s/√B). rollout: mean reward of the "
                  "B·G sampled completions the advantages were computed from. Batch hash per step in the table.")
    return _layout(fig, title, definition, xaxis_title="step k (0-based)", yaxis_title="reward")


def kl_share_figure(table, *, title: str = "KL penalty per step: share of the gradient and raw KL") -> go.Figure:
    """Top: the KL penalty's share of the update's gradient, kl_grad_share = ‖∇β·KL‖ / Σ‖∇term‖ in % (and
    the loss-VALUE share where a step was off-policy; on-policy it is NaN by design, see
    `metrics.term_balance`). Bottom: raw KL (nats/token) and β·KL as it enters the loss."""
    steps = [int(s) for s in table["step"]]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1)
    fig.add_scatter(x=steps, y=[100 * x for x in _col(table, "kl_grad_share")], name="KL share of gradient %",
                    mode="lines+markers", line={"color": OKABE_ITO[3]}, row=1, col=1)
    value = _col(table, "kl_share")
    if any(math.isfinite(x) for x in value):     # only off-policy steps (μ > 1) have a meaningful value share
        fig.add_scatter(x=steps, y=[100 * x for x in value], name="KL loss-value share % (off-policy steps)",
                        mode="markers", marker={"color": OKABE_ITO[5], "symbol": "x"}, row=1, col=1)
    fig.add_scatter(x=steps, y=_col(table, "kl"), name="raw KL (nats/token)", mode="lines+markers",
                    line={"color": OKABE_ITO[0]}, row=2, col=1)
    fig.add_scatter(x=steps, y=_col(table, "kl_loss"), name="β·KL (in the loss)", mode="lines",
                    line={"color": OKABE_ITO[1], "dash": "dash"}, row=2, col=1)
    fig.update_yaxes(title_text="% of gradient", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="KL (nats/token)", exponentformat="power", row=2, col=1)
    fig.update_xaxes(title_text="step k (0-based)", row=2, col=1)
    definition = ("KL share of gradient = ‖∇(β·KL)‖ / (‖∇PG‖ + ‖∇(β·KL)‖ + ‖∇entropy‖), global L2 norms of each "
                  "term's gradient in the step's update (sampled rollout, this batch). The loss-VALUE share is not "
                  "plotted on-policy: there the PG value is −agg(A), ≈ 0 by construction, so it would read ~100%. "
                  "Raw KL = TRL `kl`, masked token mean of the configured estimator on the sampled tokens before the "
                  "update (0 at step 0: policy = reference); β·KL is what enters the loss.")
    return _layout(fig, title, definition, height=480)


def schedule_figure(table, *, title: str = "β and learning rate actually used per step") -> go.Figure:
    """β of the step's loss (top) and lr of the step's optimizer step (bottom), each on its own axis
    (as recorded, not recomputed)."""
    steps = [int(s) for s in table["step"]]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1)
    fig.add_scatter(x=steps, y=_col(table, "beta"), name="β (KL coefficient)", mode="lines+markers",
                    line={"color": OKABE_ITO[3], "shape": "hv"}, row=1, col=1)
    fig.add_scatter(x=steps, y=_col(table, "lr"), name="lr (optimizer)", mode="lines+markers",
                    line={"color": OKABE_ITO[0]}, row=2, col=1)
    fig.update_yaxes(title_text="β", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="learning rate", exponentformat="e", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="step k (0-based)", row=2, col=1)
    definition = ("β_k is fixed before step k's loss (warmup: 0 for k < K; adaptive: from steps < k's RAW KL); "
                  "lr_k is written into the optimizer before step k's optimizer step (step 0 uses lr_at(0)).")
    return _layout(fig, title, definition, height=440)


def per_prompt_heatmap(per_prompt, *, value: str = "reward_after",
                       title: str = "Per-prompt greedy reward across steps") -> go.Figure:
    """Rows = dataset index of the prompt, columns = step, colour = `value` ('reward_after',
    'reward_before' or 'rollout_reward_mean'). Empty cells: the prompt was not in that step's batch."""
    idx = sorted({int(i) for i in per_prompt["dataset_index"]})
    steps = sorted({int(s) for s in per_prompt["step"]})
    pos_i, pos_s = {v: j for j, v in enumerate(idx)}, {v: j for j, v in enumerate(steps)}
    z = [[None] * len(steps) for _ in idx]
    prompt = {}
    for _, r in per_prompt.iterrows():
        v = float(r[value])
        z[pos_i[int(r["dataset_index"])]][pos_s[int(r["step"])]] = None if math.isnan(v) else v
        prompt[int(r["dataset_index"])] = str(r["prompt"])
    labels = [f"#{i}" for i in idx]
    text = [[prompt[i][:60]] * len(steps) for i in idx]
    fig = go.Figure(go.Heatmap(z=z, x=steps, y=labels, text=text, colorscale="Viridis", hoverongaps=False,
                               colorbar={"title": value},
                               hovertemplate="step %{x}<br>prompt %{y}: %{text}<br>" + value
                               + " = %{z:.4f}<extra></extra>"))
    definitions = {"reward_after": "mean training reward of the prompt's greedy completion AFTER the step's update",
                   "reward_before": "the prompt's greedy-completion reward BEFORE the step's update",
                   "rollout_reward_mean": "mean reward of the prompt's G sampled completions"}
    definition = definitions.get(value, value) + "; blank = prompt not in that step's batch."
    return _layout(fig, title, definition, height=max(300, 60 + 22 * len(idx)), xaxis_title="step k (0-based)",
                   yaxis_title="dataset index", yaxis={"autorange": "reversed"})


SUMMARY_LABELS = {
    "start_reward": ("start (greedy, before step 0)", "start_reward_ci95"),
    "end_reward": ("end (greedy, after the last step)", "end_reward_ci95"),
    "end_minus_start": ("end − start", None),
    "pos_steps": ("PosSteps (#Δ > 0)", None), "neg_steps": ("NegSteps (#Δ < 0)", None),
    "zero_steps": ("#Δ = 0", None),
    "mean_delta": ("mean Δ per step", "mean_delta_ci95"),
    "ma10_first": ("MA10 first window (reward after)", "ma10_first_ci95"),
    "ma10_last": ("MA10 last window", "ma10_last_ci95"), "ma10_slope": ("MA10 slope (last − first)/(n − 10)", None),
    "ma20_first": ("MA20 first window", "ma20_first_ci95"), "ma20_last": ("MA20 last window", "ma20_last_ci95"),
    "ma20_slope": ("MA20 slope (last − first)/(n − 20)", None),
    "slope": ("least-squares slope of reward after vs step", "slope_ci95"),
    "best_step": ("best step (max reward after)", None), "best_reward": ("best reward after", "best_reward_ci95"),
    "worst_step": ("worst step (min reward after)", None),
    "worst_reward": ("worst reward after", "worst_reward_ci95"),
    "mean_kl": ("mean raw KL (nats/token)", "mean_kl_ci95"),
    "mean_kl_grad_share": ("mean KL share of gradient", "mean_kl_grad_share_ci95"),
    "mean_kl_share": ("mean KL loss-value share (off-policy steps only)", "mean_kl_share_ci95"),
    "mean_grad_norm_pre_clip": ("mean grad norm (pre-clip)", "mean_grad_norm_pre_clip_ci95"),
    "final_beta": ("final β", None), "final_lr": ("final lr", None), "seconds_per_step": ("seconds per step", None),
}


_INT_KEYS = ("pos_steps", "neg_steps", "zero_steps", "best_step", "worst_step")
_PERCENT_KEYS = ("mean_kl_grad_share", "mean_kl_share")


def _fmt_stat(key: str, v) -> str:
    """A summary number with sensible precision: counts and step indices as integers, shares in %,
    lr in scientific notation, everything else to 4 significant digits (no '1.000000 steps')."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if key in _INT_KEYS:
        return str(int(v))
    if key in _PERCENT_KEYS:
        return f"{100 * float(v):.3g}%"
    v = float(v)
    if key in ("final_lr",) or 0 < abs(v) < 1e-3:        # small numbers: 1.415e-04, not 0.0001415
        return f"{v:.4g}" if key == "final_lr" else f"{v:.3e}"
    return f"{v:.4g}"


def summary_table(summary: Mapping):
    """`summary_stats(...)` as a table of strings (value, ± 95% CI where it is a mean over samples), each
    at a sensible precision; a moving-average row over more steps than the run has says n/a and why."""
    import pandas as pd
    n = summary.get("n_steps")
    rows = []
    for key, (label, ci) in SUMMARY_LABELS.items():
        if key not in summary:
            continue
        v, c = summary[key], summary.get(ci) if ci else None
        w = int(key[2:4]) if key.startswith("ma") and key[2:4].isdigit() else None
        if w is not None and n is not None and n <= w:
            if key.endswith("_slope"):
                shown, c_txt = f"n/a: needs more than {w} steps (this run has {n})", ""
            else:                                    # the window is the whole run: say so instead of "MA10"
                shown, c_txt = _fmt_stat(key, v) + f" (all {n} steps: fewer than {w})", _fmt_stat(ci, c)
        else:
            shown = _fmt_stat(key, v)
            c_txt = "" if c is None else ("" if isinstance(c, float) and math.isnan(c) and not ci else
                                          _fmt_stat(ci if key not in _PERCENT_KEYS else key, c))
        rows.append({"metric": label, "value": shown, "± 95% CI": c_txt})
    return pd.DataFrame(rows).set_index("metric")
