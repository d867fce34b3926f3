"""The what-if page: self-check, each arm's one-step update, trajectories per arm, a verdict per symptom.

A view over `WhatIfResult.to_dict()` (the JSON the CLI writes): it computes nothing; every text is escaped."""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}.ok{color:#17651d}.bad{color:#a11}.na{color:#777}.def{color:#555;font-size:12px}
svg{border:1px solid #ddd;margin:4px}"""
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")
UPDATE_COLUMNS = {
    "loss": "loss of the update's grad forward (first optimizer step)",
    "grad_norm_pre_clip": "global L2 grad norm before clipping",
    "lr": "learning rate of the update",
    "param_delta_norm": "‖θ_after − θ_start‖₂",
    "kl_after": "KL(π‖π_ref) after the update, k3 token mean on the recorded sampled tokens",
    "ratio_mean": "mean of exp(logπ_after − logπ_start) over the recorded tokens",
    "ratio_max": "max of the same ratio",
    "frac_outside_clip": "fraction of recorded tokens with ratio outside [1 − ε_low, 1 + ε_high]",
    "delta_logp_mean": "token mean of logπ_after − logπ_start (recorded rows)",
    "corr_adv_delta_logp": "Pearson(advantage, per-row mean Δlogp)",
    "greedy_before": "greedy reward on the step's prompts before (built-in reward, mean over prompts)",
    "greedy_after": "greedy reward on the same prompts after this arm's update",
    "greedy_changed": "prompts whose greedy completion changed",
}


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _n(x) -> str:
    if x is None:
        return '<span class="na">–</span>'
    if isinstance(x, float):
        return _e(f"{x:.4g}")
    return _e(x)


def _self_check(sc: dict) -> str:
    head = ("passed" if sc["passed"] else "not possible (nothing recorded)" if sc["passed"] is None else
            f"FAILED at stage {sc['first_diverging']}")
    cls = "ok" if sc["passed"] else "bad" if sc["passed"] is False else "na"
    rows = "".join(f"<tr><td class=l>{_e(s['stage'])}</td><td>{_n(s['recorded'])}</td><td>{_n(s['replayed'])}</td>"
                   f"<td>{_n(s['diff'])}</td><td>{_n(s['tolerance'])}</td><td class=l>{_e(s['ok'])}</td>"
                   f"<td class='l def'>{_e(s['definition'])}</td></tr>" for s in sc["stages"])
    notes = "".join(f"<li>{_e(n)}</li>" for n in sc.get("notes", []))
    return (f"<h2>Self-check: <span class={cls}>{_e(head)}</span></h2><p class=def>The unchanged arm replays the "
            "recorded step; stages in the order the step computes them.</p><table><tr><th class=l>stage</th>"
            "<th>recorded</th><th>replayed</th><th>|diff|</th><th>tolerance</th><th class=l>ok</th>"
            f"<th class=l>definition</th></tr>{rows}</table><ul>{notes}</ul>")


def _updates(arms: list) -> str:
    have = [a for a in arms if a.get("update")]
    if not have:
        return ""
    head = "".join(f"<th>{_e(a['name'])}</th>" for a in have)
    def cells(k):
        return "".join(f"<td>{_n(a['update'].get(k))}</td>" for a in have)
    body = "".join(f"<tr><td class=l>{_e(k)}</td>{cells(k)}<td class='l def'>{_e(d)}</td></tr>"
                   for k, d in UPDATE_COLUMNS.items())
    layers = sorted({k for a in have for k in a["update"].get("update_to_weight", {})})
    body += "".join(f"<tr><td class=l>‖Δθ‖/‖θ‖ {_e(k)}</td>"
                    + "".join(f"<td>{_n(a['update'].get('update_to_weight', {}).get(k))}</td>" for a in have)
                    + "<td class='l def'>per-layer update-to-weight ratio</td></tr>" for k in layers)
    return ("<h2>One step on the recorded rollout</h2><p class=def>Every arm starts from the same weights and AdamW "
            "state and updates the SAME recorded rollout (batch: sampled rollout; greedy rows: the step's prompts)."
            f"</p><table><tr><th class=l>quantity</th>{head}<th class=l>definition</th></tr>{body}</table>")


def _svg(metric: str, arms: list, w: int = 360, h: int = 180) -> str:
    series = [(a["name"], a["trajectories"]["step"], a["trajectories"].get(metric, {}).get("mean", []))
              for a in arms if a.get("trajectories")]
    pts = [(s, v) for _, steps, vals in series for s, v in zip(steps, vals) if v is not None and math.isfinite(v)]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    sx = lambda s: 40 + (w - 50) * ((s - x0) / (x1 - x0) if x1 > x0 else 0.5)          # noqa: E731
    sy = lambda v: h - 25 - (h - 40) * ((v - y0) / (y1 - y0) if y1 > y0 else 0.5)      # noqa: E731
    lines = []
    for i, (name, steps, vals) in enumerate(series):
        p = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in zip(steps, vals) if v is not None and math.isfinite(v))
        c = _COLORS[i % len(_COLORS)]
        lines.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{p}"><title>{_e(name)}</title>'
                     f'</polyline><text x="{w - 5}" y="{14 + 12 * i}" font-size="10" text-anchor="end" fill="{c}">'
                     f'{_e(name)}</text>')
    return (f'<svg width="{w}" height="{h}"><text x="5" y="12" font-size="11">{_e(metric)} (mean over seeds)</text>'
            f'<text x="5" y="{h - 8}" font-size="9">step {x0}…{x1}; {_e(f"{y0:.3g}")}…{_e(f"{y1:.3g}")}</text>'
            + "".join(lines) + "</svg>")


def _verdicts(d: dict) -> str:
    if not d["verdict"]:
        return ""
    sym = {s["name"]: s for s in d["symptoms"]}
    rows = ""
    for name, by_arm in d["verdict"].items():
        for arm, v in by_arm.items():
            cls = "ok" if v["verdict"] == "removed" else "bad" if v["verdict"] == "not removed" else "na"
            rows += (f"<tr><td class=l>{_e(name)}</td><td class=l>{_e(arm)}</td><td class='l {cls}'>{_e(v['verdict'])}"
                     f"</td><td>{_n(v['mean_improvement'])}</td><td>[{_n(v['ci95'][0])}, {_n(v['ci95'][1])}]</td>"
                     f"<td>{_n(v['seeds'])}</td><td>{_n(v['seeds_needed'])}</td><td class='l def'>{_e(v['reason'])}; "
                     f"{_e(sym.get(name, {}).get('definition', ''))}</td></tr>")
    return ("<h2>Verdict per symptom</h2><p class=def>Paired over shared seeds: improvement = −direction·(arm − "
            "unchanged) of the symptom's number per seed; 95 % percentile bootstrap of its mean.</p><table><tr>"
            "<th class=l>symptom</th><th class=l>arm</th><th class=l>verdict</th><th>mean improvement</th><th>95 % CI"
            "</th><th>S</th><th>S needed</th><th class=l>why / definition</th></tr>" + rows + "</table>")


def render(d: dict) -> str:
    src = d["source"]
    arms = d["arms"]
    traj = ""
    if any(a.get("trajectories") for a in arms):
        metrics = [k for k in arms[0]["trajectories"] if k != "step"]
        traj = (f"<h2>Trajectories: {d['steps']} steps × {d['seeds']} seeds per arm</h2><p class=def>Fresh rollouts "
                "per step, the same sampling seeds in every arm.</p>" + "".join(_svg(m, arms) for m in metrics))
    arm_list = "".join(f"<li><b>{_e(a['name'])}</b>: {_e(json.dumps(a['overrides']))} <span class=def>"
                       f"({_e(a['source'])})</span></li>" for a in arms)
    extra = ""
    if d.get("extra", {}).get("group_size"):
        g = d["extra"]["group_size"]
        extra = (f"<h2>Group size G = {_e(g['G_old'])} → {_e(g['G_new'])}</h2><table>"
                 f"<tr><td class=l>measured variance ratio of step-to-step reward change</td><td>{_n(g['measured_ratio'])}"
                 f" [{_n(g['measured_ratio_ci95'][0])}, {_n(g['measured_ratio_ci95'][1])}]</td></tr>"
                 f"<tr><td class=l>predicted, sampling (G_old/G_new)</td><td>{_n(g['predicted_ratio_sampling'])}</td></tr>"
                 f"<tr><td class=l>predicted, G′ curve (gradient energy)</td><td>{_n(g['predicted_ratio_gradient'])}"
                 f"</td></tr><tr><td class=l>G′ curve: noise share of a G_old gradient, 1 − cos²</td>"
                 f"<td>{_n(g.get('noise_share_at_G_old'))}</td></tr></table>"
                 + "".join(f"<p class=def>{_e(n)}</p>" for n in g.get("notes", []))
                 + f"<pre class=def>{_e(g['definition'])}</pre>")
    notes = "".join(f"<li>{_e(n)}</li>" for n in d.get("notes", []))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>what if: {_e(src['path'])}</title>"
            f"<style>{_CSS}</style></head><body><h1>What if — {_e(src['kind'])} {_e(src['path'])}</h1>"
            f"<p>step {_e(src['step'])}; start weights: {_e(src.get('before') or 'as recorded')}; "
            f"{_n(d['seconds'])} s</p><ul>{arm_list}</ul>{_self_check(d['self_check'])}{_updates(arms)}"
            f"{_verdicts(d)}{traj}{extra}<ul>{notes}</ul></body></html>")


def write(d: dict, out) -> tuple:
    """OUT/whatif.json and OUT/whatif.html; returns both paths."""
    from rookworld_debug.safeio import atomic_write_json
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "whatif.json", d)
    (out / "whatif.html").write_text(render(d), encoding="utf-8")
    return out / "whatif.json", out / "whatif.html"
