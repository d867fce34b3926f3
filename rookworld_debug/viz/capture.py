"""A TRL-captured step next to what TRL itself logged: where the record came from (TRL version,
optimizer step, weights hash, capture cost) and, number by number, TRL's logged value vs the record's
(each recomputed by the project's phase functions from TRL's tensors). Nothing is recomputed here."""
from __future__ import annotations

import html
import math
from typing import Any

from ._style import fmt
from .htmlview import HTMLView

__all__ = ["capture_table_from_trace"]

# (label, TRL's logged key, record value getter, definition)
_ROWS = (
    ("loss", "loss", lambda t: float(t.loss.loss),
     "TRL: Σ over the step's micro-batches of compute_loss's return (Trainer log) · record: grpo.objective.loss.compute_loss "
     "on TRL's tensors (LossBreakdown.loss)"),
    ("grad_norm", "grad_norm", lambda t: t.update.grad_norm_pre_clip if t.update else math.nan,
     "global L2 norm of the gradient before clipping (Trainer) · record: the captured value"),
    ("reward", "reward", lambda t: t.rewards.metrics.get("reward", math.nan),
     "mean over rows of Σ_k w_k·r_k (nansum; unscorable rows excluded) · record: grpo.phases.rewards on TRL's per-function values"),
    ("reward_std", "reward_std", lambda t: t.rewards.metrics.get("reward_std", math.nan),
     "std (n−1) of the summed rewards over the batch"),
    ("frac_reward_zero_std", "frac_reward_zero_std", lambda t: t.advantages.frac_reward_zero_std,
     "fraction of rows whose group reward std is ~0 (no policy-gradient signal)"),
    ("kl", "kl", lambda t: t.loss.kl, "token mean of the per-token k3 KL(π‖π_ref) (× r when bias-corrected)"),
    ("entropy", "entropy", lambda t: t.loss.entropy, "token mean entropy of the tempered policy (nats)"),
    ("clip_ratio/region_mean", "clip_ratio/region_mean", lambda t: t.loss.metrics.get("clip_ratio/region_mean", math.nan),
     "fraction of tokens whose ratio the PPO clip cut"),
    ("learning_rate", "learning_rate", lambda t: t.update.lr if t.update else math.nan, "LR of this update"),
)


def _diff(a: Any, b: Any) -> str:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return "—"
    return "—" if (math.isnan(a) or math.isnan(b)) else fmt(abs(a - b))


def capture_table_from_trace(trace: Any) -> HTMLView:
    cap = getattr(trace, "capture", None)
    if cap is None:
        raise ValueError("this trace was not captured from TRL (trace.capture is None)")
    esc = html.escape
    logged = cap.logged_metrics or {}
    rows = []
    for label, key, get, definition in _ROWS:
        rec = get(trace)
        rows.append(f"<tr title=\"{esc(definition, quote=True)}\"><td><code>{esc(label)}</code></td>"
                    f"<td>{esc(fmt(logged.get(key)) if key in logged else 'not logged')}</td>"
                    f"<td>{esc(fmt(rec))}</td><td>{esc(_diff(logged.get(key), rec))}</td>"
                    f"<td style='font-size:0.85em;color:#555'>{esc(definition)}</td></tr>")
    prov = trace.setup.provenance if trace.setup is not None else {}
    facts = [
        f"optimizer step <b>{cap.global_step}</b> of a TRL {esc(cap.trl_version)} GRPOTrainer run (transformers "
        f"{esc(cap.transformers_version)}); batch generated at the start of step {cap.generation_step}",
        f"model <code>{esc(str(prov.get('model')))}</code>, weights sha256 <code>{esc(str(prov.get('weights_sha256'))[:16])}…</code> "
        "(before this step's update)",
        f"loss as TRL returned it: {fmt(cap.trl_loss)} over {len(cap.micro_batch_losses)} micro-batch(es); recomputed per "
        f"micro-batch by grpo.objective.loss: {fmt(cap.recomputed_loss)} (|Δ| {fmt(cap.loss_recompute_diff)})",
        f"advantages are TRL's own; grpo.phases.advantages on TRL's rewards agrees to {fmt(cap.advantages_recompute_diff)}",
        f"capture cost for this step: {cap.capture_seconds:.3f} s, {cap.capture_bytes:,} bytes copied (steps not captured: 0)",
        f"GRPOConfig mapped onto StepConfig; {len(cap.unmapped)} GRPOConfig fields without a counterpart are kept "
        "verbatim in trace.capture.unmapped",
        *[f"⚠ {esc(n)}" for n in cap.mapping_notes],
    ]
    if not cap.logged_metrics:
        facts.append("TRL did not log at this step (logging_steps > 1): the 'TRL logged' column is empty")
    table = ("<table style='border-collapse:collapse;font-size:0.9em'><thead><tr><th>metric</th><th>TRL logged</th>"
             "<th>record</th><th>|Δ|</th><th>definition</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    return HTMLView("<div class='rw-capture'><h4 style='margin:4px 0'>Captured from TRL's GRPOTrainer — "
                    "the step TRL took (sampled rollout of this step)</h4><ul>"
                    + "".join(f"<li>{f}</li>" for f in facts) + "</ul>" + table
                    + "<p style='font-size:0.85em;color:#555'>No greedy before/after evaluation and no step-0 "
                    "invariants: GRPOTrainer computes neither.</p></div>")
