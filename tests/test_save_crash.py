"""Saves cut short: a step folder, after any kill, full disk, file size limit or second writer, holds the step saved
there before whole, the new step whole, or nothing; never a mix. Leftovers of a save that died are named to the
reader, never taken for a step, and removed by the next save.

The sweep (tests/save_crash_worker.py) saves a real recorded step with its weights (state/: 11 files) in forked
children and kills each at the k-th of its file-system operations (235 for a save over a step: opens, 2 KiB
pieces of each safetensors file, fsyncs, renames, removals); 60 kill points by default, 1,200 in the slow run,
every point of the save reached. Its work folder is on /dev/shm when there is one (no disk flushes to wait for).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from cli import ENV, run_cli

from rookworld_debug.errors import SaveError, TraceError
from rookworld_debug.grpo.step import StepTrace
from rookworld_debug.grpo.trace import folder as F

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "trace_v1"
WHOLE = ("previous", "new", "absent")


@pytest.fixture(scope="module")
def trace():
    return StepTrace.load(FIXTURE)


def _files(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------ named errors, in this process
def test_a_save_under_a_file_is_a_named_error_naming_it(trace, tmp_path):
    (tmp_path / "f").write_text("x")
    for target in (tmp_path / "f" / "step", tmp_path / "f" / "a" / "step"):
        with pytest.raises(SaveError, match=f"{tmp_path / 'f'} is a file, not a folder") as err:
            trace.save(target)
        assert isinstance(err.value, OSError) and err.value.errno in (errno.EEXIST, errno.ENOTDIR)
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_a_rename_that_fails_puts_the_previous_step_back(trace, tmp_path, monkeypatch):
    target = trace.save(tmp_path / "step")
    before = _files(target)
    real = os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".step.saving-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(SaveError, match="No space left on device") as err:
        trace.save(target)
    assert err.value.errno == errno.ENOSPC and str(target) in str(err.value)
    assert _files(target) == before and sorted(os.listdir(tmp_path)) == ["step"]


def test_another_writers_step_arriving_midway_is_replaced_whole(trace, tmp_path, monkeypatch):
    """Between this save moving the old step aside and renaming its own in, another save's step comes in: this
    save moves that one aside too and its own wins, whole (the later rename wins)."""
    other = trace.save(tmp_path / "other")
    (other / "trace.json").write_text((other / "trace.json").read_text() + "\n")      # another step's bytes
    target = trace.save(tmp_path / "step")
    ours = _files(target)
    real, raced = os.rename, []

    def rename(src, dst):
        if Path(src).name.startswith(".step.saving-") and not raced:
            raced.append(shutil.copytree(other, dst))
        return real(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    trace.save(target)
    assert raced and _files(target) == ours and sorted(os.listdir(tmp_path)) == ["other", "step"]


def test_leftovers_are_named_never_steps_and_go_with_the_next_save(trace, tmp_path):
    from rookworld_debug.diagnosis.registry import recorded_steps
    target = trace.save(tmp_path / "step")
    host = F._host()
    aside = tmp_path / f".step.replaced-{host}-{_dead_pid()}-0123abcd"
    half = tmp_path / f".step.saving-{host}-{_dead_pid()}-4567cdef"
    live = tmp_path / f".step.saving-{host}-{os.getppid()}-89abcdef"      # a writer still at work
    target.rename(aside)
    half.mkdir()
    live.mkdir()
    with pytest.raises(TraceError, match=f"interrupted save left .*{aside.name} holds the step saved there before"):
        StepTrace.load(target)
    assert recorded_steps(tmp_path) == []
    trace.save(target)
    assert sorted(os.listdir(tmp_path)) == [live.name, "step"]


def test_a_leftover_of_an_in_place_rewrite_does_not_block_a_save(trace, tmp_path):
    target = trace.save(tmp_path / "step")
    (target / ".trace.json.abc123.tmp").write_text("{")
    StepTrace.load(target)
    trace.save(target)
    assert sorted(os.listdir(target)) == ["trace.json", "trace.safetensors"]


# ------------------------------------------------------------------------- the sweep, in forked children
def _sweep(tmp_path: Path, kills: int, fresh_every: int, enospc: int, races: int) -> dict:
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1 << 30 else tmp_path
    work = Path(tempfile.mkdtemp(prefix="rw-save-crash-", dir=base))
    out = tmp_path / "result.json"
    try:
        args = [str(x) for x in (work, out, kills, fresh_every, enospc, races)]
        done = subprocess.run([sys.executable, str(HERE / "save_crash_worker.py"), *args], cwd=HERE,
                              env={**ENV, "TOKENIZERS_PARALLELISM": "false"}, capture_output=True, text=True,
                              timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(out.read_text())
        kept = Path(result["kept_absent"])
        said = run_cli("diagnose", kept, "--no-replay", timeout=120)
        result["cli"] = {"code": said.returncode, "stderr": said.stderr}
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_case(row: dict) -> None:
    """One case's invariant: whole or absent, read as such, leftovers hidden and named, the next save clean."""
    assert row["found"] in WHOLE, row
    if row["before"] == "absent":
        assert row["found"] != "previous", row
    if row["found"] == "absent":
        assert row["read"].startswith(("TraceError", "DataError")) and "an interrupted save left" in row["read"] \
            if row["leftovers"] else "no such folder" in row["read"], row
        assert all(n in row["read"] for n in row["leftovers"]), row
    else:
        assert row["read"] == "whole", row
    assert row["listed"] == ([] if row["found"] == "absent" else ["step-000002"]), row
    if "after_resave" in row:
        assert row["after_resave"] == "new" and row["left_after_resave"] == [], row


def _check(result: dict, kills: int) -> dict:
    counts = {}
    rows = result["kills"]
    assert len(rows) >= kills and {r["k"] for r in rows} >= {1, result["ops"] + 1}
    for row in rows:
        _check_case(row)
        if row["ended"] == "exit":                        # k past the save's last operation
            assert row["found"] == "new" and (row["k"] > result["ops"] or row["before"] == "absent"), row
        else:
            assert row["ended"] == "signal" and row["said"] == 9, row
    counts["kills"] = Counter(f"{r['before']}→{r['found']}" for r in rows)
    for row in result["enospc"]:                      # a failed save changes nothing; a finished one is whole
        _check_case(row)
        if row["ended"] == "error":
            assert row["said"].startswith("SaveError: save: ") and "No space left on device" in row["said"], row
            assert row["found"] == "previous" and row["leftovers"] == [], row
        else:
            assert row["ended"] == "exit" and row["found"] == "new", row
    counts["enospc"] = Counter(f"{r['ended']}→{r['found']}" for r in result["enospc"])
    largest = result["largest"]                       # bytes of the step's largest file (the optimizer state)
    for row in result["fsize"]:
        _check_case(row)
        if row["limit"] < largest:
            want = ("signal", 25) if row["sigxfsz"] == "default" else ("error", None)
            assert row["ended"] == want[0] and row["found"] == "previous", row
            if want[0] == "error":
                assert row["said"].startswith("SaveError: save: ") and "File too large" in row["said"], row
                assert row["leftovers"] == [], row
        else:
            assert row["ended"] == "exit" and row["found"] == "new", row
    counts["fsize"] = Counter(f"{r['sigxfsz']}:{r['ended']}→{r['found']}" for r in result["fsize"])
    for row in result["races"]:                       # both saves return; the later rename wins, whole
        assert row["codes"] == [0, 0] and row["found"] in ("previous", "new") and row["read"] == "whole", row
        assert row["leftovers"] == [], row
    counts["races"] = Counter(r["found"] for r in result["races"])
    for row in result["rewrite"]:
        assert row["trace.json"] in ("before", "after") and row["read"] == "whole" and row["resave"] == "new", row
    index = result["index"]
    for row in index["rows"]:                         # captures.json: the old index or the new one, whole
        assert row["found"] in ("old", "new") and row["steps"] == ([1] if row["found"] == "old" else [1, 2]), row
        assert all(n.startswith(".captures.json.") and n.endswith(".tmp") for n in row["leftovers"]), row
    assert len(index["rows"]) == index["ops"] >= 5
    assert result["cli"]["code"] == 2 and "bad input: DataError" in result["cli"]["stderr"], result["cli"]
    assert "holds the step saved there before, whole" in result["cli"]["stderr"], result["cli"]
    return counts


def _count(fuzz_counts: dict, counts: dict, run: str) -> None:
    for part, c in counts.items():
        for outcome, n in c.items():
            key = f"save cut short{run}: {part} {outcome}"
            fuzz_counts[key] = fuzz_counts.get(key, 0) + n


def test_saves_cut_short_leave_a_whole_step_or_none(tmp_path, fuzz_counts):
    counts = _check(_sweep(tmp_path, kills=32, fresh_every=4, enospc=16, races=12), kills=40)
    for seen in ("previous→previous", "previous→absent", "previous→new", "absent→absent", "absent→new"):
        assert counts["kills"][seen], counts
    _count(fuzz_counts, counts, "")


@pytest.mark.slow
def test_saves_cut_short_at_every_operation(tmp_path, fuzz_counts):
    """Every operation of the save killed, over a step and where none was; ENOSPC at every one; 100 races."""
    result = _sweep(tmp_path, kills=10 ** 6, fresh_every=1, enospc=10 ** 6, races=100)
    counts = _check(result, kills=2 * result["ops"])
    assert {r["k"] for r in result["kills"]} == set(range(1, result["ops"] + 2))
    assert {r["k"] for r in result["enospc"]} == set(range(1, result["ops"] + 2))
    assert counts["kills"]["previous→absent"] and counts["kills"]["absent→new"]
    _count(fuzz_counts, counts, " (slow)")
