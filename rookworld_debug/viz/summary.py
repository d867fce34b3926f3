"""The executive summary of one step (what the report shows first, in one screen): what the step did,
its headline numbers — each with its batch and definition — the balance of the loss terms in words
(`metrics.term_balance`), and its flags. Plus `details_view`, a collapsed `<details>` box for
provenance/config. Numbers come from `StepTrace.summary()`; nothing is recomputed here.
"""
from __future__ import annotations

import html
from typing import Any

from ._style import fmt
from .htmlview import HTMLView

__all__ = ["executive_summary_from_trace", "details_view", "HEADLINE", "written_by", "invariants_note"]

#: (summary key, label, batch) in reading order
HEADLINE = (
    ("reward_before", "reward before", "greedy · this batch"),
    ("reward_after", "reward after", "greedy · this batch"),
    ("heldout_reward_before", "held-out before", "greedy · held-out"),
    ("heldout_reward_after", "held-out after", "greedy · held-out"),
    ("rollout_reward", "rollout reward", "sampled · this batch"),
    ("format_valid", "format valid", "sampled · this batch"),
    ("loss", "loss", "sampled · this batch"),
    ("kl", "KL (raw)", "sampled · this batch"),
    ("kl_grad_share", "KL share of gradient", "sampled · this batch"),
    ("grad_norm_pre_clip", "grad norm", "update"),
    ("frac_reward_zero_std", "zero-σ rows", "sampled · this batch"),
    ("corr_adv_delta_logp", "corr(A, Δlogp)", "sampled · after update"),
)


def _value(key: str, v: Any) -> str:
    if isinstance(v, float) and v != v:
        return "n/a"
    if key in ("format_valid", "frac_reward_zero_std", "kl_grad_share") and isinstance(v, (int, float)):
        return f"{v:.0%}"
    return fmt(v)


def written_by(trace: Any) -> str:
    """Which writer recorded the step: TRL's GRPOTrainer (a capture), a training loop recorded through
    StepRecorder (named as it named itself), or this package's run_step."""
    cap = getattr(trace, "capture", None)
    if cap is not None:
        return f"TRL's GRPOTrainer (TRL {cap.trl_version}, a capture)"
    rec = getattr(trace, "recorded", None)
    if rec is not None:
        return f"the training loop {str(rec.trainer)!r} (recorded through StepRecorder)"
    return "rookworld_debug's run_step"


def invariants_note(trace: Any) -> str:
    """Why a step has no step-0 invariants, naming the writer that checks none ('' when it has them)."""
    if getattr(trace.setup, "invariants", None) is not None:
        return ""
    return f"not recorded: {written_by(trace)} checks none"


def start_sentence(trace: Any) -> str:
    """Where the debugged step started: step 0, after k warm-up steps, a checkpoint, or a TRL step."""
    cap = getattr(trace, "capture", None)
    if cap is not None:
        return f"a step TRL's GRPOTrainer took (global step {cap.global_step})"
    start = (trace.setup.provenance or {}).get("start") or {}
    parts = []
    if start.get("init_policy"):
        parts.append(f"from {start.get('init_policy_kind') or 'checkpoint'} {start['init_policy']}")
    if start.get("warmup_steps"):
        parts.append(f"after {start['warmup_steps']} warm-up GRPO step(s) on this batch")
    return "started " + (" and ".join(parts) if parts else "at step 0 (π = π_ref)")


def passes_sentence(trace: Any, m: dict) -> str:
    """How many passes and optimizer steps the step took, and which one the headline numbers describe."""
    its = tuple(getattr(trace, "iterations", ()) or ())
    n_opt = sum(len(it.updates) for it in its) or 1
    mu = len(its) or 1
    which = ("the headline loss, KL and grad norm are the LAST optimizer step's (as TRL logs them)" if n_opt > 1
             else "the headline numbers describe it")
    return (f"{mu} pass(es) over the rollout, {n_opt} optimizer step(s) in all (grad norm of the last "
            f"{fmt(m['grad_norm_pre_clip'])} → {fmt(m['grad_norm_post_clip'])} after clipping); {which}.")


def executive_summary_from_trace(trace: Any, *, max_flags: int = 4) -> HTMLView:
    from rookworld_debug.metrics import definition, term_balance

    c, esc = trace.config, html.escape
    m = trace.summary()
    bal = term_balance(trace.loss, trace.update)
    did = (f"One GRPO step of <b>{esc(str(c.model))}</b> on task <b>{esc(str(c.task))}</b>, "
           f"{esc(start_sentence(trace))}: "
           f"B = {c.batch_size} prompts × G = {c.num_generations} sampled completions, loss "
           f"<code>{esc(c.loss_type)}</code>, β = {c.beta:g} ({esc(c.kl_estimator)} KL), lr {c.lr:g}; "
           + ("the update was <b>refused</b>." if trace.update is None else esc(passes_sentence(trace, m))))
    cards = []
    for key, label, batch in HEADLINE:
        if key not in m:
            continue
        cards.append(f'<div class="rw-card" title="{esc(definition(key), quote=True)}"><div class="rw-v">'
                     f'{esc(_value(key, m[key]))}</div><div class="rw-l">{esc(label)}</div>'
                     f'<div class="rw-b">{esc(batch)}</div></div>')
    defs = "".join(f"<li><b>{esc(label)}</b> ({esc(batch)}): {esc(definition(key))}</li>"
                   for key, label, batch in HEADLINE if key in m)
    flags = list(trace.flags)
    shown = "".join(f"<li>{esc(f)}</li>" for f in flags[:max_flags])
    more = f"<li>… {len(flags) - max_flags} more in “Warnings” below</li>" if len(flags) > max_flags else ""
    flag_html = (f'<div class="rw-flags"><b>⚠ {len(flags)} flag(s)</b><ul>{shown}{more}</ul></div>' if flags
                 else '<div class="rw-ok">✓ no flags raised by any phase</div>')
    css = (".rw-exec{font-family:system-ui,sans-serif;border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;"
           "margin:6px 0 12px;max-width:100%}.rw-exec h2{margin:0 0 6px;font-size:1.15rem}"
           ".rw-cards{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}.rw-card{border:1px solid #e3e3e3;"
           "border-radius:5px;padding:4px 8px;min-width:8.5em;background:#fafbfc}.rw-v{font-size:1.1rem;"
           "font-weight:600;font-variant-numeric:tabular-nums}.rw-l{font-size:.8rem}.rw-b{font-size:.72rem;"
           "color:#656d76}.rw-flags{background:#fff8c5;border:1px solid #d4a72c;border-radius:5px;padding:4px 10px;"
           "font-size:.85rem}.rw-flags ul{margin:2px 0 2px 1.2em;padding:0}.rw-ok{color:#116329;font-size:.9rem}"
           ".rw-exec details{font-size:.8rem;color:#444;margin-top:6px}.rw-bal{font-size:.9rem;margin:4px 0}")
    return HTMLView(
        f'<div class="rw-exec"><style>{css}</style><h2>Summary of this step</h2><p>{did}</p>'
        f'<div class="rw-cards">{"".join(cards)}</div>'
        f'<p class="rw-bal"><b>Balance of the loss terms:</b> {esc(bal.headline)}</p>{flag_html}'
        f"<details><summary>definitions of these numbers</summary><ul>{defs}</ul></details></div>")


def details_view(title: str, *views: Any) -> HTMLView:
    """Collapse rendered views (anything with `_repr_html_`/`to_html`) under a `<details>` summary line."""
    parts = []
    for v in views:
        parts.append(v._repr_html_() if hasattr(v, "_repr_html_") else v.to_html())
    return HTMLView(f'<details class="rw-details"><summary style="cursor:pointer;font-weight:600">'
                    f'{html.escape(title)}</summary>{"".join(parts)}</details>')
