"""Papermill sweeps (rookworld_debug.report): grids, atomic summaries, offline HTML, failure isolation,
resume, SIGKILL mid-sweep, Dask, and a real headless browser. Uses tests/notebooks/sweep_probe.ipynb
(no model), so it does not depend on the GRPO notebook."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rookworld_debug.errors import ConfigError
from rookworld_debug.report import (
    SUMMARY_SCHEMA, Grid, IncompleteSummaryError, atomic_write_json, atomic_write_text, expand_grid,
    export_html, is_complete, load_grid_file, make_grid, params_hash, parse_param_specs, parse_value,
    read_summary, run_id, run_sweep,
)
from rookworld_debug.report_cli import add_report_arguments, report_main

PROBE = Path(__file__).parent / "notebooks" / "sweep_probe.ipynb"
REPO = Path(__file__).resolve().parent.parent
CDN_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", re.I)


# ---------------------------------------------------------------------------------------------- grids

def test_parse_value_types():
    assert parse_value("0") == 0 and type(parse_value("0")) is int
    assert parse_value("0.005") == 0.005 and parse_value("1e-3") == 1e-3 and parse_value("-2.5") == -2.5
    assert parse_value("True") is True and parse_value("false") is False
    assert parse_value("none") is None and parse_value("null") is None
    assert parse_value("dapo") == "dapo" and parse_value("'1'") == "1" and parse_value('"true"') == "true"


def test_param_specs_expand_in_stable_order():
    axes = parse_param_specs(["beta=0,0.005,0.05", "temperature=0.7,1.0"])
    assert axes == {"beta": [0, 0.005, 0.05], "temperature": [0.7, 1.0]}
    runs = expand_grid(axes, {"seed": 3})
    assert len(runs) == 6
    assert runs[0] == {"seed": 3, "beta": 0, "temperature": 0.7}
    assert runs[1] == {"seed": 3, "beta": 0, "temperature": 1.0}          # last axis varies fastest
    assert [run_id(r, list(axes)) for r in runs[:2]] == ["beta=0__temperature=0.7", "beta=0__temperature=1.0"]
    for bad in (["beta"], ["be ta=1"], ["run_dir=/x"], ["beta=1", "beta=2"], ["beta="]):
        with pytest.raises(ConfigError):
            parse_param_specs(bad)
    with pytest.raises(ConfigError):
        Grid(axes={"a": [1, 1]})
    with pytest.raises(ConfigError):
        Grid(axes={"a": [1]}, fixed={"a": 2})


def test_yaml_grid_file_and_cli_override(tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text("name: beta-temp\nbeta: [0, 5e-3, 0.05]\ntemperature: [0.7, 1.0]\nloss_type: dapo\n"
                 "fixed: {seed: 0, num_generations: 4}\n")
    g = load_grid_file(f)
    assert g.name == "beta-temp"
    assert g.axes == {"beta": [0, 0.005, 0.05], "temperature": [0.7, 1.0]}
    assert g.fixed == {"seed": 0, "num_generations": 4, "loss_type": "dapo"}
    g2 = make_grid(["temperature=0.9", "seed=1,2"], f)
    assert g2.axes == {"beta": [0, 0.005, 0.05], "temperature": [0.9], "seed": [1, 2]}
    assert "seed" not in g2.fixed and len(g2.expand()) == 6
    (tmp_path / "g2.yaml").write_text("grid: {name: [a, b]}\nfixed: {fixed: 1}\n")   # 'grid:' frees the names
    assert load_grid_file(tmp_path / "g2.yaml").axes == {"name": ["a", "b"]}


def test_run_id_readable_stable_unique():
    assert run_id({"b": 0.5, "a": 1}) == "a=1__b=0.5"
    assert run_id({"a": 1, "b": 0.5}, ["b", "a"]) == "b=0.5__a=1"
    assert run_id({"x": 1}, []) == "run"
    slash, under = run_id({"m": "org/model"}), run_id({"m": "org_model"})
    assert slash != under and slash.startswith("m=org_model-") and under == "m=org_model"
    long = run_id({f"p{i}": 0.123456789 for i in range(12)})
    assert len(long) <= 96 and re.fullmatch(r"[A-Za-z0-9._=+-]+-[0-9a-f]{8}", long)
    assert params_hash({"a": 1, "b": 0.5}) == params_hash({"b": 0.5, "a": 1, "run_dir": "/elsewhere"})
    assert params_hash({"a": 1}) != params_hash({"a": 2})


def test_unknown_parameter_and_dry_run(tmp_path, capsys):
    with pytest.raises(ConfigError, match="zz"):
        run_sweep(PROBE, {"zz": [1]}, sweep_name="x", out_root=tmp_path, progress=False)
    import argparse
    parser = add_report_arguments(argparse.ArgumentParser())
    assert report_main(parser.parse_args([str(PROBE), "-p", "zz=1", "--out", str(tmp_path)])) == 2
    assert report_main(parser.parse_args([str(PROBE), "-p", "a=1,2", "-p", "b=0.5", "--dry-run"])) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["a=1__b=0.5 {'a': 1, 'b': 0.5}",
                                                        "a=2__b=0.5 {'a': 2, 'b': 0.5}"]
    assert not list(tmp_path.iterdir())                      # nothing was run or written


# ---------------------------------------------------------------------------------- atomic + summaries

def test_atomic_write_never_leaves_partial(tmp_path, monkeypatch):
    p = tmp_path / "summary.json"
    atomic_write_json(p, {"v": 1, "nan": float("nan"), "inf": float("-inf")})
    assert json.loads(p.read_text()) == {"v": 1, "nan": "NaN", "inf": "-Infinity"}

    def boom(src, dst):
        raise OSError("disk full (simulated crash between write and rename)")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_json(p, {"v": 2})
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "new.html", "<html>")
    monkeypatch.undo()
    assert json.loads(p.read_text())["v"] == 1          # old content intact
    assert not (tmp_path / "new.html").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["summary.json"]   # no temp files left


def test_read_summary_refuses_partial_or_foreign(tmp_path):
    h = params_hash({"a": 1})
    good = {"schema": SUMMARY_SCHEMA, "status": "ok", "params_hash": h, "params": {"a": 1},
            "files": {"report_html": "report.html"}, "metrics": {"m": 1.0}}
    s = tmp_path / "summary.json"
    cases = {
        "missing": None,
        "empty": "",
        "truncated": json.dumps(good)[:40],
        "not an object": "[1, 2]",
        "notebook's raw summary (interrupted before finalize)": json.dumps({"metrics": {"m": 1.0}, "status": "ok"}),
        "other params": json.dumps({**good, "params_hash": "0" * 16}),
        "failed": json.dumps({**good, "status": "failed"}),
        "no report.html": json.dumps(good),
    }
    for label, text in cases.items():
        if s.exists():
            s.unlink()
        if text is not None:
            s.write_text(text)
        with pytest.raises(IncompleteSummaryError):
            read_summary(tmp_path, params_hash=h)
        assert not is_complete(tmp_path, h), label
    (tmp_path / "report.html").write_text("<html></html>")
    s.write_text(json.dumps(good))
    assert read_summary(s, params_hash=h)["metrics"] == {"m": 1.0}
    assert is_complete(tmp_path, h) and not is_complete(tmp_path, params_hash({"a": 2}))


def test_export_html_renders_json_only_plotly_offline():
    import nbformat
    import plotly.graph_objects as go

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.plotly.v1+json": json.loads(go.Figure(go.Bar(y=[1, 2])).to_json()),
        "text/plain": "Figure"})]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell]
    body, check = export_html(nb, banner="<div id='banner'>b</div>")
    assert check.plotly_figures == 1 and check.converted_figures == 1 and check.plotly_js_inline
    assert check.external_refs == 0 and check.offline_ok and not CDN_SCRIPT.search(body)
    assert "id='banner'" in body and check.warnings()          # it tells the notebook author to fix it


# --------------------------------------------------------------------------------------- sweeps (slow)

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    t0 = time.perf_counter()
    result = run_sweep(PROBE, {"a": [1, 2], "b": [0.5, 0.25]}, sweep_name="probe", out_root=out, workers=2,
                       progress=True, timeout_per_cell=120)
    return result, time.perf_counter() - t0


def test_grid_2x2_four_reports_and_index(sweep):
    result, wall = sweep
    assert result.exit_code == 0 and result.n_ok == 4, [r.error for r in result.runs]
    sdir = result.sweep_dir
    summaries = [read_summary(sdir / r.run_id) for r in result.runs]
    assert {json.dumps(s["params"], sort_keys=True) for s in summaries} == {
        json.dumps({"a": a, "b": b}, sort_keys=True) for a in (1, 2) for b in (0.5, 0.25)}
    for s in summaries:
        assert s["metrics"]["c"] == pytest.approx(s["params"]["a"] * s["params"]["b"])
        assert s["note"] == "probe"                                       # the notebook's own fields kept
        rdir = sdir / s["run_id"]
        for name in ("report.ipynb", "report.html", "params.json", "summary.json"):
            assert (rdir / name).is_file(), name
        html = (rdir / "report.html").read_text()
        assert re.search(r"plotly\.js v\d", html), "plotly.js must be inline"
        assert not CDN_SCRIPT.search(html), "no CDN <script src=http...>"
        assert "raise ValueError" not in html and "atomic_write_json" not in html   # code hidden
        assert f"a={s['params']['a']} b={s['params']['b']}" in html                  # outputs shown
        assert s["runner"]["html_check"]["offline_ok"] and s["runner"]["warnings"] == []
        assert s["runner"]["html_check"]["external_refs"] == 0
        print(f"{s['run_id']}: papermill {s['runner']['papermill_s']:.1f}s nbconvert "
              f"{s['runner']['nbconvert_s']:.1f}s html {s['runner']['html_bytes'] / 1e6:.2f} MB")
    index = json.loads((sdir / "index.json").read_text())
    assert index["counts"]["total"] == 4 and index["counts"]["ok"] == 4
    assert [r["run_id"] for r in index["runs"]] == [r.run_id for r in result.runs]
    assert set(index["metric_keys"]) == {"c", "a_plus_b", "b_sq"} and index["swept"] == ["a", "b"]
    ihtml = (sdir / "index.html").read_text()
    assert ihtml.count("href='a=") >= 8 and "plotly-graph-div" in ihtml and not CDN_SCRIPT.search(ihtml)
    print(f"2x2 sweep, 2 workers: {wall:.1f}s")


def test_failing_run_is_isolated_with_error_page(sweep, capsys):
    result, _ = sweep
    before = {r.run_id: (result.sweep_dir / r.run_id / "summary.json").stat().st_mtime_ns for r in result.runs}
    import argparse
    args = add_report_arguments(argparse.ArgumentParser()).parse_args(
        [str(PROBE), "-p", "a=-1", "-p", "b=0.5", "--sweep-name", "probe", "--out", str(result.sweep_dir.parent),
         "--no-progress"])
    rc = report_main(args)
    out = capsys.readouterr().out
    assert rc == 1 and "FAILED a=-1__b=0.5" in out and "index.html" in out
    rdir = result.sweep_dir / "a=-1__b=0.5"
    s = read_summary(rdir, require_ok=False)
    assert s["status"] == "failed" and s["error"]["ename"] == "ValueError"
    assert not is_complete(rdir, s["params_hash"]) and not (rdir / "report.html").exists()
    page = (rdir / "error.html").read_text()
    assert "invalid parameter a=-1" in page and "Traceback" in page and "raise ValueError" in page
    assert f"index {s['error']['cell_index']}" in page
    index = json.loads((result.sweep_dir / "index.json").read_text())
    assert index["counts"] == {"ok": 4, "failed": 1, "incomplete": 0, "pending": 0, "total": 5}
    failed = [r for r in index["runs"] if r["status"] == "failed"]
    assert failed[0]["error_html"] == "a=-1__b=0.5/error.html"
    assert "a=-1__b=0.5/error.html" in (result.sweep_dir / "index.html").read_text()
    after = {rid: (result.sweep_dir / rid / "summary.json").stat().st_mtime_ns for rid in before}
    assert after == before                                         # the ok runs were not touched


def test_rerun_skips_finished_runs(sweep):
    result, first_wall = sweep
    t0 = time.perf_counter()
    again = run_sweep(PROBE, {"a": [1, 2], "b": [0.5, 0.25]}, sweep_name="probe", out_root=result.sweep_dir.parent,
                      workers=2, progress=False)
    wall = time.perf_counter() - t0
    assert again.n_skipped == 4 and again.n_ok == 0 and again.executed == [] and again.exit_code == 0
    assert wall < first_wall / 2, (wall, first_wall)
    print(f"re-run of 4 complete runs: {wall:.2f}s (first: {first_wall:.1f}s)")


def _chromium_args():
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.browser
def test_report_html_renders_plotly_offline_in_chromium(sweep):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium (scripts/setup.sh --browser installs it)")
    result, _ = sweep
    report = result.runs[0].run_dir / "report.html"
    index = result.sweep_dir / "index.html"
    blocked: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=_chromium_args())
        try:
            page = browser.new_page()
            from conftest import block_network
            block_network(page, blocked)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            for url in (report, index):
                page.goto(url.as_uri())
                page.wait_for_selector(".js-plotly-plot .main-svg", timeout=20000)
                assert page.locator(".js-plotly-plot").count() >= 1
            assert page.locator("table.runs tbody tr").count() >= 4
        finally:
            browser.close()
    assert blocked == [] and errors == [], (blocked, errors)


def _wait_for(pred, proc, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, f"sweep ended before: {what}"
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.1)


# The sweep as a terminal's foreground job starts it: Ctrl-C raises KeyboardInterrupt. A process started from a
# background job of a non-interactive shell (`pytest … &` in a script) inherits SIGINT *ignored*, and Python then
# installs no KeyboardInterrupt handler: the signal would be lost and the sweep would run on to exit 0.
FOREGROUND = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "sys.argv = sys.argv[1:]; runpy.run_module('rookworld_debug.report_cli', run_name='__main__')")


def test_sigkill_and_sigint_mid_sweep_lose_no_finished_run_and_resume_completes(tmp_path):
    psutil = pytest.importorskip("psutil")
    gate = tmp_path / "go"               # every run waits for this file: a run cannot end before the signal does
    cmd = [sys.executable, "-c", FOREGROUND, "report_cli", str(PROBE), "-p", "a=1,2", "-p", "b=0.5",
           "-p", f"wait_for='{gate}'", "--sweep-name", "killed", "--out", str(tmp_path), "--workers", "1",
           "--no-progress"]
    sdir = tmp_path / "killed"
    from rookworld_debug.report.grid import run_id
    params = [{"a": a, "b": 0.5, "wait_for": str(gate)} for a in (1, 2)]
    (d1, h1), (d2, h2) = [(sdir / run_id(ps), params_hash(ps)) for ps in params]

    # 1. SIGKILL the sweep right after its first run finished (the second one is starting)
    gate.touch()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: is_complete(d1, h1), proc, "first run complete")
        children = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = read_summary(d1, params_hash=h1)                              # the finished run is intact
    assert first["status"] == "ok" and (d1 / "report.html").stat().st_size > 100_000
    with pytest.raises(IncompleteSummaryError):                          # the interrupted one never looks done
        read_summary(d2, params_hash=h2)
    # its worker and kernel die with the sweep (PR_SET_PDEATHSIG, then nbclient's kernel shutdown)
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]

    # 2. resume from the CLI, Ctrl-C (SIGINT) it while the second run's kernel is executing (held at the gate)
    gate.unlink()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def kernel_running():
            return any("ipykernel" in " ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(True))
        _wait_for(kernel_running, proc, "kernel of the second run started")
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]
    assert read_summary(d1, params_hash=h1) == first                     # untouched, skipped by the resume
    assert not is_complete(d2, h2)
    index = json.loads((sdir / "index.json").read_text())
    assert index["counts"]["ok"] == 1 and index["counts"]["incomplete"] == 1

    # 3. resume completes the rest
    gate.touch()
    resumed = run_sweep(PROBE, {"a": [1, 2], "b": [0.5], "wait_for": [str(gate)]}, sweep_name="killed",
                        out_root=tmp_path, workers=2, progress=False)
    assert resumed.exit_code == 0 and resumed.n_skipped == 1 and resumed.n_ok == 1
    assert is_complete(d1, h1) and is_complete(d2, h2) and read_summary(d1) == first
    index = json.loads((sdir / "index.json").read_text())
    assert index["counts"]["ok"] == 2 and index["counts"]["total"] == 2


def test_dask_local_cluster_runs_the_sweep(tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) \
            as cluster, distributed.Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
        result = run_sweep(PROBE, {"a": [1, 2], "b": [0.5]}, sweep_name="dask", out_root=tmp_path,
                           cluster=cluster.scheduler_address, progress=False)
    assert result.exit_code == 0 and result.n_ok == 2
    for r in result.runs:
        s = read_summary(r.run_dir, params_hash=r.params_hash)
        assert s["runner"]["parent_pid"] in worker_pids          # executed by a Dask worker
    assert json.loads((result.sweep_dir / "index.json").read_text())["counts"]["ok"] == 2
