"""The GPU check's command as a user runs it (here on the CPU, its parts that need a GPU left out) and the pieces
that decide what it skips and how it counts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


def test_the_command_prepares_and_writes_its_json(tmp_path):
    r = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu", "--quick", "--skip",
                        "suite,commands,trl,bench", "--out", str(tmp_path)], cwd=REPO, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    (out,) = tmp_path.glob("gpu-check-*-cpu-quick.json")
    d = json.loads(out.read_text())
    assert d["schema"] == "rookworld_debug.gpu_check/1" and d["machine"]["device"] == "cpu"
    assert d["machine"]["torch"] and d["machine"]["trl"]            # what the suite and the TRL part will need
    assert d["complete"] is True and not list(tmp_path.glob("*.partial"))   # the atomic replace left no temporary


def test_files_whose_imports_the_machine_lacks_are_skipped_by_name():
    import gpu_check
    skips = gpu_check.skipped_files(["papermill", "nbformat"])
    assert skips and all(why.startswith("imports ") and "lacks" in why for why in skips.values())
    assert "tests/test_devices.py" not in skips                     # imports neither
    assert gpu_check.skipped_files([]) == {}


def test_the_junit_counts(tmp_path):
    import gpu_check
    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite><testcase classname="a" name="ok"/><testcase classname="a" name="bad">'
        '<failure message="boom"/></testcase><testcase classname="b" name="s"><skipped message="needs x"/>'
        '</testcase></testsuite></testsuites>')
    res = gpu_check._junit(tmp_path / "j.xml")
    assert res["counts"] == {"total": 3, "failed": 1, "skipped": 1, "passed": 1}
    assert res["failed"][0]["test"] == "a::bad" and res["skipped"][0]["why"] == "needs x"


def test_bad_arguments_are_one_named_line_before_anything_runs(tmp_path):
    """A misspelt part or a file as the output folder: exit 2 with the argument named, no traceback, no JSON."""
    afile = tmp_path / "a.json"
    afile.write_text("{}")
    for args, words in [(["--skip", "benchh"], "unknown parts ['benchh']"), (["--out", str(afile)], "a file, not a folder"),
                        (["--workers", "0"], "--workers 0"), (["--long-only"], "choose one pass")]:
        argv = [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path), *args]
        r = subprocess.run(argv, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert not list(tmp_path.glob("gpu-check-*.json"))
