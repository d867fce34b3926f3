"""The step at a glance: offline math, GLOSSARY-filled definitions, the completions table,
an honest KL share, and — in a real Chromium with the network blocked — the report (summary on the first
screen, rendered MathML, the completions table) and the sweep index (fits 1,400 px). Screenshots go to
reports/screenshots/ (git-ignored) so a person can look at them."""
from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
import torch

from rookworld_debug import StepConfig, run_step, viz
from rookworld_debug.grpo.step import loss_for
from rookworld_debug.metrics import term_balance
from rookworld_debug.report.export import export_html

REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "reports" / "screenshots"
RAW_LATEX = re.compile(r"\$\$|\\frac|\\mathrm|\\operatorname|\\varepsilon|\\beta\b")


class _Visible(HTMLParser):
    """Text a reader sees: everything outside <script>/<style>."""

    def __init__(self):
        super().__init__()
        self.skip, self.out = 0, []

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style") and self.skip > 0

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def visible_text(html: str) -> str:
    p = _Visible()
    p.feed(html)
    return "".join(p.out)


def test_exported_notebook_math_is_mathml_not_raw_latex():
    nb = nbformat.read(REPO / "notebooks" / "01_grpo_step.ipynb", as_version=4)
    assert any("\\frac" in c.source for c in nb.cells if c.cell_type == "markdown")   # the premise
    body, check = export_html(nb)
    assert check.math_formulas >= 2 and body.count("<math") >= 2
    assert not RAW_LATEX.search(visible_text(body)), RAW_LATEX.search(visible_text(body))
    assert check.external_refs == 0


@pytest.fixture(scope="module")
def trace():
    torch.set_num_threads(1)
    cfg = StepConfig(batch_size=2, num_generations=4, max_new_tokens=16, eval_max_new_tokens=16, heldout_n=1)
    return run_step(cfg)


def test_every_summary_metric_has_a_glossary_definition(trace):
    html = viz.metrics_table(trace.summary()).to_html()
    cells = re.findall(r'<td[^>]*class="[^"]*col1[^"]*"[^>]*>(.*?)</td>', html, re.S)
    assert len(cells) == len(trace.summary())
    assert all(c.strip() and "no definition" not in c for c in cells)
    assert {"num_tokens", "learning_rate", "completions/max_terminated_length", "rewards/rookworld/mean",
            "kl_grad_share"} <= set(trace.summary())


def test_completions_table_shows_whole_groups_and_filters(trace):
    n, g = len(trace.rollout.completions), trace.config.num_generations
    rows = viz.completions_rows(trace)
    assert [r["name"] for r in rows[:2]] == ["p0·g0", "p0·g1"] and len(rows) == n
    assert viz.completions_table_from_trace(trace).html.count("<tr>") == n + 1
    assert viz.completions_table_from_trace(trace, group=1).html.count("<tr>") == g + 1
    top = viz.completions_rows(trace)
    best = max(r["advantage"] for r in top)
    one = viz.completions_table_from_trace(trace, top=1).html
    assert one.count("<tr>") == 2 and f"{best:+.3f}" in one
    bad = [r for r in rows if not r["format_ok"] or r["flags"]]
    assert viz.completions_table_from_trace(trace, failures_only=True).html.count("<tr>") == len(bad) + 1


def test_kl_share_never_100_percent_when_pg_is_structurally_zero(trace):
    ro, cfg = trace.rollout, trace.config.replace(loss_type="grpo", beta=0.1)
    # a reference that disagrees with the policy: KL > 0 while the rollout is still on-policy (ratio ≡ 1)
    ro = dataclasses.replace(ro, ref_per_token_logps=ro.per_token_logps - 0.05 * ro.completion_mask,
                             per_token_full_kl=None)
    lo = loss_for(ro, trace.advantages, cfg)
    assert float(lo.kl_loss) > 0 and abs(float(lo.pg_loss)) < 1e-6      # grpo + centred A: PG value 0
    assert lo.kl_share > 0.99                                          # the misleading value share
    bal = term_balance(lo, None)
    assert bal.on_policy and math.isnan(bal.kl_value_share) and "100%" not in bal.headline
    fig = viz.loss_waterfall(float(lo.pg_loss), float(lo.kl_loss), float(lo.entropy_term), float(lo.loss),
                             kl_share=bal.kl_value_share, headline=bal.headline)
    assert "100" not in fig.layout.title.text.split("<br>")[0]
    s = trace.summary()
    assert math.isnan(s["kl_share"])                                   # on-policy: no value share
    norms = trace.update.per_term_global
    if sum(norms.values()) > 0:                                        # all-zero-σ batches have no gradient
        assert s["kl_grad_share"] == pytest.approx(norms["kl"] / sum(norms.values()))


@pytest.mark.browser
def test_report_and_index_in_chromium_offline(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (scripts/setup.sh --browser installs it)")
    cmd = [sys.executable, "-m", "rookworld_debug.report_cli", str(REPO / "notebooks" / "01_grpo_step.ipynb"),
           "-p", "batch_size=2", "-p", "max_new_tokens=16", "-p", "eval_max_new_tokens=16", "-p", "heldout_n=1",
           "--sweep-name", "glance", "--out", str(tmp_path), "--no-progress"]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = tmp_path / "glance"
    report = next(sweep.glob("*/report.html"))
    assert not RAW_LATEX.search(visible_text(report.read_text()))
    SHOTS.mkdir(parents=True, exist_ok=True)
    blocked, errors = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                          "--disable-background-networking", "--disable-component-update"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            from conftest import block_network
            block_network(page, blocked)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.as_uri())
            page.wait_for_selector(".rw-exec")
            box = page.locator(".rw-exec").bounding_box()
            assert box["y"] + box["height"] <= 900, box            # the whole summary on the first screen
            page.screenshot(path=str(SHOTS / "report_first_screen.png"))
            text = page.inner_text("body")
            assert not RAW_LATEX.search(text), RAW_LATEX.search(text)
            maths = page.locator("math[display=block]")
            assert maths.count() >= 2 and maths.first.bounding_box()["height"] > 20   # rendered, not inline text
            maths.first.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "report_math.png"))
            table = page.locator(".rw-completions table").first
            assert table.locator("tbody tr").count() == 2 * 4
            table.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "report_completions.png"))
            # the signal-or-noise section, each number with its batch and estimator
            sig = page.locator(".rw-signal")
            assert sig.count() == 1
            sig_text = sig.inner_text()
            for needed in ("SNR across groups", "B_simple", "bootstrap over groups", "greedy Δreward, this batch",
                           "paired bootstrap", "Batch: the sampled rollout",
                           "what if G were smaller", "seeded draws of G′",          # the G′ sweep and its estimator
                           "predicted entropy change −η·Cov", "first-order", "measured entropy change",
                           "on the same sampled tokens", "Clip events by bound and sign of A",
                           "sampler–trainer gap", "masked tokens of the rollout", "truncated IS weights ESS",
                           "(Σw)²/Σw²"):
                assert needed in sig_text, needed
            titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()   # SVG: no innerText
            assert any("What if G were smaller" in t for t in titles), titles
            assert any("Sampler–trainer gap" in t for t in titles), titles
            sig.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "report_signal_noise.png"))
            page.screenshot(path=str(SHOTS / "report_full.png"), full_page=True)

            page.goto((sweep / "index.html").as_uri())
            width = page.evaluate("document.querySelector('table.runs').getBoundingClientRect().width")
            assert width <= 1400 - 2 * 32, width
            assert page.evaluate("document.documentElement.scrollWidth") <= 1400
            link = page.locator("table.runs a", has_text="report").first
            lb = link.bounding_box()
            assert lb and lb["x"] + lb["width"] <= 1400 and lb["y"] < 900
            page.screenshot(path=str(SHOTS / "index.png"), full_page=True)
        finally:
            browser.close()
    assert blocked == [] and errors == [], (blocked, errors)
