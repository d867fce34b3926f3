"""Views of rookworld-rlvr's "mini" beside TRL's objectives on the same rollout, and of its diagnosis findings.

Numbers come from `grpo.families.rlvr_mini.compare.SideBySide` (advantages, token / row gradient weights, cosines) and
`diagnosis.rlvr_mini` (findings); nothing here computes GRPO math.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from ._style import fmt
from .plots import OKABE_ITO, _layout, _row_labels
from .tables import _styler

__all__ = ["rlvr_side_by_side_from_trace", "rlvr_side_by_side_table", "rlvr_side_by_side_figure",
           "rlvr_cosine_table", "rlvr_findings_table", "rlvr_findings_from_trace"]

ROW_WEIGHT_DEF = ("row weight = Σ_t −∂loss/∂log π_it over the row's trained tokens: > 0 raises the row's sampled "
                  "tokens, < 0 lowers them (sampled rollout of this step)")


def rlvr_side_by_side_from_trace(trace, *, objectives: Sequence[str] = ("grpo", "dapo", "rlvr_mini"),
                                 policy=None):
    """`grpo.families.rlvr_mini.compare.side_by_side` on a trace's rollout and rewards (policy: also parameter cosines)."""
    from rookworld_debug.grpo.families.rlvr_mini.compare import side_by_side
    return side_by_side(trace.rollout, trace.rewards, trace.config, objectives=tuple(objectives), policy=policy)


def rlvr_side_by_side_table(sbs, *, prompts: Optional[Sequence[str]] = None) -> Styler:
    """One row per completion: length, reward, then each objective's advantage and row weight."""
    g = sbs.num_generations
    n = int(sbs.rewards.shape[0])
    data: dict[str, Any] = {"row": _row_labels(n, g, None), "trained tokens": [int(x) for x in sbs.lengths],
                            "reward": [float(x) for x in sbs.rewards]}
    for v in sbs.objectives:
        data[f"A ({v.loss_type})"] = [float(x) for x in v.advantages]
    for k, v in enumerate(sbs.objectives):
        moved = set(sbs.moved(k))
        data[f"row weight ({v.loss_type})"] = [fmt(float(x)) + ("" if i in moved else " ·") for i, x in
                                               enumerate(v.row_weight)]
    df = pd.DataFrame(data).set_index("row")
    caption = ("Same rollout, three objectives (sampled rollout of this step). A: each objective's own advantages "
               "from the same rewards — " + "; ".join(f"{v.loss_type}: {v.advantage_formula}" for v in sbs.objectives)
               + f". {ROW_WEIGHT_DEF}; '·' = the row is not moved.")
    return _styler(df, caption).format(lambda x: fmt(x) if isinstance(x, float) else str(x), escape="html")


def rlvr_side_by_side_figure(sbs) -> go.Figure:
    """Each objective's row weights as a share of its own Σ|row weight| (the objectives' scales differ)."""
    n = int(sbs.rewards.shape[0])
    labels = _row_labels(n, sbs.num_generations, None)
    fig = go.Figure()
    for k, v in enumerate(sbs.objectives):
        w = [float(x) for x in v.row_weight]
        total = sum(abs(x) for x in w)
        share = [x / total if total > 0 else 0.0 for x in w]
        fig.add_bar(x=labels, y=share, name=v.loss_type, marker_color=OKABE_ITO[k % len(OKABE_ITO)],
                    customdata=[[x, int(sbs.lengths[i])] for i, x in enumerate(w)],
                    hovertemplate="%{x}: share %{y:.3f}<br>row weight %{customdata[0]:.4g}<br>"
                                  "%{customdata[1]} tokens<extra>" + v.loss_type + "</extra>")
    fig.update_layout(barmode="group", yaxis_title="row weight / Σ|row weight| (share of the push)",
                      xaxis_title="completion (prompt·generation)")
    return _layout(fig, "Which rows each objective moves, and how hard", ROW_WEIGHT_DEF +
                   ". Shares per objective; the raw weights are in the hover and the table.")


def rlvr_cosine_table(sbs) -> Styler:
    """Cosine between the objectives' updates: as pushes on the sampled log-probs and, with a policy, in
    parameter space."""
    names = [v.loss_type for v in sbs.objectives]
    frames = {"log-prob space": sbs.cos_logp}
    if sbs.cos_param is not None:
        frames["parameter space"] = sbs.cos_param
    rows = []
    for space, m in frames.items():
        for a, na in enumerate(names):
            rows.append({"space": space, "objective": na, **{nb: float(m[a, b]) for b, nb in enumerate(names)}})
    df = pd.DataFrame(rows).set_index(["space", "objective"])
    cap = ("Cosine between two objectives' updates on the same rollout. log-prob space: cos of the token "
           "weights −∂L/∂log π_it over every (row, token); parameter space: cos of the gradients J^T w "
           "(J = ∂log π/∂θ at the sampling weights). 1 = same direction, 0 = orthogonal, NaN = a zero update.")
    return _styler(df, cap).format(lambda x: "NaN" if isinstance(x, float) and math.isnan(x) else fmt(x),
                                   escape="html")


def rlvr_findings_table(findings: Sequence) -> Styler:
    """Findings (diagnosis.findings.Finding) with their evidence and the StepConfig fix."""
    rows = []
    for f in findings:
        ev = "; ".join(f"{e.name} = {fmt(e.value)} ({e.definition}; {e.batch})" for e in f.evidence)
        fix = f.fix.description + (f" — set {dict(f.fix.step_config)}" if f.fix.step_config else "")
        rows.append({"code": f.code, "severity": f.severity, "cause": f.cause, "evidence": ev, "fix": fix})
    df = pd.DataFrame(rows or [{"code": "—", "severity": "", "cause": "no rookworld-rlvr fault found in this step",
                                "evidence": "", "fix": ""}])
    return _styler(df.set_index("code"), "rookworld-rlvr checks (diagnosis.rlvr_mini.STEP_CHECKS) on this step")


def rlvr_findings_from_trace(trace) -> Styler:
    from rookworld_debug.diagnosis.rlvr_mini import STEP_CHECKS
    return rlvr_findings_table([f for check in STEP_CHECKS for f in check(trace)])
