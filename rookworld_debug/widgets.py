"""ipywidgets panels over the SAME pure phase functions the step uses. No GRPO math lives here: a
slider move calls `grpo.families.advantages_from_config` + `grpo.step.loss_for` on the rollout's
recorded tensors (no forward pass) and re-renders the library's views; "Regenerate" calls
`grpo.step.sample_and_score` (generation → rewards → advantages → loss, no update).

    panel = TunePanel(setup, config)          # samples + scores one rollout (or pass rollout=...)
    panel                                     # displays itself in Jupyter

Two kinds of controls:
- loss knobs (β, ε_low, ε_high, loss_type, kl_estimator): recompute the loss record from the SAME rollout,
  in milliseconds; the panel shows the measured recompute time;
- sampling knobs (temperature, top_p, G): they change which tokens are sampled, so they mark the rollout
  stale until you press "Regenerate" (a full generation + reward pass, with a per-phase progress bar).

Stable CSS classes for tests and users: `rwd-tune-panel` (the panel), `rwd-loss-summary` (the loss/KL
share summary; `data-loss`, `data-kl-share`, `data-beta` attributes carry the exact numbers),
`rwd-status` (status line), `rwd-strip` (token strip), `rwd-figure` (plotly output).
"""
from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass
from typing import Any, Optional

from rookworld_debug.config import KL_ESTIMATORS, StepConfig
from rookworld_debug.settings import loss_types

__all__ = ["TunePanel", "tune_panel", "BETA_CHOICES", "loss_summary_html", "recompute", "LOSS_KNOBS",
           "SAMPLING_KNOBS"]

#: β values offered by the slider (0 = no KL term; the config's own β is inserted if missing)
BETA_CHOICES = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.05, 0.1, 0.2, 0.5, 1.0)
#: config fields a loss-knob change may touch (recomputed without a forward pass)
LOSS_KNOBS = ("beta", "epsilon_low", "epsilon_high", "loss_type", "kl_estimator")
#: config fields that need a new rollout (generation + rewards)
SAMPLING_KNOBS = ("temperature", "top_p", "num_generations")
_METRICS = ("kl", "logp", "ref_logp", "entropy", "ratio", "pg", "loss", "adv_x_logp")


def _f(x: Any) -> float:
    try:
        return float(x.detach().reshape(()).item()) if hasattr(x, "detach") else float(x)
    except (TypeError, ValueError):
        return math.nan


def _num(x: float, signed: bool = False) -> str:
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+∞" if x > 0 else "−∞")
    return f"{x:+.6g}" if signed else f"{x:.6g}"


def loss_summary_html(loss, *, recompute_ms: Optional[float] = None, stale: str = "") -> str:
    """The panel's summary block: total loss, PG term, β·KL term, entropy term, KL share, mean KL,
    each with its definition (all numbers read from the LossBreakdown record)."""
    from rookworld_debug.metrics import term_balance
    total, pg, kl_term, ent = _f(loss.loss), _f(loss.pg_loss), _f(loss.kl_loss), _f(loss.entropy_term)
    bal = term_balance(loss)        # no update here: the loss-VALUE share, and only where it means something
    share = bal.kl_value_share      # NaN on-policy (PG value fixed by construction) or when all terms are 0
    if bal.on_policy:
        share_txt = "n/a (on-policy)"
        share_def = ("ratio ≡ 1, so the PG value is −agg(A), fixed by the group-centred advantages whatever the "
                     "policy (≈ 0): a value share would read ~100% and mean nothing. β·KL vs PG in the gradient: "
                     "see kl_grad_share after an update (notebook 01)")
    elif math.isnan(share):
        share_txt, share_def = "undefined (all terms 0)", "|β·KL| / (|PG| + |β·KL| + |entropy term|) = 0/0"
    else:
        share_txt, share_def = f"{share:.1%}", "loss-VALUE share |β·KL| / (|PG| + |β·KL| + |entropy term|) (off-policy pass)"
    pg_def = (getattr(loss, "definition", "") or "").split("; L = ")[0] or "policy-gradient term"
    rows = [
        ("loss", _num(total, True), f"total = PG + β·KL + entropy term ({html.escape(str(loss.normalizer))})"),
        ("PG term", _num(pg, True), f"policy-gradient term, {html.escape(loss.loss_type)}: {html.escape(pg_def)}"),
        ("β·KL term", _num(kl_term, True), f"agg(β·KL_it), β = {loss.beta:g}, estimator {html.escape(loss.kl_estimator)}"),
        ("entropy term", _num(ent, True), "−c_H·H̄ (0 unless entropy_coef > 0)"),
        ("KL value share", share_txt, share_def),
        ("mean KL", _num(float(loss.kl)), "Σ m·KL_it / Σ m, raw (not β-scaled) nats/token"),
    ]
    clip = {k: v for k, v in (loss.metrics or {}).items() if k.startswith("clip_ratio/")}
    if clip:
        rows.append(("clip ratio", ", ".join(f"{k.split('/')[-1]} {_num(float(v))}" for k, v in clip.items()),
                     "fraction of tokens clipped (0 at the first inner step: r = 1 on-policy)"))
    body = "".join(f'<tr><th style="text-align:left;padding:1px 8px 1px 0">{a}</th>'
                   f'<td class="rwd-{a.split()[0].replace("β·", "").lower()}" style="font-family:monospace;'
                   f'padding:1px 8px">{b}</td><td style="color:#555">{c}</td></tr>' for a, b, c in rows)
    timing = "" if recompute_ms is None else (f'<div class="rwd-recompute" style="color:#555">recomputed in '
                                              f'{recompute_ms:.1f} ms (advantages + loss_for + views, no forward pass)</div>')
    warn = f'<div style="color:#a15c00">⚠ {html.escape(stale)}</div>' if stale else ""
    return (f'<div class="rwd-loss-summary" data-loss="{total!r}" data-kl-share="{share!r}" '
            f'data-on-policy="{int(bal.on_policy)}" '
            f'data-beta="{loss.beta!r}" data-loss-type="{html.escape(loss.loss_type)}" '
            f'data-pg="{pg!r}" data-clip-region="{float((loss.metrics or {}).get("clip_ratio/region_mean", math.nan))!r}" '
            f'data-eps-low="{loss.epsilon_low!r}" '
            f'data-kl-estimator="{html.escape(loss.kl_estimator)}">'
            f'<div style="font-weight:600">loss {_num(total, True)} · KL value share {share_txt} · '
            f'loss_type {html.escape(loss.loss_type)} · β {loss.beta:g}</div>'
            f'<div class="rwd-batch" style="color:#555;font-size:11px">batch: the sampled rollout of this batch '
            f'(B·G completions, no update applied; {"sampling time, r ≡ 1" if bal.on_policy else "an inner pass, r ≠ 1"})'
            f'</div><table style="border-collapse:collapse;font-size:12px">{body}</table>{timing}{warn}'
            f'<div style="color:#555;font-size:11px">{html.escape(getattr(loss, "definition", "") or "")}</div></div>')


@dataclass
class _State:
    config: StepConfig
    rollout: Any
    rewards: Any
    advantages: Any
    loss: Any


def recompute(state: _State, changes: dict, *, fixed_advantages=None, fixed_loss_type: Optional[str] = None,
              old_per_token_logps=None, iteration=None) -> tuple[_State, float]:
    """The panel's loss recompute, pure: advantages + loss record for new loss knobs (any of LOSS_KNOBS) on
    `state`'s rollout, no forward pass. `fixed_advantages`: a saved step's own, made under
    `fixed_loss_type` (used while the loss type stays in that objective family, whose advantages they are);
    `iteration`: an inner pass (its log-probs vs the frozen old ones); else `old_per_token_logps`
    (a saved off-policy step's). Returns (new state, seconds spent in the loss call). Bad values raise
    ConfigError (from StepConfig)."""
    from rookworld_debug.grpo.families import advantages_from_config, family_of
    from rookworld_debug.grpo.step import loss_for
    bad = sorted(set(changes) - set(LOSS_KNOBS))
    if bad:
        from rookworld_debug.errors import ConfigError
        raise ConfigError(bad[0], f"not a loss knob (those are {LOSS_KNOBS}); use regenerate() for sampling")
    cfg = state.config.replace(**changes)
    if fixed_advantages is not None and family_of(cfg.loss_type) is family_of(fixed_loss_type or cfg.loss_type):
        adv = fixed_advantages                       # a saved step's own advantages (TRL's, bit for bit)
    else:
        adv = advantages_from_config(state.rewards.rewards, cfg)
    t1 = time.perf_counter()
    if iteration is not None:                        # an off-policy pass: its log-probs vs the frozen old ones
        from rookworld_debug.grpo.phases.iterations import loss_for_iteration
        loss = loss_for_iteration(state.rollout, adv, cfg, iteration)
    else:
        loss = loss_for(state.rollout, adv, cfg, old_per_token_logps=old_per_token_logps)
    return _State(cfg, state.rollout, state.rewards, adv, loss), time.perf_counter() - t1


def _build_controls(config: StepConfig, task: str, *, iteration_options: list, iteration: int, row: int,
                    n_rows: int, metric: str) -> dict:
    """The panel's widgets, by attribute name (w_*): loss knobs, sampling knobs, view knobs, outputs."""
    import ipywidgets as W
    temp, top_p, _ = config.sampling_for(task)
    betas = sorted(set(BETA_CHOICES) | {float(config.beta)})
    lay, narrow = W.Layout(width="420px"), W.Layout(width="220px")
    st = {"description_width": "110px"}
    c = dict(
        w_beta=W.SelectionSlider(options=[(f"{b:g}", b) for b in betas], value=float(config.beta),
                                 description="β (KL coef)", continuous_update=False, layout=lay, style=st),
        w_eps_low=W.FloatSlider(value=config.epsilon_low, min=0.0, max=0.5, step=0.01, description="ε_low",
                                continuous_update=False, layout=lay, style=st),
        w_eps_high=W.FloatSlider(value=config.epsilon_high, min=0.0, max=0.5, step=0.01, description="ε_high",
                                 continuous_update=False, layout=lay, style=st),
        w_loss_type=W.Dropdown(options=list(loss_types()), value=config.loss_type, description="loss_type",
                               layout=lay, style=st),
        w_kl=W.Dropdown(options=list(KL_ESTIMATORS), value=config.kl_estimator, description="kl_estimator",
                        layout=lay, style=st),
        w_iter=W.Dropdown(options=iteration_options, layout=lay, style=st, description="inner pass",
                          value=iteration),
        w_row=W.BoundedIntText(value=min(row, n_rows - 1), min=0, max=n_rows - 1, description="completion row",
                               layout=narrow, style=st),
        w_metric=W.Dropdown(options=list(_METRICS), value=metric if metric in _METRICS else "kl",
                            description="strip metric", layout=W.Layout(width="260px"), style=st),
        w_temp=W.FloatSlider(value=temp, min=0.1, max=2.0, step=0.05, description=f"{task}: temperature",
                             continuous_update=False, layout=lay, style=st),
        w_top_p=W.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description=f"{task}: top_p",
                              continuous_update=False, layout=lay, style=st),
        w_g=W.BoundedIntText(value=config.num_generations, min=2, max=64, description="G", layout=narrow,
                             style=st),
        w_regen=W.Button(description="Regenerate", icon="refresh", button_style="primary",
                         tooltip="sample + score a new rollout with these sampling settings (no update)"),
        w_progress=W.IntProgress(value=0, min=0, max=4, description="", layout=W.Layout(width="300px")),
        w_fig=_figure_widget())
    for name, css in (("w_status", "rwd-status"), ("w_summary", "rwd-summary-box"), ("w_strip", "rwd-strip"),
                      ("w_table", "rwd-completions"), ("w_findings", "rwd-findings")):      # w_table: the whole rollout (G rows per group)
        c[name] = W.HTML()
        c[name].add_class(css)
    c["w_fig"].add_class("rwd-figure")
    return c


def _layout(p) -> Any:
    """The panel's VBox: loss knobs | sampling knobs, then summary, figure, view knobs, strip, table."""
    import ipywidgets as W
    loss_box = W.VBox([W.HTML("<b>Loss knobs</b> — recomputed from this rollout, no forward pass"),
                       p.w_beta, p.w_eps_low, p.w_eps_high, p.w_loss_type, p.w_kl, p.w_iter])
    samp_box = W.VBox([W.HTML("<b>Sampling knobs</b> — need a new rollout"), p.w_temp, p.w_top_p,
                       p.w_g, W.HBox([p.w_regen, p.w_progress]), p.w_status])
    box = W.VBox([W.HBox([loss_box, samp_box]), p.w_findings, p.w_summary, p.w_fig, W.HBox([p.w_row, p.w_metric]), p.w_strip,
                  p.w_table])
    box.add_class("rwd-tune-panel")
    return box


def _figure_widget():
    """A plotly FigureWidget (updated in place; needs anywidget), else an ipywidgets.Output.

    Why not always an Output: displaying a figure into an Output widget from a later cell/callback
    can leave nbclient (papermill) waiting for the cell until its timeout, as its Output-widget
    emulation sends comm messages back to an idle kernel; a FigureWidget is plain widget state."""
    import ipywidgets as W
    try:
        import plotly.graph_objects as go
        return go.FigureWidget()
    except ImportError:          # no anywidget: re-render into an Output (mimetype only)
        return W.Output(layout=W.Layout(min_height="300px"))


def _show_figure(target, fig) -> None:
    """Put `fig` (a static go.Figure from rookworld_debug.viz) into the panel's figure widget."""
    if hasattr(target, "batch_update"):                       # FigureWidget: in place
        if len(target.data) != len(fig.data) or any(a.type != b.type for a, b in zip(target.data, fig.data)):
            target.data = ()
            target.add_traces(list(fig.data))
        with target.batch_update():
            target.update(fig.to_dict(), overwrite=True)
        return
    with target:                                              # Output fallback
        target.clear_output(wait=True)
        fig.show(renderer="plotly_mimetype")


_PHASES = ("generation", "rewards", "advantages", "loss")


class _ProgressTimer:
    """A `grpo.step.PhaseTimer` that also moves the panel's progress bar and status line per phase."""

    def __init__(self, panel: "TunePanel"):
        from rookworld_debug.grpo.step import PhaseTimer
        self._timer, self._panel = PhaseTimer(), panel
        self.seconds = self._timer.seconds

    def __call__(self, phase: str):
        import contextlib

        @contextlib.contextmanager
        def cm():
            i = _PHASES.index(phase) + 1 if phase in _PHASES else 0
            self._panel._status(f"{i}/{len(_PHASES)} {phase} …")
            with self._timer(phase):
                yield
            self._panel.w_progress.value = max(self._panel.w_progress.value, i)
        return cm()


class TunePanel:
    """β / ε / loss_type / KL-estimator sliders over ONE rollout, plus temperature / top_p / G with a
    Regenerate button. Use `.widget` (an ipywidgets.VBox) or display the panel itself.

    `set_loss_params(**kw)` and `regenerate(**kw)` are the same code paths the controls call (for
    scripts and tests); `last_recompute_s` is the measured wall time of the last loss recompute."""

    fixed_advantages = None     # set for a saved step: its recorded advantages (no knob of their family changes them)
    fixed_loss_type = None      # the saved step's loss type (its family made those advantages)
    old_per_token_logps = None  # (N, T) a saved off-policy step's stored old log-probs (None: on-policy, ratio 1)
    step_trace = None           # a saved step: the StepTrace its diagnosis is of (None: the panel's own rollout)
    step_folder = None          # its folder (where a recorded step keeps its weights for the replay)
    replay = None               # the Replay behind the shown findings (None: not replayed)

    def __init__(self, setup, config: Optional[StepConfig] = None, *, scored=None, row: int = 0,
                 metric: str = "kl", reward_funcs=None, reward_weights=None, iterations: tuple = (),
                 iteration: Optional[int] = None):
        self.setup = setup
        # inner PPO passes of a step over this rollout (grpo.phases.iterations): the loss knobs then recompute a pass's
        # record (its log-probs vs the old ones frozen at sampling) — where r ≠ 1 and ε acts
        self.iterations = tuple(iterations or ())
        self.reward_funcs, self.reward_weights = reward_funcs, reward_weights
        config = config or setup.config
        self.task = setup.batch.tasks[0] if setup.batch.tasks else "P"
        if scored is None:
            from rookworld_debug.grpo.step import sample_and_score
            scored = sample_and_score(setup, config, reward_funcs=reward_funcs, reward_weights=reward_weights)
        rollout, rewards, advantages, loss = scored
        self.state = _State(config, rollout, rewards, advantages, loss)
        self.sampled_with = self._sampling_of(config)
        self.last_recompute_s: float = math.nan
        self.last_loss_for_s: float = math.nan
        self.history: list[dict] = []
        self._busy = False

        last = len(self.iterations) - 1
        it = (last if iteration is None else (last if iteration < 0 else iteration)) if self.iterations else -1
        for name, w in _build_controls(config, self.task, iteration_options=self._iteration_options(), iteration=it,
                                       row=row, n_rows=len(rollout.completions), metric=metric).items():
            setattr(self, name, w)
        self._table_key: tuple = ()

        for w in (self.w_beta, self.w_eps_low, self.w_eps_high, self.w_loss_type, self.w_kl, self.w_iter):
            w.observe(self._on_loss_knob, names="value")
        for w in (self.w_row, self.w_metric):
            w.observe(self._on_view_knob, names="value")
        for w in (self.w_temp, self.w_top_p, self.w_g):
            w.observe(self._on_sampling_knob, names="value")
        self.w_regen.on_click(lambda _b: self.regenerate())
        self.widget = _layout(self)
        self._status("ready: rollout sampled with " + self._sampling_text(self.sampled_with))
        self._initial_key, self._step_diagnosis = None, None     # the first render's settings are the step's
        self.refresh(recompute=True)

    # ------------------------------------------------------------------ state → config
    def _iteration_options(self) -> list:
        mu = len(self.iterations)
        return [("sampling time (r ≡ 1)", -1)] + [(f"pass {i + 1} of μ = {mu}", i) for i in range(mu)]

    @property
    def iteration(self) -> int:
        """The inner pass the loss record describes (−1 = the sampling-time record, ratio ≡ 1)."""
        return int(self.w_iter.value)

    def _sampling_of(self, cfg: StepConfig) -> tuple:
        t, p, _ = cfg.sampling_for(self.task)
        return (t, p, cfg.num_generations)

    @staticmethod
    def _sampling_text(s: tuple) -> str:
        return f"T={s[0]:g}, top_p={s[1]:g}, G={s[2]}"

    def _loss_changes(self) -> dict:
        return dict(beta=float(self.w_beta.value), epsilon_low=float(self.w_eps_low.value),
                    epsilon_high=float(self.w_eps_high.value), loss_type=self.w_loss_type.value,
                    kl_estimator=self.w_kl.value)

    def _sampling_changes(self) -> dict:
        pre = self.task.lower()
        return {f"{pre}_temperature": float(self.w_temp.value), f"{pre}_top_p": float(self.w_top_p.value),
                "num_generations": int(self.w_g.value)}

    @property
    def config(self) -> StepConfig:
        return self.state.config

    @property
    def loss(self):
        return self.state.loss

    def trace_like(self):
        """The panel's records as a `StepTrace` (no update or evaluation: the panel recomputes the loss only), the
        record the `viz.*_from_trace` adapters read."""
        from rookworld_debug.grpo.step import StepTrace
        s = self.state
        return StepTrace(config=s.config, setup=self.setup, before=None, before_heldout=None, rollout=s.rollout,
                         rewards=s.rewards, advantages=s.advantages, loss=s.loss, update=None, evaluation=None,
                         timings={}, counts={}, flags=(), capture=getattr(self, "capture", None))

    # ------------------------------------------------------------------ recompute + render
    def set_loss_params(self, **changes) -> Any:
        """Recompute advantages + loss for new loss knobs (any of LOSS_KNOBS) on the current rollout;
        returns the new LossBreakdown. Bad values raise ConfigError (from StepConfig)."""
        t0 = time.perf_counter()
        self.state, self.last_loss_for_s = recompute(
            self.state, changes, fixed_advantages=self.fixed_advantages, fixed_loss_type=self.fixed_loss_type,
            old_per_token_logps=self.old_per_token_logps,
            iteration=self.iterations[self.iteration] if self.iterations and self.iteration >= 0 else None)
        self._render(t0)
        return self.state.loss

    def refresh(self, recompute: bool = False) -> None:
        """Re-render the views; with `recompute`, first re-apply the widgets' loss knobs."""
        if recompute:
            self.set_loss_params(**self._loss_changes())
        else:
            self._render(time.perf_counter())

    def _render(self, t0: float) -> None:
        from rookworld_debug import viz
        from rookworld_debug.metrics import term_balance
        tr = self.trace_like()
        fig = viz.loss_waterfall_from_trace(tr)
        row = int(self.w_row.value)
        strip = viz.token_strips_from_trace(tr, self.w_metric.value, rows=[row])
        self.last_recompute_s = time.perf_counter() - t0
        stale = ""
        if self._sampling_of(self._pending_config()) != self.sampled_with:
            stale = ("sampling knobs changed: the views still show the rollout sampled with "
                     f"{self._sampling_text(self.sampled_with)} — press Regenerate")
        self.w_summary.value = loss_summary_html(self.state.loss, recompute_ms=1e3 * self.last_recompute_s,
                                                 stale=stale)
        self.w_strip.value = strip.html
        self._render_findings(tr)
        self._render_table(tr)
        _show_figure(self.w_fig, fig)
        self.history.append({"t": time.time(), "recompute_s": self.last_recompute_s,
                             "loss_for_s": self.last_loss_for_s, "loss": _f(self.state.loss.loss),
                             "kl_value_share": term_balance(self.state.loss).kl_value_share,   # NaN on-policy
                             "iteration": self.iteration,
                             **self._loss_changes()})

    def _settings_key(self) -> tuple:
        """What the shown records depend on: the rollout, the loss knobs of the state's config, the inner pass."""
        return (id(self.state.rollout), tuple(getattr(self.state.config, k) for k in LOSS_KNOBS), self.iteration)

    def _render_findings(self, tr) -> None:
        """At the settings the step ran with: the step's diagnosis, `diagnosis.diagnose_step` with its replay — the
        call `rookworld-debug diagnose` and the notebook's card make (once, then kept). After a knob moves: the step
        checks on the panel's recomputed records, not replayed (nothing there was recorded; no update was taken)."""
        from rookworld_debug.diagnosis import diagnose_step
        from rookworld_debug.viz.diagnosis import diagnosis_card
        if self._initial_key is None:
            self._initial_key = self._settings_key()
        if self._settings_key() == self._initial_key:
            if self._step_diagnosis is None:
                saved = self.step_trace is not None
                self._step_diagnosis = diagnose_step(self.step_trace if saved else self._first_pass(tr),
                                                     self.step_folder)
            self.findings, self.replay = self._step_diagnosis
            title = ("Diagnosis of this step (replayed, as `rookworld-debug diagnose` gives it)"
                     if self.step_trace is not None else "Diagnosis of this rollout (replayed; no update taken)")
        else:
            self.findings, self.replay = diagnose_step(tr, replay=False)
            title = "Diagnosis of these settings (no update taken; recomputed values, not replayed)"
        self.w_findings.value = diagnosis_card(self.findings, title=title, limit=3, evidence=3).html

    def _first_pass(self, tr):
        """The rollout as its first pass scored it: a later pass's loss is taken against π_old's frozen log-probs,
        which the panel's trace does not carry, so the replay checks the pass whose π_old is the policy itself."""
        import dataclasses
        if not self.iterations or self.iteration <= 0:
            return tr
        return dataclasses.replace(tr, loss=self.iterations[0].loss)

    def _render_table(self, tr) -> None:
        """The completions table of the whole current rollout (re-rendered only when the rollout or its
        advantages change: a β/ε move leaves it as it is)."""
        from rookworld_debug import viz
        key = (id(tr.rollout), id(tr.advantages))
        if key == self._table_key:
            return
        a = tr.advantages
        zero = ", ".join(f"p{b}" for b in a.zero_std_groups) or "none"
        label = (f"rollout sampled with {self._sampling_text(self.sampled_with)} — {len(tr.rollout.completions)} "
                 f"completions = B {int(a.group_mean.numel())} × G {int(a.num_generations)}, this batch, no update; "
                 f"zero-σ groups (advantage 0, no PG signal): {zero}")
        self.w_table.value = viz.completions_table_from_trace(tr, batch_label=label).html
        self._table_key = key

    def _pending_config(self) -> StepConfig:
        return self.state.config.replace(**self._sampling_changes())

    def _status(self, text: str, color: str = "#333") -> None:
        self.w_status.value = f'<span style="color:{color}">{html.escape(text)}</span>'

    # ------------------------------------------------------------------ callbacks
    def _on_loss_knob(self, _change) -> None:
        if self._busy:
            return
        try:
            self.refresh(recompute=True)
        except Exception as exc:  # noqa: BLE001 — shown in the panel, the kernel keeps going
            self._status(f"recompute failed: {type(exc).__name__}: {exc}", "#b00020")

    def _on_view_knob(self, _change) -> None:
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001
            self._status(f"view failed: {type(exc).__name__}: {exc}", "#b00020")

    def _on_sampling_knob(self, _change) -> None:
        if self._busy:
            return
        self._status("sampling knobs changed — press Regenerate (the views show the old rollout)", "#a15c00")
        self.refresh()

    # ------------------------------------------------------------------ regenerate
    def regenerate(self, **changes) -> None:
        """Sample + score a new rollout (generation → rewards → advantages → loss, no update) with the
        widgets' sampling knobs, or with `changes` (`temperature`, `top_p`, `num_generations`)."""
        from rookworld_debug.grpo.step import sample_and_score
        key = {"temperature": self.w_temp, "top_p": self.w_top_p, "num_generations": self.w_g}
        bad = sorted(set(changes) - set(key))
        if bad:
            from rookworld_debug.errors import ConfigError
            raise ConfigError(bad[0], f"not a sampling knob (those are {SAMPLING_KNOBS})")
        self._busy = True
        try:
            for k, v in changes.items():
                key[k].value = v
            cfg = self.state.config.replace(**self._sampling_changes(), **self._loss_changes())
            self.w_regen.disabled = True
            self.w_progress.max, self.w_progress.value = len(_PHASES), 0
            timer = _ProgressTimer(self)
            self._status(f"generating {len(self.setup.batch.prompts)}×{cfg.num_generations} completions "
                         f"({self._sampling_text(self._sampling_of(cfg))}) …")
            rollout, rewards, adv, loss = sample_and_score(self.setup, cfg, reward_funcs=self.reward_funcs,
                                                           reward_weights=self.reward_weights, timer=timer)
            self.state = _State(cfg, rollout, rewards, adv, loss)
            self.sampled_with = self._sampling_of(cfg)
            if self.iterations:                  # the passes belonged to the old rollout
                self.iterations = ()
                self.w_iter.options, self.w_iter.value = self._iteration_options(), -1
            n = len(rollout.completions)
            self.w_row.max = n - 1
            if self.w_row.value > n - 1:
                self.w_row.value = n - 1
            self.last_timings = dict(timer.seconds)
            self._status("regenerated in " + ", ".join(f"{k} {v:.1f}s" for k, v in timer.seconds.items())
                         + f" — {self._sampling_text(self.sampled_with)}", "#1b5e20")
        except Exception as exc:  # noqa: BLE001
            self._status(f"regenerate failed: {type(exc).__name__}: {exc}", "#b00020")
            raise
        finally:
            self._busy = False
            self.w_regen.disabled = False
        self.refresh()

    # ------------------------------------------------------------------ display
    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


def tune_panel(setup, config: Optional[StepConfig] = None, **kw) -> TunePanel:
    """Factory for :class:`TunePanel` (samples and scores one rollout unless `scored=` is given)."""
    return TunePanel(setup, config, **kw)


def tune_panel_from_trace(trace, *, folder=None, row: int = 0, metric: str = "kl") -> TunePanel:
    """The panel over a SAVED step (e.g. a TRL capture, `StepTrace.load(path)`): the loss knobs recompute
    the step's loss from its recorded tensors with `loss_for` (a pure recompute, no model needed); the
    sampling knobs are disabled, since a saved step has no model to sample from. `folder`: the step's folder
    (a recorded step's weights are there: its diagnosis then replays the weight phases too)."""
    class _SavedStepPanel(TunePanel):
        step_trace, step_folder = trace, folder
        fixed_advantages = trace.advantages
        fixed_loss_type = trace.config.loss_type
        old_per_token_logps = getattr(getattr(trace, "capture", None), "old_per_token_logps", None)
    panel = _SavedStepPanel(trace.setup, trace.config, row=row, metric=metric,
                            scored=(trace.rollout, trace.rewards, trace.advantages, trace.loss),
                            iterations=getattr(trace, "iterations", ()) or ())
    if getattr(trace.setup, "policy", None) is None:
        for w in (panel.w_temp, panel.w_top_p, panel.w_g, panel.w_regen):
            w.disabled = True
        what = "a step captured from TRL's GRPOTrainer" if getattr(trace, "capture", None) is not None else "a saved step"
        cap = getattr(trace, "capture", None)
        trained = sum(len(r) for r in cap.micro_batch_rows) if cap is not None else 0
        n = trace.rollout.completion_ids.shape[0]
        part = (f"; this optimizer step trained {trained} of the generation batch's {n} rows, the panel recomputes "
                "the loss over all of them" if cap is not None and 0 < trained < n else "")
        panel._status(f"{what}: loss knobs recompute from its tensors; sampling needs a model (disabled){part}")
    return panel
