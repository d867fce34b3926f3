"""The "What the fix changes" card: a recorded step's update against the update its corrected step takes
(`diagnosis.replay.corrected.CorrectedStep`, what `rookworld-debug whatif STEP --fix` prints): the verdict sentence,
the loss, gradient and update side by side, the parameters the fix changes most and the completions whose
likelihood the two updates move in opposite directions. Every value is escaped; inline CSS, no script.
"""
from __future__ import annotations

import html
from typing import Any

from ._style import FONT_SANS, INFO_BG, INFO_FG, WARN_BG, WARN_FG
from .diagnosis import _v                 # one number as the diagnosis card shows it (escaped, n/a if not finite)
from .htmlview import HTMLView

__all__ = ["fix_card", "fix_card_from_trace"]

_E = html.escape
_TD = 'style="padding:1px 8px;text-align:right;font-variant-numeric:tabular-nums"'
_TH = 'style="padding:1px 8px;text-align:left"'


def _row(name: str, definition: str, pair: tuple) -> str:
    return (f'<tr><td {_TH}>{_E(name)}</td><td {_TD}>{_v(pair[0])}</td><td {_TD}>{_v(pair[1])}</td>'
            f'<td style="padding:1px 8px;color:#555">{_E(definition)}</td></tr>')


def fix_card(c: Any, *, rows: int = 8) -> HTMLView:
    """The card of one CorrectedStep; a note card where nothing was corrected (its note says why)."""
    head = f"font-family:{FONT_SANS};font-size:13px;margin:6px 0;padding:6px 10px"
    if not c.phase:
        return HTMLView(f'<section class="rw-fix rw-fix-none" aria-label="What the fix changes" style="{head};'
                        f'background:{INFO_BG};color:{INFO_FG};border-left:5px solid {INFO_FG}">'
                        f'<b>What the fix changes:</b> {_E(c.note)}</section>')
    batch = f"this step's {len(c.rows)} completions, the recorded θ_before and optimizer state"
    table = "".join([
        _row("loss", "the step's loss (recorded inputs; corrected from the phase named)", c.loss),
        _row("‖g‖ before clipping", "L2 norm of ∇θ of the loss, all parameters", c.grad_norm),
        _row("‖g‖ after clipping", f"after clip_grad_norm_ at max_grad_norm = {_v(c.max_grad_norm)}",
             c.grad_norm_clipped),
        _row("‖Δθ‖", "L2 norm of the optimizer's step from θ_before", c.update_norm)])
    params = "".join(f'<tr><td {_TH}><code>{_E(p.name)}</code></td><td {_TD}>{_v(p.difference)}</td>'
                     f'<td {_TD}>{_v(p.recorded)}</td><td {_TD}>{_v(p.corrected)}</td></tr>' for p in c.parameters)
    flipped = [r for r in c.rows if r.flipped][:rows]
    moved = "".join(f'<tr><td {_TD}>{r.row}</td><td {_TD}>{_v(r.reward)}</td><td {_TD}>{_v(r.advantage[0])}</td>'
                    f'<td {_TD}>{_v(r.advantage[1])}</td><td {_TD}>{_v(r.logp_change[0])}</td>'
                    f'<td {_TD}>{_v(r.logp_change[1])}</td></tr>' for r in flipped)
    return HTMLView(
        f'<section class="rw-fix" aria-label="What the fix changes" style="{head};background:{WARN_BG};'
        f'color:{WARN_FG};border-left:5px solid {WARN_FG}">'
        f'<div style="font-size:15px;font-weight:700">What the fix changes: {_E(c.verdict())}</div>'
        f'<div>Corrected from the <b>{_E(c.phase)}</b> phase: {_E(c.basis)}</div>'
        f'<div style="color:#444">Batch: {_E(batch)}. cos(g_recorded, g_corrected) = {_v(c.grad_cos)}; '
        f'cos(Δθ_recorded, Δθ_corrected) = {_v(c.update_cos)}; ‖Δθ_corrected‖ / ‖Δθ_recorded‖ = '
        f'{_v(c.update_ratio)}.</div>'
        f'<table class="rw-fix-numbers" style="border-collapse:collapse;color:#222;margin:4px 0">'
        f'<tr><th {_TH}></th><th {_TH}>recorded</th><th {_TH}>corrected</th><th {_TH}>definition</th></tr>'
        f'{table}</table>'
        + (f'<table style="border-collapse:collapse;color:#222;margin:4px 0"><tr><th {_TH}>parameter the fix changes '
           f'most</th><th {_TH}>‖Δθ_cor − Δθ_rec‖</th><th {_TH}>‖Δθ_rec‖</th><th {_TH}>‖Δθ_cor‖</th></tr>{params}'
           '</table>' if params else "")
        + (f'<table class="rw-fix-rows" style="border-collapse:collapse;color:#222;margin:4px 0"><tr>'
           f'<th {_TH}>row</th><th {_TH}>reward</th><th {_TH}>A recorded</th><th {_TH}>A corrected</th>'
           f'<th {_TH}>Σ_t Δℓ recorded (nats)</th><th {_TH}>Σ_t Δℓ corrected (nats)</th></tr>{moved}</table>'
           '<div style="color:#444">Completions whose likelihood the recorded and the corrected update move in '
           'opposite directions (Σ over the loss mask of ℓ(θ_after) − ℓ(θ_before)).</div>' if moved else
           '<div style="color:#444">No completion changes direction under the fix.</div>')
        + "</section>")


def fix_card_from_trace(trace: Any, folder: Any, replay: Any = None) -> HTMLView:
    """The card of `corrected_step(trace, folder)`; a note card naming why for a step that keeps no weights."""
    from rookworld_debug.diagnosis.replay.corrected import CorrectedStep, corrected_step
    from rookworld_debug.errors import NoWeightsError
    try:
        return fix_card(corrected_step(trace, folder, replay=replay))
    except NoWeightsError as err:
        return fix_card(CorrectedStep("", "", note=f"not computed: {err}"))
