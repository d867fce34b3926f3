"""The default run and the slow set: CI runs both, the slow files' tests are all in the slow set, and the list of
slow files names real test files once each."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _listed() -> list[str]:
    from conftest import slow_files           # the list as the suite reads it
    return slow_files()


def test_ci_runs_the_default_run_and_the_slow_set():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "bash scripts/test.sh --all", ci
    script = (REPO / "scripts" / "test.sh").read_text()
    assert '-m "not slow"' in script and "-m slow" in script
    assert subprocess.run(["bash", "-n", str(REPO / "scripts" / "test.sh")], timeout=30).returncode == 0
    assert "bash scripts/test.sh --all" in (REPO / "README.md").read_text()


def test_the_slow_files_are_test_files_named_once():
    names = _listed()
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for name in names:
        assert name.startswith("tests/test_") and name.endswith(".py") and (REPO / name).is_file(), name


def test_every_collected_test_of_a_slow_file_is_marked_slow(request):
    """In this very session: a test of a listed file that was collected carries the slow marker (so `-m "not slow"`,
    the default run, leaves it out, and `-m slow` runs it)."""
    slow = set(_listed())
    unmarked = [item.nodeid for item in request.session.items
                if item.nodeid.split("::")[0] in slow and item.get_closest_marker("slow") is None]
    assert not unmarked, unmarked[:5]


def test_the_default_run_collects_nothing_of_a_slow_file():
    """As a user runs it: `pytest -m "not slow" FILE` on a listed file selects none of its tests."""
    name = _listed()[-1]
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-m", "not slow", name], cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 5 and "deselected" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]   # 5: none selected


def test_the_timing_script_reads_a_test_run_log(tmp_path):
    """scripts/test_timing.py as a developer runs it: the runs of a scripts/test.sh log, their counts, seconds and
    files; a file that is not such a log is a one-line error."""
    log = tmp_path / "test.log"
    log.write_text("12.50s call     tests/test_a.py::test_x\n3.10s setup    tests/test_b.py::test_y[1]\n"
                   "1.00s call     tests/test_a.py::test_z\n"
                   "=== 10 passed, 2 skipped, 3 deselected in 650.12s (0:10:50) ===\n"
                   "scripts/test.sh: the default run took 700 s (exit 0)\n"
                   "5.00s call     tests/test_c.py::test_w\n=== 1 failed, 4 passed in 100.00s (0:01:40) ===\n"
                   "scripts/test.sh: the slow set took 120 s (exit 1)\n")
    script = [sys.executable, str(REPO / "scripts" / "test_timing.py")]
    r = subprocess.run([*script, str(log), "--out", str(tmp_path / "t.json"), "--md", str(tmp_path / "t.md")],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import json
    runs = json.loads((tmp_path / "t.json").read_text())["runs"]
    assert [(x["name"], x["wall_seconds"], x["exit"], x["pytest_seconds"]) for x in runs] == \
        [("default run", 700, 0, 650.12), ("slow set", 120, 1, 100.0)]
    assert runs[0]["counts"] == {"passed": 10, "skipped": 2, "deselected": 3}
    assert runs[0]["by_file"] == {"tests/test_a.py": 13.5, "tests/test_b.py": 3.1}
    assert "tests/test_c.py" in (tmp_path / "t.md").read_text()
    (tmp_path / "other.log").write_text("hello\n")
    r = subprocess.run([*script, str(tmp_path / "other.log"), "--out", str(tmp_path / "o.json")],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not the log of scripts/test.sh" in r.stderr and "Traceback" not in r.stderr
