"""The side-by-side view (grpo/dapo vs rookworld-rlvr's mini on one rollout) and the mini's findings, rendered
and read back in real Chromium, offline."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rookworld_debug import viz
from rookworld_debug.config import StepConfig
from rookworld_debug.grpo.step import run_step
from rookworld_debug.grpo.multistep.start import setup
from tests.test_rlvr_step import BASE


@pytest.fixture(scope="module")
def step():
    torch.set_num_threads(1)
    cfg = StepConfig(**{**BASE, "num_generations": 4, "seed": 5, "rlvr_pitfalls": ("prompt_mask_left_pad",)})
    s = setup(cfg)
    trace = run_step(cfg, session=s)
    return trace, viz.rlvr_side_by_side_from_trace(trace, policy=s.policy)   # lr 0: θ is the sampling θ


def test_side_by_side_numbers(step):
    trace, sbs = step
    names = [v.loss_type for v in sbs.objectives]
    assert names == ["grpo", "dapo", "rlvr_mini"]
    grpo, dapo, mini = sbs.objectives
    # grpo and dapo share TRL's advantages; the mini normalises over the whole batch
    assert torch.equal(grpo.advantages, dapo.advantages) and not torch.allclose(grpo.advantages, mini.advantages)
    # at π = π_ref TRL's k3 KL has no gradient, so rows with A = 0 are not moved by grpo ...
    still = grpo.advantages == 0
    assert bool((grpo.row_weight[still].abs() <= 1e-12).all())
    # ... but the mini's forward KL surrogate pushes every trained token by −β·e^ℓ/N
    if bool(still.any()):
        assert bool((mini.row_weight[still].abs() > 1e-6).all())
    assert sbs.cos_logp.shape == (3, 3) and abs(float(sbs.cos_logp[0, 0]) - 1) < 1e-9
    assert sbs.cos_param is not None and all(-1 - 1e-6 <= float(x) <= 1 + 1e-6 for x in sbs.cos_param.flatten()
                                             if not math.isnan(float(x)))


def test_side_by_side_in_chromium(step, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium")
    trace, sbs = step
    body = (viz.rlvr_side_by_side_table(sbs).to_html() + viz.rlvr_cosine_table(sbs).to_html()
            + viz.rlvr_findings_from_trace(trace).to_html()
            + viz.rlvr_side_by_side_figure(sbs).to_html(include_plotlyjs=True, full_html=False))
    path = tmp_path / "side_by_side.html"
    path.write_text(viz.HTMLView(body).page(), encoding="utf-8")
    blocked = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            pg = browser.new_page()
            pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
                     else (blocked.append(r.request.url), r.abort()))
            pg.goto(path.as_uri())
            pg.wait_for_selector(".js-plotly-plot .main-svg", timeout=20000)
            text = pg.inner_text("body")
            n_bars = pg.locator(".js-plotly-plot .bars .point").count()
        finally:
            browser.close()
    assert not blocked
    for needle in ("row weight (rlvr_mini)", "A (grpo)", "parameter space", "rlvr_prompt_trained",
                   "Which rows each objective moves"):
        assert needle in text, needle
    assert n_bars == 3 * int(sbs.rewards.shape[0])
