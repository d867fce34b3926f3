"""The replay view in a real JupyterLab, in headless Chromium (Playwright): notebook 01 opened on a recorded step of
the lab's hand-written loop whose advantages have the wrong sign; after "Run All Cells" the diagnosis card names
the error, the replay table marks the advantages phase, the disagreeing rows' tokens are highlighted and the
recorded-vs-recomputed figure is drawn. A screenshot goes to reports/jupyterlab_replay_view.png (git-ignored).

The notebook is notebook 01's own cells up to its diagnosis (parameters, imports, loading the step, provenance,
diagnosis and replay), with `trace_path` set to the step: the later phases' views are notebook 01's other tests'.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
import torch

from test_browser_jupyterlab import CHROMIUM, CHROMIUM_ARGS, _free_port

ROOT = Path(__file__).resolve().parents[1]
NB = "01_grpo_step.ipynb"


def _notebook(dst: Path, step: Path) -> None:
    """Notebook 01 through its diagnosis cell, its parameters cell pointing at `step`."""
    nb = nbformat.read(ROOT / "notebooks" / NB, as_version=4)
    last = next(i for i, c in enumerate(nb.cells) if "diagnose_step(" in c.source)
    nb.cells = nb.cells[:last + 1]
    src = nb.cells[0].source
    assert src.count("trace_path = None") == 1
    nb.cells[0].source = src.replace("trace_path = None", f"trace_path = {str(step)!r}")
    nbformat.write(nb, dst / NB)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A recorded faulty step and a JupyterLab server on 127.0.0.1 over notebook 01 opened on it."""
    pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no {CHROMIUM} (scripts/setup.sh --browser installs it)")
    jupyter = Path(sys.executable).parent / "jupyter"
    if not jupyter.exists():
        pytest.skip("jupyter is not installed in this environment")
    from rookworld_debug.lab.handloop import LoopConfig, run
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("replay_lab")
    rec = run(LoopConfig(num_prompts=2, num_generations=3, steps=1), out=str(root / "healthy"))
    rec.pieces["advantages"] = -rec.pieces["advantages"]     # the loop's advantages have the wrong sign
    nbdir = root / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir, rec.save(root / "step"))
    state = root / "state"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "JUPYTER_RUNTIME_DIR": str(state / "runtime"), "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"),
           "JUPYTER_CONFIG_DIR": str(state / "config")}
    port, token = _free_port(), os.urandom(16).hex()
    log = open(root / "jupyterlab.log", "wb")
    proc = subprocess.Popen(
        [str(jupyter), "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={nbdir}",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(nbdir),
        start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited ({proc.returncode}):\n{(root / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("jupyter lab did not answer within 90 s")
            time.sleep(0.5)
        yield {"base": base, "token": token}
    finally:
        try:                                    # the server's own process group: kernels included
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        log.close()


@pytest.mark.browser
def test_the_replay_view_renders_in_notebook_01_on_a_faulty_recorded_step(lab):
    from playwright.sync_api import sync_playwright
    shot = ROOT / "reports" / "jupyterlab_replay_view.png"
    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        try:
            page.goto(f"{lab['base']}/lab/tree/{NB}?token={lab['token']}")
            page.wait_for_selector(".jp-Notebook", timeout=60_000)
            page.get_by_text("| Idle").first.wait_for(timeout=90_000)
            page.wait_for_timeout(3000)        # brand-new server: let the kernel websocket settle
            for attempt in range(2):
                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                try:
                    page.wait_for_selector(".rw-replay-table", timeout=240_000 if attempt == 0 else 120_000)
                    break
                except Exception:
                    if attempt == 1:
                        raise
            head = re.search(r"(\d+) error-level", page.locator(".rw-diagnosis").first.inner_text())
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
            page.locator("tr.rw-replay-first").scroll_into_view_if_needed()
            if shot.parent.is_dir():
                page.screenshot(path=str(shot), full_page=False)
            errors = [o for o in page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                      .all_inner_texts() if "Traceback" in o]
            assert not errors, errors[:1]
        finally:
            browser.close()
    assert time.monotonic() - t0 < 420
