"""Remake the README's screenshots (docs/img/report.png, docs/img/triage.png) from freshly generated pages.

    .venv/bin/python scripts/screenshots.py                       # generates both pages (a few minutes on a CPU)
    .venv/bin/python scripts/screenshots.py --report R.html --triage T.html   # from pages you already have

Without --report it runs `rookworld-debug main` into a temporary folder; without --triage it runs
`rookworld-debug trl-demo` then `rookworld-debug triage` there. The pages are opened offline in headless
Chromium (/usr/bin/chromium through Playwright; every network request is refused) and the top of each is saved
as a PNG, from its first heading that matters (the step's summary, the run's curves).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "rookworld_debug.cli"]
CHROMIUM = "/usr/bin/chromium"
SHOTS = {"report": "The step report (rookworld-debug main)", "triage": "The triage page (rookworld-debug triage)"}
START = {"report": "Summary of this step", "triage": "Curves"}   # each shot starts at this heading


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", type=Path, help="an existing report.html (default: generate one)")
    ap.add_argument("--triage", type=Path, help="an existing triage.html (default: generate one)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="folder for the PNGs")
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=760)
    a = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"screenshots: {CHROMIUM} not found (scripts/setup.sh --browser installs it)")
    with tempfile.TemporaryDirectory(prefix="rookworld-shots-") as tmp:
        pages = {"report": a.report or make_report(Path(tmp)), "triage": a.triage or make_triage(Path(tmp))}
        for name, html in pages.items():
            if not html.is_file():
                raise SystemExit(f"screenshots: {SHOTS[name]}: {html} does not exist")
        for path in shoot(pages, a.out, a.width, a.height):
            print(f"{path} ({path.stat().st_size // 1024} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
