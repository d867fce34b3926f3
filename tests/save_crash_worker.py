"""Saves of real step folders cut short, for tests/test_save_crash.py:
`python save_crash_worker.py WORK OUT KILLS FRESH_EVERY ENOSPC RACES` writes OUT (JSON): per case, what a reader
found.

One process records two steps of a micro GPT-2 with their weights (state/), then forks one child per case: the
child saves with a hook that counts every file-system operation of the save (audit events: open, mkdir, rename,
remove, rmdir, chmod, scandir, rmtree, mkstemp; each os.fsync and os.write; each 2 KiB of a safetensors file,
written from Python by the hook so a kill can land inside one) and at the k-th one is SIGKILLed, or raises
ENOSPC, or hits a file size limit. The parent then classifies the folder by content hash (the previous step, the
new one, absent, or a mix), reads it as a user would (StepTrace.load, read_state, folder_diagnosis without the
replay) and saves again to show the leftovers go.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

EVENTS = frozenset({"open", "os.rename", "os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.scandir",
                    "os.listdir", "shutil.rmtree", "tempfile.mkstemp"})
CHUNK = 2048


class Hook:
    """Counts the save's operations while armed; at the `at`-th one, `action` ("kill" | "enospc")."""
    armed, count, at, action, log = False, 0, 0, "", []

    def tick(self, what: str = "") -> None:
        if not self.armed:
            return
        self.count += 1
        self.log.append(what)
        if self.count == self.at:
            self.armed = False
            if self.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def arm(self, at: int, action: str) -> None:
        self.count, self.at, self.action, self.log, self.armed = 0, at, action, [], True


HOOK = Hook()


def install() -> None:
    """The hook on every way the save touches the disk (a no-op until armed, in a child)."""
    import safetensors.torch as st
    sys.addaudithook(lambda event, args: HOOK.tick(event) if event in EVENTS else None)
    real_write, real_fsync, real_save = os.write, os.fsync, st.save_file

    def write(fd, data):
        HOOK.tick("os.write")
        return real_write(fd, data)

    def fsync(fd):
        HOOK.tick("os.fsync")
        return real_fsync(fd)

    def save_file(tensors, filename, metadata=None):
        if not HOOK.armed:
            return real_save(tensors, filename, metadata=metadata)
        data = st.save(tensors, metadata=metadata)
        with open(filename, "wb") as fh:                   # chunks: a kill lands inside the file too
            for i in range(0, len(data), CHUNK):
                HOOK.tick("write 2 KiB")
                fh.write(data[i:i + CHUNK])
                fh.flush()

    os.write, os.fsync, st.save_file = write, fsync, save_file


# ------------------------------------------------------------------------------------------------ the steps
def record_two(folder: Path):
    """Two consecutive GRPO steps of the fuzz test's micro GPT-2, each recorded with its weights: (old, new)."""
    import copy
    from dataclasses import replace

    import torch
    from test_step_folder_fuzz import BETA, G, _grpo_step
    from tinymodels import embedded_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    from rookworld_debug.record import StepRecorder
    tok = embedded_tokenizer()
    eos = tok.eos_token_id
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64, vocab_size=len(tok),
                                       bos_token_id=eos, eos_token_id=eos)).eval()
    ref = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = []
    for step in (1, 2):
        rec = StepRecorder(tok, trainer="save crash", step=step, loss_type="grpo", num_generations=G, beta=BETA,
                           temperature=1.0, reward_mode="dataset", max_grad_norm=1.0)
        _grpo_step(model, ref, opt, tok, rec)
        out.append(replace(rec.build(), kept=rec.kept_state()))
    return out


def digest(folder: Path) -> str:
    """sha256 over every file's relative path and bytes (and every folder's name)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        h.update(str(p.relative_to(folder)).encode() + (b"/" if p.is_dir() else b":"))
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def classify(path: Path, hashes: dict) -> str:
    if not path.exists():
        return "absent"
    d = digest(path)
    return next((name for name, h in hashes.items() if h == d), "mixed")


def read(path: Path, diagnose: bool = True) -> str:
    """What a reader finds: "whole" (the trace, its weights and, when `diagnose`, the diagnosis without replay all
    load) or the named error; anything else is "crash: ...". """
    from rookworld_debug.diagnosis.registry import folder_diagnosis
    from rookworld_debug.errors import RookWorldError
    from rookworld_debug.grpo.step import StepTrace
    from rookworld_debug.grpo.trace.state import read_state
    try:
        StepTrace.load(path)
        read_state(path)
        if diagnose:
            folder_diagnosis(path, replay=False)
    except RookWorldError as err:
        return f"{type(err).__name__}: {err}"
    except Exception as err:  # noqa: BLE001 - reported, the test fails on it
        return f"crash: {type(err).__name__}: {err}"
    return "whole"


def in_child(run) -> tuple:
    """(how the child ended, what it said): ("exit", 0) | ("signal", n) | ("error", "SaveError: ...")."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        said = b""
        try:
            run()
        except BaseException as err:  # noqa: BLE001 - told to the parent
            said = f"{type(err).__name__}: {err}".encode()
        HOOK.armed = False
        os.write(w, said)
        os._exit(0)
    os.close(w)
    said = b""
    while chunk := os.read(r, 65536):
        said += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    return ("error", said.decode()) if said else ("exit", 0)


# -------------------------------------------------------------------------------------------------- the cases
def one_case(work: Path, case: str, prev: Path, new, hashes: dict, run, full: bool = True) -> dict:
    """The step folder holds `prev` (or nothing when prev is None); `run(target)` in a child; what is found. `full`
    (and whenever no step is found): the diagnosis reads it too, and a save after it leaves no leftovers."""
    from rookworld_debug.grpo.trace.folder import leftovers
    parent = work / case
    target = parent / "step-000002"
    parent.mkdir(parents=True)
    if prev is not None:
        shutil.copytree(prev, target)
    ended, said = in_child(lambda: run(target))
    found = classify(target, hashes)
    left = [p.name for p in leftovers(target)]
    listed = [p.name for p in parent.iterdir() if not p.name.startswith(".")]
    full = full or found == "absent"
    row = {"case": case, "before": "previous" if prev is not None else "absent", "ended": ended, "said": said,
           "found": found, "read": read(target, diagnose=full), "leftovers": left, "listed": listed}
    if full:
        new.save(target)                                   # the next save: the new step whole, nothing left over
        row["after_resave"] = classify(target, hashes)
        row["left_after_resave"] = [p.name for p in parent.iterdir() if p.name != "step-000002"]
    shutil.rmtree(parent)
    return row


def count_ops(work: Path, new, prev: Path) -> list:
    """The operations of a whole save over `prev`, in order (the kill points to spread)."""
    def run(target):
        HOOK.arm(10 ** 9, "kill")
        new.save(target)
        raise SystemExit(json.dumps(HOOK.log))
    row = one_case(work, "count", prev, new, {}, run)
    return json.loads(row["said"].split(": ", 1)[1])


def kills(work, new, prev, hashes, points, fresh_every: int):
    """A kill at each point over the previous step; every `fresh_every`-th point also where no step was."""
    rows = []
    cases = [(k, prev) for k in points] + [(k, None) for k in points[::fresh_every]]
    for i, (k, before) in enumerate(cases):
        def run(target, k=k):
            HOOK.arm(k, "kill")
            new.save(target)
        rows.append({"k": k, **one_case(work, f"kill-{i}", before, new, hashes, run, full=i % 8 == 0)})
    return rows


def kill_points(ops: list, count: int) -> list:
    """`count` points spread over the save (each of its operations once `count` reaches them all, and the one
    after its last), always with every rename and its neighbours (the swap)."""
    n = len(ops)
    spread = range(1, n + 2) if count > n else {1 + round(i * n / (count - 1)) for i in range(count)}
    swap = {k + d for k, e in enumerate(ops, 1) if e == "os.rename" for d in (-1, 0, 1)}
    return sorted(set(spread) | {k for k in swap if 1 <= k <= n + 1})


def enospc(work, new, prev, hashes, points):
    rows = []
    for i, k in enumerate(points):
        def run(target, k=k):
            HOOK.arm(k, "enospc")
            new.save(target)
        rows.append({"k": k, **one_case(work, f"enospc-{i}", prev, new, hashes, run)})
    return rows


def size_limits(work, new, prev, hashes, limits):
    rows = []
    for lim in limits:
        for ignore in (False, True):
            def run(target, lim=lim, ignore=ignore):
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN if ignore else signal.SIG_DFL)
                resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))
                new.save(target)
            rows.append({"limit": lim, "sigxfsz": "ignored" if ignore else "default",
                         **one_case(work, f"fsize-{lim}-{ignore}", prev, new, hashes, run)})
    return rows


def races(work: Path, old, new, hashes, n: int) -> list:
    """Two children save old and new to one folder at once (released together through a pipe)."""
    from rookworld_debug.grpo.trace.folder import leftovers
    rows = []
    for i in range(n):
        parent = work / f"race-{i}"
        target = parent / "step-000002"
        parent.mkdir()
        if i % 2:
            shutil.copytree(work / "prev", target)
        go_r, go_w = os.pipe()
        pids = []
        for trace in (old, new):
            pid = os.fork()
            if pid == 0:
                os.close(go_w)
                os.read(go_r, 1)
                time.sleep((i % 5) * 0.002 * (trace is new))     # vary who renames first
                try:
                    trace.save(target)
                except BaseException as err:  # noqa: BLE001
                    sys.stderr.write(f"{type(err).__name__}: {err}\n")
                    os._exit(3)
                os._exit(0)
            pids.append(pid)
        os.close(go_r)
        os.write(go_w, b"gg")
        os.close(go_w)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        rows.append({"race": i, "codes": codes, "found": classify(target, hashes), "read": read(target),
                     "leftovers": [p.name for p in leftovers(target)]})
        shutil.rmtree(parent)
    return rows


def index_kills(work: Path) -> dict:
    """A TRL capture's captures.json rewritten (its writer's own write_index) and killed at each operation: the
    file is the old index or the new one, whole, and the capture folder's reader takes it."""
    from types import SimpleNamespace

    from rookworld_debug.diagnosis.registry import captured_steps
    from rookworld_debug.trl.capture import _Writer
    out_dir = work / "captures"
    for s in (1, 2):
        shutil.copytree(work / "prev", out_dir / f"step-{s:06d}")

    def writer(n):                          # the capture's writer, as far as write_index reads it
        index = [{"step": s, "path": f"step-{s:06d}", "reasons": [], "error": None, "top_finding": None,
                  "written_at": "2026-11-29T00:00:00"} for s in range(1, n + 1)]
        plan = SimpleNamespace(keep_last=0, every=0, steps={1, 2}, triggers=())
        return SimpleNamespace(out_dir=out_dir, index=index, plan=plan)

    _Writer.write_index(writer(1))
    old = (out_dir / "captures.json").read_bytes()

    def run():
        HOOK.arm(10 ** 9, "kill")
        _Writer.write_index(writer(2))
        raise SystemExit(f"ops {HOOK.count}")
    n_ops = int(in_child(run)[1].split()[-1])
    new = (out_dir / "captures.json").read_bytes()
    rows = []
    for k in range(1, n_ops + 1):
        (out_dir / "captures.json").write_bytes(old)

        def run(k=k):
            HOOK.arm(k, "kill")
            _Writer.write_index(writer(2))
        ended, _ = in_child(run)
        now = (out_dir / "captures.json").read_bytes()
        rows.append({"k": k, "ended": ended, "found": "old" if now == old else "new" if now == new else "mixed",
                     "steps": sorted(captured_steps(out_dir)),
                     "leftovers": sorted(p.name for p in out_dir.iterdir() if p.name.startswith("."))})
        for p in out_dir.glob(".captures.json.*"):
            p.unlink()
    return {"ops": n_ops, "rows": rows}


def trace_json_kills(work: Path, new, hashes) -> list:
    """trace.json rewritten in place inside a saved step (as a TRL capture adds its cost), killed at each
    operation: the step still loads, and a save over it is not refused for the leftover temporary file."""
    from rookworld_debug.safeio import atomic_write_json
    base = work / "rewrite"
    new.save(base / "step-000002")
    payload = json.loads((base / "step-000002" / "trace.json").read_text())
    before = (base / "step-000002" / "trace.json").read_bytes()
    atomic_write_json(base / "after.json", payload, indent=1)
    after = (base / "after.json").read_bytes()
    rows = []
    for k in range(1, 9):
        def run(target, k=k):
            HOOK.arm(k, "kill")
            atomic_write_json(target / "trace.json", payload, indent=1)
        target = work / f"rewrite-{k}" / "step-000002"
        shutil.copytree(base / "step-000002", target)
        ended, _ = in_child(lambda: run(target))
        now = (target / "trace.json").read_bytes()
        row = {"k": k, "ended": ended, "read": read(target, diagnose=False),
               "trace.json": "before" if now == before else "after" if now == after else "mixed",
               "inside": sorted(p.name for p in target.iterdir())}
        try:
            new.save(target)                               # a save over it: not refused for the leftover
            row["resave"] = classify(target, hashes)
        except Exception as err:  # noqa: BLE001 - reported
            row["resave"] = f"{type(err).__name__}: {err}"
        rows.append(row)
        shutil.rmtree(target.parent)
    return rows


def keep_absent(work: Path, new, prev: Path, rows: list) -> str:
    """A folder a kill left absent while replacing a step (its earlier step aside), kept for the CLI to read."""
    k = next(r["k"] for r in rows if r["before"] == "previous" and r["found"] == "absent")
    target = work / "kept" / "step-000002"
    shutil.copytree(prev, target)

    def run():
        HOOK.arm(k, "kill")
        new.save(target)
    in_child(run)
    return str(target)


def main(work: Path, out: Path, kills_n: int, fresh_every: int, enospc_n: int, races_n: int) -> None:
    import torch
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    old, new = record_two(work)
    old.save(work / "prev")
    new.save(work / "new-a")
    new.save(work / "new-b")
    hashes = {"previous": digest(work / "prev"), "new": digest(work / "new-a")}
    assert hashes["new"] == digest(work / "new-b") != hashes["previous"], "a save is not deterministic"
    install()
    ops = count_ops(work, new, work / "prev")
    result = {"built_s": time.perf_counter() - t0, "ops": len(ops), "operations": ops,
              "files": sorted(str(p.relative_to(work / "prev")) for p in (work / "prev").rglob("*") if p.is_file())}
    result["largest"] = max(p.stat().st_size for p in (work / "new-a").rglob("*") if p.is_file())
    t = time.perf_counter()
    result["kills"] = kills(work, new, work / "prev", hashes, kill_points(ops, kills_n), fresh_every)
    result["kills_s"] = time.perf_counter() - t
    result["kept_absent"] = keep_absent(work, new, work / "prev", result["kills"])
    result["enospc"] = enospc(work, new, work / "prev", hashes, kill_points(ops, enospc_n))
    largest = result["largest"]                  # under it: the save fails; at it: it fits
    result["fsize"] = size_limits(work, new, work / "prev", hashes, (0, 4096, largest - 1, largest, 1 << 20))
    result["races"] = races(work, old, new, hashes, races_n)
    result["rewrite"] = trace_json_kills(work, new, hashes)
    result["index"] = index_kills(work)
    result["total_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *map(int, sys.argv[3:7]))
