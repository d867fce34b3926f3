"""`rookworld-debug triage` on the runs that need it, as a user runs it (subprocess, stdin closed, timeout): a
relative run path; a diverged log (NaN loss, ±Infinity metrics, duplicated and out-of-order steps); captures
that cannot be opened (reported as broken, not as "not rendered yet"); and hostile names in every field the
page shows (run and capture folder names, metric and reward-function names, index errors). Nothing is injected
into the page's DOM (checked in Chromium), and every command shown is shell-quoted (run through bash: the
arguments come back verbatim and no canary file appears)."""
from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from cli import CLI, ENV
from tinymodels import use_spare_cores

# markup that would become an element or an attribute, a script hook, a shell substitution: {canary} is a path
HOSTILE = ('<rwinjected data-rwinjected="1">x</rwinjected><img src=x onerror="window.__pwned=1">'
           '"\' data-rwinjected=1 $(touch {canary}) `touch {canary}`')


def _hostile(canary: Path) -> str:
    return HOSTILE.replace("{canary}", str(canary))


def _log(metric_name: str) -> list:
    """A diverged TRL log_history: NaN loss at step 4, +Infinity KL at 6, −Infinity entropy at 7, step 5 logged
    twice, steps out of order, a hostile metric name that goes non-finite, an eval entry and the final summary."""
    rows = []
    for s in (1, 2, 3, 5, 4, 6, 7, 8, 5):
        rows.append({"step": s, "loss": 0.1 * s, "reward": 0.5 + 0.01 * s, "kl": 0.001 * s, "entropy": 1.0,
                     "grad_norm": 0.3, "learning_rate": 1e-5, metric_name: 1.0})
    rows[4]["loss"] = math.nan
    rows[5]["kl"] = math.inf
    rows[6]["entropy"] = -math.inf
    rows[7][metric_name] = math.nan
    return rows + [{"step": 8, "eval_loss": 0.3}, {"step": 8, "train_loss": 0.2, "train_runtime": 3.0}]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    """A real step trace whose reward function has a hostile name (shown in the step report)."""
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.step import run_step
    use_spare_cores()
    tmp = tmp_path_factory.mktemp("trace")
    cfg = StepConfig().replace(reward_mode="dataset", batch_size=2, num_generations=2, max_new_tokens=8,
                               eval_max_new_tokens=8, heldout_n=0)
    name = _hostile(tmp / "CANARY")

    def hostile(prompts, completions, **kw):
        return [float(i % 2) for i in range(len(completions))]
    run_step(cfg, reward_funcs={name: hostile}).save(tmp / "t")
    return tmp / "t"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, trace_dir):
    base = tmp_path_factory.mktemp("hostile")
    # a short canary path: the folder names below hold it twice, and a name may not pass 255 bytes
    canary = Path(tempfile.mkdtemp(prefix="rwc")) / "CANARY"
    h = _hostile(canary).replace("/", "∕")                     # a folder name cannot hold '/'
    run = base / f"run {h}"
    caps = run / "captures"
    caps.mkdir(parents=True)
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 8, "log_history": _log(h)}))
    good4, good6 = f"step-4 {h}", f"step-6 {h}"
    shutil.copytree(trace_dir, caps / good4)
    shutil.copytree(trace_dir, caps / good6)
    (caps / "step-000007").mkdir()
    (caps / "step-000007" / "trace.json").write_text('{"__record__": "x", "fields": {}}')   # no safetensors
    index = [{"step": 4, "path": good4, "reasons": [{"trigger": h}]}, {"step": 6, "path": good6, "reasons": h},
             {"step": 7, "path": "step-000007", "reasons": []},
             {"step": 8, "path": None, "error": f"OSError: [Errno 28] No space left on device {h}"},
             {"step": 2, "path": "../../..", "reasons": []}]
    (caps / "captures.json").write_text(json.dumps({"format": 1, "captures": index}))
    r = subprocess.run([CLI, "triage", run.name, "--no-progress", "--max-step-reports", "1"], cwd=base,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {"run": run, "canary": canary, "hostile": h, "stdout": r.stdout}


def test_relative_path_and_a_diverged_log_give_the_page_with_gaps_and_flags(hostile_run):
    run = hostile_run["run"]
    t = json.loads((run / "triage" / "triage.json").read_text())
    assert (run / "triage" / "triage.html").is_file() and t["run_dir"] == str(run.resolve())
    assert [r["step"] for r in t["rows"]] == list(range(1, 9))          # sorted, one row per step
    nf = {f["step"]: f for f in t["flagged"] if f["kind"] == "non-finite"}
    assert {4, 6, 7, 8} <= set(nf), t["flagged"]
    assert "loss is nan" in nf[4]["detail"] and "kl is inf" in nf[6]["detail"]
    assert "entropy is -inf" in nf[7]["detail"] and hostile_run["hostile"] in nf[8]["detail"]
    assert any("step(s) 5 logged more than once" in n for n in t["notes"])
    assert not hostile_run["canary"].exists()


def test_captures_that_cannot_be_opened_are_broken_not_pending(hostile_run):
    run = hostile_run["run"]
    t = json.loads((run / "triage" / "triage.json").read_text())
    broken = t["broken_captures"]
    assert "trace.safetensors cannot be opened" in broken["7"]
    assert broken["8"].startswith("the capture failed: OSError: [Errno 28] No space left on device")
    assert "outside the captures folder" in broken["2"]
    by_step = {f["step"]: f for f in t["flagged"]}
    for s in (7, 8):
        assert by_step[s]["broken"] and not by_step[s]["report_command"] and not by_step[s]["report_rendered"]
    assert by_step[4]["report_rendered"] and by_step[4]["captured"]       # rendered now (--max-step-reports 1)
    assert by_step[6]["report_command"] and not by_step[6]["report_rendered"]   # on demand
    page = (run / "triage" / "triage.html").read_text()
    assert "capture broken" in page and "not rendered yet" in page


def test_commands_on_the_page_are_shell_quoted(hostile_run):
    run, canary = hostile_run["run"], hostile_run["canary"]
    t = json.loads((run / "triage" / "triage.json").read_text())
    cmds = [f["report_command"] for f in t["flagged"] if f.get("report_command")]
    assert cmds
    for cmd in cmds:
        # bash runs what a user pastes: with the program swapped for printf, the arguments come back verbatim
        out = subprocess.run(["bash", "-c", "printf '%s\\0' " + cmd.removeprefix("rookworld-debug ")],
                             capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        args = out.stdout.decode().split("\0")[:-1]
        assert args == shlex.split(cmd)[1:]
        assert args[args.index("--trace") + 1].endswith(f"step-6 {hostile_run['hostile']}")
    assert not canary.exists(), "a command shown on the page ran a substitution"


def _dom_report(page_path: Path) -> dict:
    from conftest import offline_page
    with offline_page(page_path) as pg:
        pg.wait_for_load_state("load")
        pg.wait_for_timeout(500)
        return pg.evaluate("""() => ({
            injected: document.querySelectorAll('rwinjected, [data-rwinjected], img[src="x"]').length,
            pwned: window.__pwned === 1,
            text: document.body.innerText})""")


@pytest.mark.browser
def test_hostile_names_inject_nothing_into_the_pages_in_chromium(hostile_run):
    run = hostile_run["run"]
    t = json.loads((run / "triage" / "triage.json").read_text())
    step4 = next(f for f in t["flagged"] if f["step"] == 4 and f["report_rendered"])
    for page in (run / "triage" / "triage.html", run / "triage" / step4["report"]):
        dom = _dom_report(page)
        assert dom["injected"] == 0 and not dom["pwned"], page
        assert "<rwinjected" in dom["text"], page                # shown as text, not as markup
    assert not hostile_run["canary"].exists()
