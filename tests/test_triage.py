"""`rookworld-debug trl-demo` then `rookworld-debug triage`, run as a user runs them (subprocess, stdin
closed, timeout). The demo's learning rate jumps so the metrics jump at step JUMP: triage.json names a trigger
there, the captured step's report is linked and opens in Chromium offline (network blocked), a second triage
re-renders nothing, and a checkpoints-only folder still gives curves and flagged steps with the note."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli import run_cli as _cli

STEPS, JUMP = 12, 8          # trl-demo's defaults (the session's shared demo run)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, trl_demo_run):
    out = tmp_path_factory.mktemp("demo") / "run"
    shutil.copytree(trl_demo_run, out)                    # triage writes into the run folder: a copy of its own
    r = _cli("triage", str(out), "--no-progress", cwd=out.parent)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def test_triage_names_the_trigger_at_the_jump_and_links_its_report(demo):
    t = json.loads((demo / "triage" / "triage.json").read_text())
    at_jump = [f for f in t["flagged"] if f["step"] == JUMP]
    assert any(f["trigger"] == "kl" for f in at_jump), t["flagged"]
    f = next(f for f in at_jump if f["trigger"] == "kl")
    assert f["captured"] and f["report"] and (demo / "triage" / f["report"]).is_file()
    assert {"step", "trigger", "value", "threshold", "captured", "report"} <= set(f)
    assert len(t["rows"]) == STEPS and t["trend"]["n"] == STEPS
    assert set(range(JUMP - 3, JUMP + 1)) <= set(t["captured_steps"])      # the lead-up is there


def test_page_headers_say_what_the_page_shows(demo):
    """The triage page and its step reports are headed by the run they show, not by the sweep that made them."""
    import re
    step = next((demo / "triage" / "steps").rglob("report.html"))
    for page, says in ((demo / "triage" / "triage.html", "triage of the run "),
                       (step, f"step {JUMP} of the run ")):
        header = re.search(r"<header class='rookworld-run-banner'.*?</header>", page.read_text(), re.S).group(0)
        assert says + str(demo.resolve()) in header, header
        assert "triage_json" not in header and "content=" not in header and "trace_path" not in header, header


def test_second_triage_rerenders_nothing(demo):
    page = demo / "triage" / "triage.html"
    reports = sorted((demo / "triage" / "steps").rglob("report.html"))
    before = {p: p.stat().st_mtime_ns for p in [page, *reports]}
    r = _cli("triage", str(demo), "--no-progress", cwd=demo.parent, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_reports_on_demand_give_the_link_and_the_command_that_renders_there(demo, tmp_path):
    """A large run: with --max-step-reports 0 nothing is rendered now; every flagged captured
    step links to where its report will be and gives the command that renders it exactly there."""
    out = tmp_path / "lazy"
    r = _cli("triage", str(demo), "--out", str(out), "--max-step-reports", "0", "--no-progress", cwd=tmp_path,
             timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    t = json.loads((out / "triage.json").read_text())
    lazy = [f for f in t["flagged"] if f["captured"]]
    assert lazy and all(not f["report_rendered"] and f["report_command"] and f["report"] for f in lazy)
    assert not list(out.rglob("report.html"))[1:]              # only the page's own run folder, no step report
    html = (out / "triage.html").read_text()
    assert "rw-step-report-pending" in html and "not rendered yet" in html
    f = lazy[0]
    argv = f["report_command"].split()[1:] + ["--dry-run"]
    r = _cli(*argv, cwd=tmp_path, timeout=120)                 # the command parses and names that step's run
    assert r.returncode == 0, r.stderr[-2000:]
    assert f["report"] == f"step-reports/step-{f['step']:06d}/run/report.html"
    assert r.stdout.startswith("run {") and f"into {out / 'step-reports' / ('step-%06d' % f['step'])};" in r.stdout, \
        r.stdout                                               # run id "run" in that sweep folder: the link's path


def test_checkpoints_only_folder_gives_curves_and_the_note(demo, tmp_path):
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(demo / "trainer_state.json", only / "trainer_state.json")
    r = _cli("triage", str(only), "--no-progress", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    t = json.loads((only / "triage" / "triage.json").read_text())
    assert t["flagged"] and not any(f["captured"] for f in t["flagged"])
    assert any("capture_steps(" in n for n in t["notes"])
    assert "flight recorder" in (only / "triage" / "triage.html").read_text()


def test_not_a_run_is_one_line_exit_2(tmp_path):
    r = _cli("triage", str(tmp_path), cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "rookworld-debug triage: error:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.browser
def test_page_offline_in_chromium_shows_curves_marks_and_opens_the_step_report(demo):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (scripts/setup.sh --browser installs it)")
    page_path = demo / "triage" / "triage.html"
    blocked, errors = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            pg = browser.new_page(viewport={"width": 1200, "height": 900})
            from conftest import block_network
            block_network(pg, blocked)
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(page_path.as_uri())
            pg.wait_for_selector(".js-plotly-plot .main-svg", timeout=30000)
            assert pg.locator(".js-plotly-plot").count() >= 1
            marks = pg.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(
                d => d.data.filter(t => t.name === 'trigger').map(t => t.x.length))""")
            assert sum(marks) >= 1, marks
            link = pg.locator("a.rw-step-report").first
            assert link.count() == 1
            link.click()
            pg.wait_for_load_state()
            assert pg.url.endswith("report.html") and "Summary of this step" in pg.content()
        finally:
            browser.close()
    assert blocked == [] and errors == [], (blocked, errors)
