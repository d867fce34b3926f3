"""The README is a contract: every fenced block in README.md, read from the file itself, runs as a user runs it
(in order, each ```bash line a subprocess in a fresh folder with stdin closed and a deadline, each ```python block
a `python -c`), and exits as the README says. Editing a command in the README changes what this test runs.

Where a README command would take minutes, the test runs the same command through the same code path, smaller
(each substitution below says what and why):

- `bash scripts/main.sh` is set-up (scripts/setup.sh, idempotent: a ready venv here) + `rookworld-debug main`:
  the test checks that main.sh is exactly that and runs `rookworld-debug main` with a small step
  (MAIN_SMALL: 2 prompts × 4 completions, 32 tokens, no warm-up) through the same notebook, sweep and report.
- `bash scripts/test.sh` runs this suite: checked for syntax, not run from inside itself.
- `.venv/bin/jupyter lab notebooks/` is a server that runs until stopped: started from the clone with a free port,
  a token and no browser appended, it must serve the five notebooks within a deadline, then it is stopped.
- `pip install -e ".[trl]"`: every requirement of the extra is already installed in this venv (a no-op here).
- `rookworld-debug trl-demo --out DIR` with its defaults is the suite's shared demo run (conftest.trl_demo_run,
  built once per session by that very command): copied to DIR.
- `rookworld-debug whatif ... --steps K --seeds S`: 1 step × 1 seed (the pick of the branch point, the self-check,
  a GRPOTrainer branch and the verdict run the same code; fewer re-runs).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CLI = str(REPO / ".venv/bin/rookworld-debug")
# a user's environment: warnings are NOT silenced (a newcomer sees them), the hub is offline, one thread per process
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}, "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
MAIN_SMALL = ["-p", "batch_size=2", "-p", "num_generations=4", "-p", "max_new_tokens=32", "-p", "heldout_n=2",
              "-p", "eval_max_new_tokens=32", "-p", "warmup_steps=0", "-p", "num_iterations=1"]
SMALLER = {"--steps": "1", "--seeds": "1"}                  # whatif's re-runs (module doc)
EXIT = {("diagnose", "runs/demo"): 1}                       # diagnose exits 1 when it finds an error: the demo's
SECTIONS = ("# rookworld_debug", "### 1.", "### 2.", "### 3.", "### 4.", "### 5.")
TIMEOUT = 900
JUPYTER_DEADLINE = 90                                        # s for JupyterLab to answer
NOTEBOOKS = ("01_grpo_step.ipynb", "02_tune_beta_temperature.ipynb", "03_multi_step.ipynb", "04_run_triage.ipynb",
             "05_whatif.ipynb")


@dataclass(frozen=True)
class Block:
    section: str        # the heading it sits under
    lang: str
    code: str
    line: int           # where it starts in README.md


def blocks() -> list[Block]:
    """Every fenced block of README.md, in order, with the heading it sits under."""
    out, heading, fence, buf, start = [], "", None, [], 0
    for n, line in enumerate(README.splitlines(), 1):
        if fence is None and line.startswith("#"):
            heading = line.strip()
        elif fence is None and line.startswith("```"):
            fence, buf, start = line[3:].strip(), [], n
        elif fence is not None and line.startswith("```"):
            out.append(Block(heading, fence, "\n".join(buf) + "\n", start))
            fence = None
        elif fence is not None:
            buf.append(line)
    assert fence is None, f"README.md: the block at line {start} is not closed"
    return out


def section(prefix: str) -> list[Block]:
    return [b for b in blocks() if b.section.startswith(prefix)]


def lines(block: Block) -> list[list[str]]:
    """The commands of a bash block as argv lists (comments dropped)."""
    return [argv for argv in (shlex.split(x, comments=True) for x in block.code.splitlines()) if argv]


# ------------------------------------------------------------------------------------------- running a line
def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=TIMEOUT)
    print(f"[readme] {shlex.join(argv)[:160]}: exit {r.returncode} after {time.perf_counter() - t0:.1f} s")
    return r


def _check_exit(line: list[str], r: subprocess.CompletedProcess, want: int = 0) -> None:
    assert r.returncode == want, (f"README line `{shlex.join(line)}` exited {r.returncode}, the README says "
                                  f"{want}", r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "MissingIDFieldWarning" not in r.stderr, "a library warning reaches the user"


def _pip_extra_is_installed(line: list[str]) -> None:
    """`pip install -e ".[EXTRA]"`: every requirement of EXTRA is satisfied by this venv."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement
    assert line[:3] == ["pip", "install", "-e"] and line[3].startswith(".["), line
    extra = line[3][2:-1]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extra in extras, f"README installs the extra [{extra}], pyproject.toml has {sorted(extras)}"
    for spec in extras[extra]:
        req = Requirement(spec)
        try:
            have = version(req.name)
        except PackageNotFoundError:
            pytest.fail(f"{req.name} of the [{extra}] extra is not installed")
        assert req.specifier.contains(have, prereleases=True), (str(req), have)


def _main_sh_is_setup_then_main() -> None:
    text = (REPO / "scripts/main.sh").read_text()
    assert "bash scripts/setup.sh" in text and re.search(r"^exec \.venv/bin/rookworld-debug main \"\$@\"$", text, re.M)


def _serve_jupyter_lab(line: list[str]) -> None:
    """The README's JupyterLab command, run from the clone (where `.venv/` and `notebooks/` are) with stdin closed,
    and these appended: no browser, 127.0.0.1 on a free port and no other, a token, `--allow-root` under root (the
    README says so), its state in a temporary folder. It must serve the five notebooks (HTTP 200 for the lab page and
    for each notebook) within JUPYTER_DEADLINE s; then its process group is stopped."""
    import json
    import secrets
    import signal
    import socket
    import tempfile
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = secrets.token_hex(16)
    argv = [str(REPO / line[0]), *line[1:], "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"] + (["--allow-root"] if os.geteuid() == 0
                                                                                   else [])
    with tempfile.TemporaryDirectory(prefix="readme-lab-") as state:
        env = {**ENV, "JUPYTER_RUNTIME_DIR": f"{state}/runtime", "JUPYTER_CONFIG_DIR": f"{state}/config",
               "JUPYTERLAB_WORKSPACES_DIR": f"{state}/workspaces"}
        log = Path(state) / "lab.log"
        t0 = time.perf_counter()
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"README line `{shlex.join(line)}` exited {proc.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.perf_counter() - t0 > JUPYTER_DEADLINE:
                    pytest.fail(f"`{shlex.join(line)}` did not answer within {JUPYTER_DEADLINE} s:\n"
                                f"{log.read_text()[-3000:]}")
                time.sleep(0.5)
            with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=30) as r:
                listed = {x["name"] for x in json.load(r)["content"]}
            assert set(NOTEBOOKS) <= listed, (f"`{shlex.join(line)}` does not serve the notebooks", sorted(listed))
            for name in NOTEBOOKS:
                with urllib.request.urlopen(f"{base}/api/contents/{name}?token={token}&content=0", timeout=30) as r:
                    assert r.status == 200, name
            print(f"[readme] {shlex.join(line)}: served {len(NOTEBOOKS)} notebooks after "
                  f"{time.perf_counter() - t0:.1f} s")
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


def run_block(block: Block, cwd: Path, demo: Path | None = None) -> dict:
    """Run one README block in `cwd` (module doc for the substitutions); {command: CompletedProcess}."""
    done = {}
    if block.lang == "python":
        r = _run([sys.executable, "-c", block.code], cwd)
        _check_exit(["python", f"README.md:{block.line}"], r)
        return {"python": r}
    assert block.lang == "bash", f"README.md:{block.line}: a ```{block.lang} block; this test runs bash and python"
    for line in lines(block):
        if line[:2] == ["bash", "scripts/main.sh"]:
            _main_sh_is_setup_then_main()
            r = _run([CLI, "main", *line[2:], *MAIN_SMALL], cwd)
        elif line[:2] == ["bash", "scripts/test.sh"]:
            r = _run(["bash", "-n", str(REPO / "scripts/test.sh")], cwd)
        elif line[:2] == ["pip", "install"]:
            _pip_extra_is_installed(line)
            continue
        elif line[:2] == ["rookworld-debug", "trl-demo"]:
            assert line[2:4] == ["--out", line[3]] and len(line) == 4, \
                f"README's trl-demo line `{shlex.join(line)}` is not the shared demo run's command (trl-demo --out DIR)"
            assert demo is not None
            shutil.copytree(demo, cwd / line[3])
            continue
        elif line[:2] == [".venv/bin/jupyter", "lab"]:                  # a server: it answers, then it is stopped
            _serve_jupyter_lab(line)
            continue
        elif line[0] == "python" and line[1].startswith("examples/"):     # an example trainer, run from the clone
            r = _run([sys.executable, str(REPO / line[1]), *line[2:]], cwd)
        elif line[0] == "rookworld-debug":
            args = [SMALLER.get(line[i - 1], a) if line[1] == "whatif" else a for i, a in enumerate(line) if i]
            r = _run([CLI, *args], cwd)
        else:
            pytest.fail(f"README.md:{block.line}: `{shlex.join(line)}`: this test does not know how to run it")
        _check_exit(line, r, EXIT.get(tuple(line[1:3]), 0))
        done[shlex.join(line)] = r
    return done


# ------------------------------------------------------------------------------------------------- the tests
def test_every_block_is_in_a_section_this_test_runs():
    found = blocks()
    assert len(found) >= 7, found
    stray = [b for b in found if not b.section.startswith(SECTIONS)]
    assert not stray, f"README blocks no test runs (add their section to SECTIONS and a test): {stray}"
    assert [lines(b)[0][:2] for b in section("# rookworld_debug")] == [["bash", "scripts/main.sh"]]


def test_every_command_in_the_table_exists():
    """`rookworld-debug X --help` exits 0 for every X the README's command table names."""
    table = README[README.index("## Commands"):README.index("## Read more")]
    names = sorted(set(re.findall(r"^\| `rookworld-debug ([a-z-]+)", table, re.M))
                   | set(re.findall(r"`rookworld-debug [a-z-]+`, `([a-z-]+)`", table)))
    assert len(names) >= 12, names
    missing = []
    for name in names:
        r = subprocess.run([CLI, name, "--help"], env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            missing.append(f"{name}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    assert not missing, missing


@pytest.mark.timeout(300)
def test_way_1_the_notebooks_in_jupyterlab(tmp_path):
    """The README's JupyterLab command serves the five notebooks; REFERENCE.md gives the same command."""
    (block,) = section("### 1.")
    assert [x[:2] for x in lines(block)] == [[".venv/bin/jupyter", "lab"]], block
    run_block(block, tmp_path)
    command = shlex.join(lines(block)[0])
    assert f"`{command}`" in (REPO / "docs" / "REFERENCE.md").read_text(), f"REFERENCE.md does not give `{command}`"
    for name in NOTEBOOKS:
        assert (REPO / "notebooks" / name).is_file() and f"`{name}`" in README + (REPO / "docs/REFERENCE.md").read_text()


@pytest.mark.timeout(1800)
def test_the_set_up_block_and_way_2(tmp_path):
    """The top block (main.sh → `main`, test.sh) and way 2 (main.sh again, then the Python block)."""
    ran = {}
    for b in section("# rookworld_debug") + section("### 2."):
        if b.lang == "bash" and lines(b)[0][:2] == ["bash", "scripts/main.sh"] and "main" in ran:
            continue                                   # one `main` run covers both main.sh lines (same command)
        ran.update({("main" if "main.sh" in k else k): v for k, v in run_block(b, tmp_path).items()})
    from rookworld_debug.report import run_id
    report = re.search(r"^report: (.*report\.html)$", ran["main"].stdout, re.M)
    assert report and Path(report.group(1)).is_file() and Path(report.group(1)).parent.parent == \
        tmp_path / "reports" / "main", ran["main"].stdout
    assert run_id({}) == "run"                        # with no -p the README's reports/main/run/report.html
    assert "python" in ran and (tmp_path / "reports" / "my_step" / "trace.json").is_file()


@pytest.mark.timeout(600)
def test_way_5_your_own_training_loop(tmp_path):
    """The example trainer records its step; diagnose replays it clean (exit 0); the Python block prints each phase."""
    ran = {}
    for b in section("### 5."):
        ran.update(run_block(b, tmp_path))
    assert (tmp_path / "runs" / "manual" / "step-2" / "state" / "state.json").is_file()
    printed = ran["python"].stdout
    assert all(p in printed for p in ("generation", "rewards", "advantages", "scoring", "loss", "gradient", "update"))


@pytest.mark.timeout(1800)
def test_way_3_your_own_trl_run(tmp_path):
    """The capture block trains a healthy run: diagnose of its step 4 finds no error (exit 0)."""
    ran = {}
    for b in section("### 3."):
        ran.update(run_block(b, tmp_path))
    step = next(k for k in ran if k.startswith("rookworld-debug diagnose"))
    assert "ERROR" not in ran[step].stdout, ran[step].stdout
    assert (tmp_path / "runs" / "mine" / "captures" / "triage" / "triage.html").is_file()


@pytest.mark.timeout(1800)
def test_way_4_a_run_that_went_wrong(tmp_path, trl_demo_run):
    """From the demo run to a what-if verdict without naming a checkpoint: whatif says what it branched."""
    ran = {}
    for b in section("### 4."):
        ran.update(run_block(b, tmp_path, demo=trl_demo_run))
    assert (tmp_path / "runs" / "demo" / "triage" / "triage.html").is_file()
    diag = next(v for k, v in ran.items() if k.startswith("rookworld-debug diagnose"))
    assert "lr_too_large (step 8)" in diag.stdout, diag.stdout[-2000:]
    whatif = next(v for k, v in ran.items() if k.startswith("rookworld-debug whatif"))
    assert "whatif: step 8 was flagged" in whatif.stderr and "checkpoint-6" in whatif.stderr, whatif.stderr[-2000:]
    assert "self-check passed" in whatif.stdout and "whatif.json" in whatif.stdout, whatif.stdout[-2000:]
    assert "{'loss'" not in whatif.stdout                  # the branches' trainers do not print their raw logs
