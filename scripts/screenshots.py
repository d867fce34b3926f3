"""Remake the README's screenshots (docs/img/*.png) from freshly generated pages and notebooks.

    .venv/bin/python scripts/screenshots.py                       # all four (several minutes on a CPU)
    .venv/bin/python scripts/screenshots.py --report R.html --triage T.html   # from pages you already have
    .venv/bin/python scripts/screenshots.py --only notebook panel # only the two JupyterLab shots

report.png and triage.png: without --report it runs `rookworld-debug main` into a temporary folder; without
--triage it runs `rookworld-debug trl-demo` then `rookworld-debug triage` there. The pages are opened offline in
headless Chromium (/usr/bin/chromium through Playwright; every network request is refused) and the top of each is
saved as a PNG, from its first heading that matters (the step's summary, the run's curves).

notebook.png and panel.png: notebooks 01 and 02, copied as shipped into a temporary folder, opened in a JupyterLab
server on 127.0.0.1 (its state in that folder too) in the same Chromium, run with "Run All Cells" until the kernel is
idle; the shot starts at a heading of notebook 01 (a phase) and at panel 02's sliders. A cell that ends in an
error stops the script.
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "rookworld_debug.cli"]
CHROMIUM = "/usr/bin/chromium"
SHOTS = {"report": "The step report (rookworld-debug main)", "triage": "The triage page (rookworld-debug triage)",
         "notebook": "Notebook 01 in JupyterLab", "panel": "Panel 02 in JupyterLab"}
START = {"report": "Summary of this step", "triage": "Curves"}   # each shot starts at this heading
# (notebook, where the shot starts, where it ends: None = the window's height)
NOTEBOOKS = {"notebook": ("01_grpo_step.ipynb", "h2:has-text('Phase 4 — loss')", None),
             "panel": ("02_tune_beta_temperature.ipynb", ".rwd-tune-panel", "text=Diagnosis of this rollout")}
RUN_DEADLINE = 1800      # s for a notebook's Run All


def _run(args: list[str], timeout: int) -> None:
    """One CLI command as a user runs it: stdin closed, a deadline, a clear failure."""
    print("+", " ".join(args[2:] if args[:2] == CLI[:2] else args), file=sys.stderr, flush=True)
    r = subprocess.run(args, stdin=subprocess.DEVNULL, timeout=timeout, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"screenshots: {' '.join(args)} exited {r.returncode}")


def make_report(tmp: Path) -> Path:
    _run(CLI + ["main", "--out", str(tmp / "reports")], timeout=1200)
    return tmp / "reports" / "main" / "run" / "report.html"


def make_triage(tmp: Path) -> Path:
    demo = tmp / "demo"
    _run(CLI + ["trl-demo", "--out", str(demo)], timeout=1200)
    _run(CLI + ["triage", str(demo)], timeout=1200)
    return demo / "triage" / "triage.html"


def shoot(pages: dict[str, Path], out: Path, width: int, height: int) -> list[Path]:
    """`width` × `height` of each page from its START heading down, as `out/<name>.png`."""
    from playwright.sync_api import sync_playwright
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            for name, html in pages.items():
                page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                           else route.abort())
                page.goto(html.resolve().as_uri(), wait_until="load", timeout=120_000)
                page.wait_for_timeout(1500)            # plotly draws after load
                path = out / f"{name}.png"
                heading = page.locator("h1, h2, h3", has_text=START[name]).first
                box = heading.bounding_box(timeout=10_000) if heading.count() else None
                top = max(0, int(box["y"]) - 12) if box else 0
                page.screenshot(path=str(path), full_page=True,
                                clip={"x": 0, "y": top, "width": width, "height": height})
                written.append(path)
                page.close()
        finally:
            browser.close()
    return written


@contextlib.contextmanager
def _jupyterlab(root: Path):
    """A JupyterLab server over `root`/notebooks on 127.0.0.1 (free port, token, every notebook cell rendered),
    answering within 90 s; its process group (kernels included) is stopped on exit."""
    import json
    import os
    import secrets
    import signal
    import socket
    import time
    import urllib.request
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token, state = secrets.token_hex(16), root / "state"
    settings = state / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "JUPYTER_RUNTIME_DIR": str(state / "runtime"), "JUPYTER_CONFIG_DIR": str(state / "config"),
           "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"), "JUPYTERLAB_SETTINGS_DIR": str(state / "settings")}
    argv = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"] + (["--allow-root"] if os.geteuid() == 0
                                                                                  else [])
    log = open(state / "lab.log", "wb")
    proc = subprocess.Popen(argv, cwd=root / "notebooks", env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"screenshots: jupyter lab exited {proc.returncode}: {(state / 'lab.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("screenshots: jupyter lab did not answer within 90 s")
                time.sleep(0.5)
        yield base, token
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        log.close()


def _kernels_busy(base: str, token: str) -> bool:
    import json
    import urllib.request
    with urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=10) as r:
        kernels = json.load(r)
    return not kernels or any(k.get("execution_state") != "idle" for k in kernels)


def shoot_notebooks(names: list[str], out: Path, width: int, height: int) -> list[Path]:
    """Notebooks 01 / 02 run in JupyterLab, `width` × `height` from NOTEBOOKS' place down, as `out/<name>.png`."""
    import shutil
    import time
    from playwright.sync_api import sync_playwright
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="rookworld-lab-shots-") as tmp:
        (Path(tmp) / "notebooks").mkdir()
        for name in names:
            shutil.copy(REPO / "notebooks" / NOTEBOOKS[name][0], Path(tmp) / "notebooks")
        with _jupyterlab(Path(tmp)) as (base, token), sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            try:
                for name in names:
                    notebook, start, end = NOTEBOOKS[name]
                    print(f"+ Run All of {notebook} in JupyterLab", file=sys.stderr, flush=True)
                    page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
                    page.goto(f"{base}/lab/tree/{notebook}?token={token}")
                    page.wait_for_selector(".jp-Notebook", timeout=120_000)
                    page.get_by_text("| Idle").first.wait_for(timeout=120_000)
                    page.wait_for_timeout(3000)                 # a new kernel's websocket settles
                    if page.locator("#jp-left-stack").is_visible():   # the file browser closed: the notebook's width
                        page.keyboard.press("Control+b")
                    page.get_by_role("menuitem", name="Run", exact=True).click()
                    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                    t0 = time.monotonic()
                    page.wait_for_timeout(5000)
                    while _kernels_busy(base, token) or page.locator(".jp-InputArea-prompt:has-text('[*]')").count():
                        if time.monotonic() - t0 > RUN_DEADLINE:
                            raise SystemExit(f"screenshots: {notebook} still running after {RUN_DEADLINE} s")
                        page.wait_for_timeout(2000)
                    errors = page.locator("[data-mime-type='application/vnd.jupyter.error']")
                    if errors.count():
                        raise SystemExit(f"screenshots: {notebook} ended in an error: {errors.first.inner_text()[:2000]}")
                    print(f"  ran in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
                    news = page.get_by_role("button", name="No", exact=True)    # the "Jupyter news?" toast
                    if news.count():
                        news.first.click()
                    page.locator(start).first.scroll_into_view_if_needed(timeout=30_000)
                    page.locator(start).first.evaluate("e => e.scrollIntoView({block: 'start'})")
                    page.wait_for_timeout(1500)                 # plotly draws after it scrolls into view
                    path = out / f"{name}.png"
                    top = max(0, page.locator(start).first.bounding_box()["y"] - 8)
                    bottom = page.locator(end).first.bounding_box()["y"] - 4 if end else height
                    page.screenshot(path=str(path), clip={"x": 0, "y": top, "width": width,
                                                          "height": max(1, min(height, bottom) - top)})
                    written.append(path)
                    page.close()
            finally:
                browser.close()
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", type=Path, help="an existing report.html (default: generate one)")
    ap.add_argument("--triage", type=Path, help="an existing triage.html (default: generate one)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder for the PNGs")
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=760)
    ap.add_argument("--only", nargs="+", choices=list(SHOTS), default=list(SHOTS), help="make only these shots")
    a = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"screenshots: {CHROMIUM} not found (scripts/setup.sh --browser installs it)")
    with tempfile.TemporaryDirectory(prefix="rookworld-shots-") as tmp:
        makers = {"report": lambda: a.report or make_report(Path(tmp)), "triage": lambda: a.triage or make_triage(Path(tmp))}
        pages = {name: make() for name, make in makers.items() if name in a.only}
        for name, html in pages.items():
            if not html.is_file():
                raise SystemExit(f"screenshots: {SHOTS[name]}: {html} does not exist")
        written = shoot(pages, a.out, a.width, a.height) if pages else []
        lab = [name for name in NOTEBOOKS if name in a.only]
        written += shoot_notebooks(lab, a.out, a.width, a.height) if lab else []
        for path in written:
            print(f"{path} ({path.stat().st_size // 1024} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
