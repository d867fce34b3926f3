"""The replay seen: `viz.replay_view` (one row per phase, the first disagreement's tokens highlighted, recorded vs
recomputed plotted) on steps of the lab's hand-written loop recorded through StepRecorder, healthy and with faults;
and one diagnosis everywhere: notebook 01's diagnosis cell, the tune panel and `diagnose_folder` (what `rookworld-debug
diagnose` runs; the command itself: test_replay_report) list the same findings in the same order
(`diagnosis.diagnose_step`)."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"num_prompts": 2, "num_generations": 3, "steps": 1}
# faults of the hand-written loop (lab.handloop.FAULTS), each with the settings it needs to change the step
SLOW_FAULTS = {"sampler_no_temperature": {}, "no_clip": {"max_grad_norm": 1e-3}, "loss_adv_sign": {}}


def _record(folder: Path, fault: str = "", **kw):
    from rookworld_debug.lab.handloop import LoopConfig, run
    return run(LoopConfig(**{**SMALL, **kw}), out=str(folder), fault=fault)


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict:
    """{name: folder}: the healthy loop's step; the same step with its advantages negated before the loss (the
    loop's recorded advantages have the wrong sign); the loop with its rewards shifted one row (reward_shift)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("replay_view")
    rec = _record(root / "healthy")
    rec.pieces["advantages"] = -rec.pieces["advantages"]
    rec.save(root / "adv_negated")
    _record(root / "reward_shift", "reward_shift")
    return {"healthy": root / "healthy", "adv_negated": root / "adv_negated", "reward_shift": root / "reward_shift"}


@pytest.fixture(scope="module")
def replays(steps) -> dict:
    from rookworld_debug.diagnosis import diagnose_step
    from rookworld_debug.grpo.step import StepTrace
    return {k: diagnose_step(StepTrace.load(f), f) for k, f in steps.items()}


def _rows(table_html: str) -> dict:
    """{phase: (status, classes)} of the replay table's rows."""
    return {m[2]: (m[3], m[1]) for m in re.finditer(r'<tr class="([^"]*)" data-phase="([^"]+)" data-status="([^"]+)"',
                                                     table_html)}


def _cell(name: str, marker: str) -> str:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    return cell.source


def _notebook_diagnosis(folder: Path) -> tuple[list, list]:
    """Notebook 01's diagnosis cell, run as written on the saved step: (its findings, what it displayed)."""
    from rookworld_debug import viz
    from rookworld_debug.grpo.step import StepTrace
    shown: list = []
    ns = {"trace": StepTrace.load(folder), "trace_path": str(folder), "viz": viz, "display": shown.append}
    exec(_cell("01_grpo_step.ipynb", "diagnose_step("), ns)  # noqa: S102 - the shipped notebook's own cell
    return ns["findings"], shown


# ------------------------------------------------------------------------------------------- the view
def test_the_view_of_an_agreeing_step_marks_no_phase(replays):
    from rookworld_debug import viz
    from rookworld_debug.diagnosis.replay import PHASES
    findings, rep = replays["healthy"]
    assert rep is not None and rep.first_disagreement is None
    view = viz.replay_view(rep)
    rows = _rows(view.table.html)
    assert list(rows) == [p for p in PHASES if p in rows] and set(rows) == set(PHASES)
    assert {s for s, _ in rows.values()} <= {"agree", "not replayed"} and "rw-replay-first" not in view.table.html
    assert "Every replayed phase agrees" in view.table.html and "N = 6 rows = B 2 prompts × G 3" in view.table.html
    assert view.figure is None and "No phase disagrees" in view.tokens.html and 'class="rw-tok rw-hl' not in view.html
    assert "replay_agrees" in [f.code for f in findings]
    off = viz.replay_view(None)                          # a diagnosis run without its replay says so
    assert "Not replayed" in off.html and off.figure is None


def test_the_view_of_negated_advantages_marks_the_phase_the_rows_and_plots_the_flip(replays):
    from rookworld_debug import viz
    findings, rep = replays["adv_negated"]
    assert findings[0].code == "advantage_sign_flipped" and findings[0].severity == "error"
    view = viz.replay_view(rep)
    rows = _rows(view.table.html)
    assert rows["advantages"][0] == "disagree" and "rw-replay-first" in rows["advantages"][1]
    assert all("rw-replay-first" not in cls for p, (_, cls) in rows.items() if p != "advantages")
    assert rows["rewards"][0] == "agree" and "advantage_sign_flipped" in view.table.html
    # the plot: recorded = −recomputed for every row, all 6 beyond the tolerance
    s = rep.first_disagreement.samples
    pts = [tr for tr in view.figure.data if tr.mode == "markers"]
    assert len(pts) == 1 and pts[0].name.startswith("|diff| >")
    x, y = list(pts[0].x), list(pts[0].y)
    assert len(x) == 6 == s.total == s.n_beyond and all(abs(a + b) < 1e-5 for a, b in zip(x, y))
    trace = rep.trace
    assert sorted(y) == pytest.approx(sorted(trace.advantages.advantages.tolist()), abs=1e-6)
    # the token view: every in-loss token of the shown rows underlined, the rows worst first
    shown = re.findall(r'<div class="rw-lab"><b>(p\d·g\d)', view.tokens.html)
    assert shown == [f"p{r // 3}·g{r % 3}" for (r,) in s.beyond[:4]]
    mask = trace.rollout.completion_mask
    n_lit = len(re.findall(r'class="rw-tok[^"]* rw-hl"', view.tokens.html))
    assert n_lit == int(sum(mask[r].sum() for (r,) in s.beyond[:4])) > 0
    assert "differs from the replay" in view.tokens.html and "recorded" in view.tokens.html


def test_the_plot_of_shifted_rewards_holds_the_recorded_and_recomputed_rewards(replays, steps):
    from rookworld_debug import viz
    from rookworld_debug.grpo.step import StepTrace
    findings, rep = replays["reward_shift"]
    c = rep.first_disagreement
    assert c.phase == "rewards" and findings[0].code == "reward_rows_misaligned"
    fig = viz.replay_figure(rep)
    recorded = StepTrace.load(steps["reward_shift"]).rewards.rewards.tolist()
    got = {}
    for tr in fig.data:
        if tr.mode == "markers":
            for text, xv, yv in zip(tr.text, tr.x, tr.y):
                got[int(text.split()[-1])] = (xv, yv)
    assert sorted(got) == list(range(6))
    assert [got[i][1] for i in range(6)] == pytest.approx(recorded, abs=1e-9)          # y: what the loop recorded
    assert [got[i][0] for i in range(6)] == pytest.approx(list(c.samples.recomputed), abs=1e-9)
    assert [got[i][1] for i in range(6)] == pytest.approx(torch.tensor([got[i][0] for i in range(6)]).roll(1).tolist(),
                                                          abs=1e-6)                       # a shift by one row
    assert "rewards (N,)" in fig.layout.title.text and "Batch: the recorded step" in fig.layout.title.text


def test_token_strips_highlight_positions_with_their_reason():
    from rookworld_debug.viz import token_strips
    strip = token_strips([["a", "b", "c"], ["d", "e"]], [[0.1, 0.2, 0.3], [0.4, 0.5]], metric="kl",
                         highlights=[[False, "recorded 1, recomputed 2", False], [True, False]],
                         highlight_label="differs from the replay")
    lit = re.findall(r'<span class="rw-tok[^"]* rw-hl" data-t="(\d)"[^>]*title="([^"]*)"', strip.html)
    assert [t for t, _ in lit] == ["1", "0"]
    assert "differs from the replay: recorded 1, recomputed 2" in lit[0][1]
    assert "differs from the replay" in strip.html.split('class="rw-legend"')[1]
    plain = token_strips([["a"]], [[0.1]], metric="kl")
    assert "rw-hl" not in plain.html and "differs from" not in plain.html
    with pytest.raises(ValueError):
        token_strips([["a", "b"]], [[0.1, 0.2]], metric="kl", highlights=[[True]])


# ------------------------------------------------------------------------------------------- one diagnosis
@pytest.mark.parametrize("name", ["adv_negated", "reward_shift"])
def test_the_notebook_card_lists_what_diagnose_lists(name, steps):
    from rookworld_debug.diagnosis.registry import diagnose_folder
    from rookworld_debug.viz.replay import ReplayView
    found, shown = _notebook_diagnosis(steps[name])
    codes = [f.code for f in diagnose_folder(steps[name])[0]]
    assert [f.code for f in found] == codes
    card, view = shown
    listed = [f.code for f in found if not (f.code == "phase_note" and f.severity == "info")][:5]
    assert re.findall(r'data-code="([^"]+)"', card.html) == listed
    assert isinstance(view, ReplayView) and "rw-replay-first" in view.table.html
    errors = sum(f.severity == "error" for f in found if not (f.code == "phase_note" and f.severity == "info"))
    assert errors >= 1 and f"{errors} error-level" in card.html


def test_the_tune_panel_shows_the_steps_diagnosis_then_the_settings(steps, replays):
    pytest.importorskip("ipywidgets")
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.widgets import tune_panel_from_trace
    folder = steps["adv_negated"]
    panel = tune_panel_from_trace(StepTrace.load(folder), folder=folder)
    assert [f.code for f in panel.findings] == [f.code for f in replays["adv_negated"][0]]
    assert panel.replay is not None and panel.replay.first_disagreement.phase == "advantages"
    assert "as `rookworld-debug diagnose` gives it" in panel.w_findings.value
    panel.set_loss_params(beta=0.5)                  # recomputed values: checked, not replayed
    assert panel.replay is None and "not replayed" in panel.w_findings.value
    panel.set_loss_params(beta=float(StepTrace.load(folder).config.beta))   # back: the step's own diagnosis
    assert panel.replay is not None and [f.code for f in panel.findings][0] == "advantage_sign_flipped"


def test_the_page_names_the_loop_that_wrote_the_step(steps):
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.steplog import format_step_log
    from rookworld_debug.viz import invariants_note, written_by
    trace = StepTrace.load(steps["adv_negated"])
    assert written_by(trace) == "the training loop 'lab hand-written loop' (recorded through StepRecorder)"
    assert invariants_note(trace).startswith("not recorded: the training loop 'lab hand-written loop'")
    assert "TRL" not in invariants_note(trace)
    assert "step-0 invariants: not recorded: the training loop 'lab hand-written loop'" in format_step_log(trace, [])
    assert "TRL" not in _cell("01_grpo_step.ipynb", "invariants_note").split("else:")[1]


# ------------------------------------------------------------------------------------------- more faults (slow)
@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(SLOW_FAULTS))
def test_the_notebook_card_lists_what_diagnose_lists_for_more_loop_faults(fault, tmp_path):
    from rookworld_debug.diagnosis.registry import diagnose_folder
    from rookworld_debug.diagnosis.replay import PHASES
    from rookworld_debug.lab.handloop import FAULTS
    _record(tmp_path / fault, fault, **SLOW_FAULTS[fault])
    found, (card, view) = _notebook_diagnosis(tmp_path / fault)
    assert [f.code for f in found] == [f.code for f in diagnose_folder(tmp_path / fault)[0]]
    assert found[0].severity == "error" and f'data-code="{found[0].code}"' in card.html
    # the first disagreement is marked: the fault's phase, or a later one (on-policy the loss VALUE of a flipped A
    # agrees; its gradient does not)
    rows = _rows(view.table.html)
    (first,) = [p for p, (_, cls) in rows.items() if "rw-replay-first" in cls]
    assert rows[first][0] == "disagree" and PHASES.index(first) >= PHASES.index(FAULTS[fault][0])
    assert all(st != "disagree" for p, (st, _) in rows.items() if PHASES.index(p) < PHASES.index(first))
    assert view.figure is not None
