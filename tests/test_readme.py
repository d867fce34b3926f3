"""The README's ways in work as written: every command its table names exists, and the three copy-paste blocks
run as a user runs them (subprocesses in a fresh folder, stdin closed, with a deadline, exit status checked).

The three blocks take minutes on a CPU (a report, two TRL runs, triage pages, what-if re-runs): slow tests.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CLI = [sys.executable, "-m", "rookworld_debug.cli"]


def blocks_under(heading: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block between `heading` and the next heading of its level or above."""
    start = README.index(heading)
    level = heading.split(" ")[0]
    nxt = re.search(rf"^#{{1,{len(level)}}} ", README[start + len(heading):], re.M)
    section = README[start: start + len(heading) + (nxt.start() if nxt else len(README))]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def commands(code: str) -> list[list[str]]:
    """The shell lines of a bash block, comments dropped, as argv lists."""
    out = []
    for line in code.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_user_line(argv: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """One README line as a user types it: `rookworld-debug ...` is the installed console script."""
    if argv[0] == "rookworld-debug":
        argv = CLI + argv[1:]
    r = subprocess.run(argv, cwd=cwd, env=_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, (argv, r.returncode, r.stderr[-3000:])
    return r


def test_the_two_setup_commands_stay_at_the_top():
    first = blocks_under("# rookworld_debug")[0]
    assert first[0] == "bash" and [c[:2] for c in commands(first[1])] == [["bash", "scripts/main.sh"],
                                                                          ["bash", "scripts/test.sh"]]


def test_every_command_in_the_table_exists():
    """`rookworld-debug X --help` exits 0 for every X the README's command table names."""
    table = README[README.index("## Commands"):README.index("## Read more")]
    names = sorted(set(re.findall(r"^\| `rookworld-debug ([a-z-]+)", table, re.M))
                   | set(re.findall(r"`rookworld-debug [a-z-]+`, `([a-z-]+)`", table)))
    assert len(names) >= 12, names
    missing = []
    for name in names:
        r = subprocess.run(CLI + [name, "--help"], env=_env(), stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            missing.append(f"{name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_way_in_1_one_step_of_the_embedded_model(tmp_path):
    (lang, code), (py_lang, py_code) = blocks_under("### 1.")[:2]
    assert lang == "bash" and commands(code)[0] == ["bash", "scripts/main.sh"]
    # scripts/main.sh = set-up + `rookworld-debug main`; the set-up is the CI's own first step, so run the job
    r = run_user_line(["rookworld-debug", "main", "--out", str(tmp_path / "reports")], REPO, timeout=1100)
    assert (tmp_path / "reports" / "main" / "run" / "report.html").is_file(), r.stdout[-2000:]
    assert py_lang == "python"
    run_user_line([sys.executable, "-c", py_code], tmp_path, timeout=600)
    assert (tmp_path / "reports" / "my_step").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_way_in_2_your_own_trl_run(tmp_path):
    found = blocks_under("### 2.")
    langs = [lang for lang, _ in found]
    assert langs[:2] == ["bash", "python"] and "bash" in langs[2:], langs
    assert commands(found[0][1])[0][:3] == ["pip", "install", "-e"]     # the [trl] extra: installed in this venv
    run_user_line([sys.executable, "-c", found[1][1]], tmp_path, timeout=900)
    for argv in commands(found[2][1]):
        run_user_line(argv, tmp_path, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_way_in_3_a_run_that_went_wrong(tmp_path):
    (lang, code), = [b for b in blocks_under("### 3.") if b[0] == "bash"]
    lines = commands(code)
    assert [a[1] for a in lines] == ["trl-demo", "triage", "diagnose", "whatif"]
    for argv in lines:
        run_user_line(argv, tmp_path, timeout=1500)
    assert (tmp_path / "runs" / "demo" / "triage" / "triage.html").is_file()
