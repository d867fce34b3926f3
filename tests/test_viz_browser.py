"""Visual checks of the self-contained views in real Chromium, offline: what the browser actually
computes (colours, outlines, tooltips, line layout), not just the HTML string. A screenshot goes to
reports/viz_views.png (git-ignored) for a human look.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rookworld_debug import viz

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (scripts/setup.sh --browser installs it)")
    strip = viz.token_strips(
        [[" ", " ", " M", ":", " e2", "e4", "<|endoftext|>", "<|endoftext|>"], [" M", ":", "\n", "x"]],
        [[1.0, 1.0, 1.3, 0.7, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 2.0]], metric="ratio",
        masks=[[1] * 7 + [0], [1, 1, 1, 1]], outlines=[[0, 0, "high", "low", 0, 0, 0, 0], [0] * 4],
        row_info=[{"reward": 1.0, "advantage": 0.7}, {"reward": 0.0, "advantage": -0.7}],
        topk=[[[(" ", -0.01), (" M", -4.0)]] * 8, [[]] * 4])
    board = viz.board_view("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", ["e2e4", "e2e5"], best="e2e4")
    banner = viz.warning_banner([("nan", "NaN in loss", "error")])
    fig = viz.loss_waterfall(-0.02, 0.004, -0.001, -0.017, kl_share=0.16)
    body = strip.html + board.html + banner.html + fig.to_html(include_plotlyjs=True, full_html=False)
    path = tmp_path_factory.mktemp("viz") / "views.html"
    path.write_text(viz.HTMLView(body).page(), encoding="utf-8")
    blocked: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                          "--disable-background-networking", "--disable-component-update"])
        try:
            pg = browser.new_page(viewport={"width": 1000, "height": 800})

            def route(r):
                if r.request.url.startswith("file://"):
                    r.continue_()
                else:                       # offline: any network request is a bug in a view
                    blocked.append(r.request.url)
                    r.abort()

            pg.route("**/*", route)
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(path.as_uri())
            pg.wait_for_selector(".js-plotly-plot .main-svg", timeout=20000)
            reports = ROOT / "reports"
            if reports.is_dir():
                pg.screenshot(path=str(reports / "viz_views.png"), full_page=True)
            yield pg, blocked, errors
        finally:
            browser.close()


def style(pg, selector: str, prop: str) -> str:
    return pg.eval_on_selector(selector, f"e => getComputedStyle(e).{prop}")


@pytest.mark.browser
def test_views_render_offline_without_errors(page):
    pg, blocked, errors = page
    assert blocked == [] and errors == []
    assert pg.locator(".rw-tok").count() >= 12
    assert pg.locator(".rw-board svg").count() == 1 and pg.locator(".rw-banner").count() == 1


@pytest.mark.browser
def test_strip_colours_outlines_and_tooltips_as_computed_by_the_browser(page):
    pg, _, _ = page
    first = '.rw-row:nth-of-type(1) [data-t="0"]'
    assert style(pg, first, "backgroundColor") == "rgb(255, 255, 255)"          # r = 1 → white
    assert style(pg, '.rw-row:nth-of-type(1) [data-t="2"]', "outlineStyle") == "solid"   # clipped high
    assert style(pg, '.rw-row:nth-of-type(1) [data-t="1"]', "outlineStyle") == "none"
    assert style(pg, '.rw-row:nth-of-type(1) [data-t="7"]', "borderTopStyle") == "dashed"  # masked pad
    title = pg.get_attribute('.rw-row:nth-of-type(1) [data-t="2"]', "title")
    assert "importance ratio = 1.3" in title and "clipped by the loss: high" in title and "\n" in title
    # tokens keep their glyphs and never collapse: every visible space token has a width
    widths = pg.eval_on_selector_all('.rw-row:nth-of-type(1) .rw-tok', "es => es.map(e => e.getBoundingClientRect().width)")
    assert all(w > 4 for w in widths)


@pytest.mark.browser
def test_newline_token_breaks_the_line(page):
    pg, _, _ = page
    tops = pg.eval_on_selector_all('.rw-row:nth-of-type(2) .rw-tok', "es => es.map(e => e.getBoundingClientRect().top)")
    assert tops[2] == tops[0] and tops[3] > tops[2]            # the token after "⏎" starts a new line


@pytest.mark.browser
def test_board_arrows_visible(page):
    pg, _, _ = page
    n = pg.eval_on_selector(".rw-board svg", "s => s.querySelectorAll('line.arrow').length")
    assert n == 2
    assert np.isclose(float(pg.eval_on_selector(".rw-board svg", "s => s.querySelector('line[stroke-dasharray]') ? 1 : 0")), 1)
