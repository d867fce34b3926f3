"""The replay view in a real JupyterLab, in headless Chromium (Playwright): notebook 01 opened on a recorded step of
the lab's hand-written loop whose advantages have the wrong sign; after "Run All Cells" the diagnosis card names
the error, the replay table marks the advantages phase, the disagreeing rows' tokens are highlighted and the
recorded-vs-recomputed figure is drawn. A screenshot goes to reports/jupyterlab_replay_view.png (git-ignored).

The notebook is notebook 01's own cells up to its diagnosis (parameters, imports, loading the step, provenance,
diagnosis and replay), with `trace_path` set to the step: the later phases' views are notebook 01's other tests'.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
import pytest
import torch

from test_browser_jupyterlab import CHROMIUM, CHROMIUM_ARGS, need_browser, run_all_cells, serve_lab

ROOT = Path(__file__).resolve().parents[1]
NB = "01_grpo_step.ipynb"


def _notebook(dst: Path, step: Path) -> None:
    """Notebook 01 through its diagnosis cell and the fix card under it, its parameters cell pointing at `step`."""
    nb = nbformat.read(ROOT / "notebooks" / NB, as_version=4)
    last = next(i for i, c in enumerate(nb.cells) if "fix_card_from_trace(" in c.source)
    nb.cells = nb.cells[:last + 1]
    src = nb.cells[0].source
    assert src.count("trace_path = None") == 1
    nb.cells[0].source = src.replace("trace_path = None", f"trace_path = {str(step)!r}")
    nbformat.write(nb, dst / NB)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A recorded faulty step and a JupyterLab server on 127.0.0.1 over notebook 01 opened on it."""
    need_browser()
    from rookworld_debug.lab.handloop import LoopConfig, run
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("replay_lab")
    rec = run(LoopConfig(num_prompts=2, num_generations=3, steps=1), out=str(root / "healthy"))
    rec.pieces["advantages"] = -rec.pieces["advantages"]     # the loop's advantages have the wrong sign
    nbdir = root / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir, rec.save(root / "step"))
    with serve_lab(root, nbdir) as server:
        yield server


def _shown_text(locator, timeout_s: float = 30.0) -> str:
    """The element's text once it is on screen: JupyterLab skips rendering cells outside the viewport (CSS
    content-visibility), and a skipped element's text reads empty until it is scrolled to."""
    deadline = time.monotonic() + timeout_s
    while True:
        locator.scroll_into_view_if_needed()
        text = locator.inner_text()
        if text.strip() or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


@pytest.mark.browser
def test_the_replay_view_and_the_fix_card_render_in_notebook_01_on_a_faulty_recorded_step(lab):
    from playwright.sync_api import sync_playwright
    shot = ROOT / "reports" / "jupyterlab_replay_view.png"
    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        try:
            # the fix card is the last cell's output: once it is there, every cell above has run
            run_all_cells(page, lab, NB, "section.rw-fix")
            head = re.search(r"(\d+) error-level", _shown_text(page.locator(".rw-diagnosis").first))
            assert head and int(head[1]) >= 1
            assert page.locator('.rw-finding[data-code="advantage_sign_flipped"]').count() == 1
            first = page.locator("tr.rw-replay-first")
            assert first.count() == 1 and first.get_attribute("data-phase") == "advantages"
            assert first.get_attribute("data-status") == "disagree" and "disagrees" in first.inner_text()
            assert page.locator('tr[data-phase="rewards"][data-status="agree"]').count() == 1
            lit = page.locator(".rw-replay-tokens .rw-tok.rw-hl")
            assert lit.count() > 0 and lit.first.is_visible()
            assert "differs from the replay" in (lit.first.get_attribute("title") or "")
            page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
            fig = page.locator(".js-plotly-plot").filter(has_text="recorded vs recomputed")
            assert fig.count() >= 1
            fix = page.locator("section.rw-fix")          # what the fix changes, under the diagnosis
            assert fix.count() == 1 and fix.first.is_visible()
            said = _shown_text(fix.first)
            assert "What the fix changes:" in said and "advantages" in said
            page.locator("tr.rw-replay-first").scroll_into_view_if_needed()
            if shot.parent.is_dir():
                page.screenshot(path=str(shot), full_page=False)
            errors = [o for o in page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                      .all_inner_texts() if "Traceback" in o]
            assert not errors, errors[:1]
        finally:
            browser.close()
    assert time.monotonic() - t0 < 420
