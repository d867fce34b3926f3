"""The GPU check's driver (run it through scripts/gpu_check.sh, which prepares the environment).

Each part runs as a user runs it — a subprocess with stdin closed and a deadline — and lands in one JSON:
machine, the default test suite on the device, `step` / `run` / `whatif` / `diagnose` of the embedded model, a
captured TRL run (its recomputed loss against TRL's logged loss, and how TRL computed its log-probs), and the
benchmark of (a) our core step, (b) our instrumented step and (c) TRL's GRPOTrainer step at B = 8, G = 24,
128 new tokens on the 124M GPT-2 architecture. A part that fails is recorded with its exit code and output tail;
the others still run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv/bin/rookworld-debug")
PY = str(REPO / ".venv/bin/python")

# what the test suite imports beyond the package's core needs; a bare GPU machine may lack some of them
TEST_MODULES = ("papermill", "nbformat", "nbconvert", "nbclient", "ipykernel", "ipywidgets", "anywidget", "jupyterlab",
                "playwright", "dask", "distributed", "grimp", "importlinter", "latex2mathml", "hypothesis", "filelock",
                "trl", "datasets", "chess", "plotly", "accelerate", "jsonschema")


def run(name: str, cmd: list, timeout: float, env: dict | None = None) -> dict:
    """One part: exit code, seconds, the output's last lines."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                           cwd=REPO, env={**os.environ, **(env or {})})
        rc, out = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired as e:      # its output so far arrives as bytes
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        rc, out = "timeout", text(e.stdout) + text(e.stderr)
    res = {"name": name, "command": " ".join(map(str, cmd)), "exit": rc, "device": _device_of(cmd),
           "seconds": round(time.perf_counter() - t0, 2), "tail": out.strip().splitlines()[-12:]}
    print(f"[gpu-check] {name}: exit {rc} in {res['seconds']} s", flush=True)
    return res


def _device_of(cmd: list) -> str:
    """The device a part ran on: its --device / device= argument, else the suite's (RW_TEST_DEVICE) or 'cpu'."""
    args = [str(c) for c in cmd]
    for i, c in enumerate(args):
        if c == "--device" and i + 1 < len(args):
            return args[i + 1]
        if c.startswith("device="):
            return c.split("=", 1)[1]
    return os.environ.get("RW_TEST_DEVICE", "cpu")


def machine(device: str) -> dict:
    import torch
    info = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0),
                    gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    for mod in ("transformers", "trl", "accelerate", "chess", "triton"):
        spec = importlib.util.find_spec(mod)
        info[mod] = None if spec is None else getattr(__import__(mod), "__version__", "present")
    return info


PARTS = ("suite", "commands", "trl", "bench")       # what --skip may leave out


def out_refusal(out: str) -> str:
    """Why the JSON cannot be written under `out` ("" when it can): a folder, made when absent."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        return f"--out {out}: a file, not a folder (the check writes gpu-check-DATE-DEVICE.json into it)"
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"--out {out}: cannot make the folder ({err.strerror or err})"
    return ""


def device_refusal(device: str) -> str:
    """Why the check cannot measure `device` here ("" when it can)."""
    import torch
    from rookworld_debug.errors import ConfigError
    from rookworld_debug.models.devices import check_device
    if device.startswith("cuda") and not torch.cuda.is_available():
        return (f"--device {device}: this machine has no CUDA GPU (torch {torch.__version__}, "
                f"cuda_available false); nothing written. Rehearse with --device cpu --quick")
    try:
        check_device(device)              # the package's own check: mps, a cuda:N beyond the count, a bad name
    except ConfigError as err:
        return f"--device {device}: {err}; nothing written"
    return ""


def absent_modules() -> list:
    return sorted(m for m in TEST_MODULES if importlib.util.find_spec(m) is None)


def skipped_files(absent: list) -> dict:
    """{test file: why} for the files whose module-level imports this machine lacks: left out by name. Tests that
    import such a module inside the test are reported as skipped by tests/conftest.py (RW_ABSENT_MODULES)."""
    import ast
    out = {}
    for f in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(f.read_text())
        names = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names} | \
                {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
        missing = sorted(names & set(absent))
        if missing:
            out[f"tests/{f.name}"] = f"imports {', '.join(missing)}, which this machine lacks"
    return out


def suite(quick: bool, workers: int, tmp: Path) -> dict:
    absent = absent_modules()
    skips = skipped_files(absent)
    junit = tmp / "junit.xml"
    files = ["tests/test_devices.py", "tests/test_config.py"] if quick else []
    cmd = [PY, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           *(["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []),
           *[f"--ignore={f}" for f in skips], *files]
    res = run("test suite", cmd, timeout=240 if quick else 400, env={"RW_ABSENT_MODULES": ",".join(absent)})
    res["absent_modules"], res["skipped_files"] = absent, skips
    res.update(_junit(junit))
    return res


def _junit(path: Path) -> dict:
    import xml.etree.ElementTree as ET
    if not path.exists():
        return {"counts": None}
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    failed, skipped, total = [], [], 0
    for c in cases:
        total += 1
        name = f"{c.get('classname')}::{c.get('name')}"
        if c.find("failure") is not None or c.find("error") is not None:
            bad = c.find("failure") if c.find("failure") is not None else c.find("error")
            failed.append({"test": name, "message": (bad.get("message") or "")[:3000]})  # the cause, past the assertion's head
        elif c.find("skipped") is not None:
            skipped.append({"test": name, "why": (c.find("skipped").get("message") or "")[:200]})
    return {"counts": {"total": total, "failed": len(failed), "skipped": len(skipped),
                       "passed": total - len(failed) - len(skipped)}, "failed": failed, "skipped": skipped}


def commands(device: str, quick: bool, tmp: Path) -> list:
    small = ["--set", "batch_size=2", "--set", "num_generations=4", "--set", "max_new_tokens=32"] if quick else []
    step, ck = tmp / "step", tmp / "run"
    parts = [
        run("step", [CLI, "step", "--set", f"device={device}", *small, "--out", step], 300),
        run("run", [CLI, "run", "--steps", "3", "--set", f"device={device}", *small, "--set", "heldout_n=2",
                    "--checkpoint-every", "1", "--out", ck], 300),
        run("whatif one-step", [CLI, "whatif", step, "--set", "beta=0.1", "--device", device,
                                "--out", tmp / "whatif1", "--json"], 300),
        run("whatif", [CLI, "whatif", step, "--set", "beta=0.1", "--steps", "2", "--seeds", "1", "--device", device,
                       "--out", tmp / "whatif", "--json"], 300),
        run("diagnose", [CLI, "diagnose", step, "--json"], 120),
    ]
    parts[-1]["note"] = "exit 0: no error-level finding; 1: an error-level finding (the step's own); 2: a failure"
    return parts


def trl_capture(device: str, quick: bool, tmp: Path) -> dict:
    """A TRL run on the machine's device (accelerate picks it), flight recorder on; each captured step's recomputed
    loss against the loss TRL computed and logged."""
    out = tmp / "demo"
    short = ["--steps", "5", "--jump-at", "4"] if quick else []
    res = run("trl-demo", [CLI, "trl-demo", "--out", out, "--device", device, *short], 420)
    res["diagnose"] = run("diagnose trl run", [CLI, "diagnose", out, "--json"], 120)
    steps = []
    for trace in sorted(out.glob("captures/step-*/trace.json")):
        d = json.loads(trace.read_text())
        prov = (d.get("fields", {}).get("setup") or {}).get("fields", {}).get("provenance") or {}
        flags = [f for f in d.get("fields", {}).get("flags", []) if "loss" in str(f)]
        steps.append({"step": trace.parent.name, "trl_logprob_path": prov.get("trl_logprob_path"),
                      "precision": prov.get("precision"), "loss_flags": flags,
                      "loss_check": _loss_check(trace.parent)})
    res["captures"] = steps
    return res


def _loss_check(folder: Path) -> dict:
    """|recomputed − TRL's loss| of one captured step (the record's loss vs the capture's TRL loss)."""
    try:
        from rookworld_debug.grpo.step import StepTrace
        t = StepTrace.load(folder)
        c = t.capture
        return {"trl_loss": c.trl_loss, "recomputed_loss": c.recomputed_loss,
                "abs_diff": c.loss_recompute_diff, "logged_loss": (c.logged_metrics or {}).get("loss")}
    except Exception as err:   # a report, not a gate: say what could not be read
        return {"error": f"{type(err).__name__}: {err}"}


def bench(device: str, quick: bool, tmp: Path) -> dict:
    size = (["--model", "tiny", "-B", "2", "-G", "4", "--max-new-tokens", "16", "--reps", "1", "--warmup", "0"]
            if quick else ["--model", "gpt2-124m", "-B", "8", "-G", "24", "--max-new-tokens", "128", "--reps", "3",
                           "--warmup", "1"])
    res = run("bench", [CLI, "bench", *size, "--variants", "abc", "--device", device, "--engine-reps", "0",
                        "--no-widget", "--heldout-n", "0", "--out", tmp / "bench", "--json-only"], 420)
    found = sorted((tmp / "bench").glob("*.json"))
    if found:
        b = json.loads(found[-1].read_text())
        v = b.get("variants", {})
        res["variants"] = {k: {x: v[k].get(x) for x in ("median_seconds", "min_seconds", "median_phases",
                                                         "peak_gpu_mb", "peak_rss_mb", "errors")} for k in v}
        res["ratios"] = b.get("ratios")
        res["ratios_min"] = b.get("ratios_min")
        res["settings"] = b.get("settings")
    return res


def measure(a, quick: bool, skip: set, order: tuple = PARTS) -> dict:
    """One pass of the check: each part not in `skip`, small (`quick`) or at the debug run's scale, in `order`. The
    JSON is rewritten after every part ("complete": false until the last), so a loan that ends mid-pass keeps the
    parts that finished."""
    t0 = time.perf_counter()
    result = {"schema": "rookworld_debug.gpu_check/1", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "quick": quick, "complete": False, "machine": machine(a.device)}
    with tempfile.TemporaryDirectory(prefix="rookworld-gpu-check-") as d:
        tmp = Path(d)
        for part in (p for p in order if p not in skip):
            result[part] = {"suite": lambda: suite(quick, a.workers, tmp),
                            "commands": lambda: commands(a.device, quick, tmp),
                            "trl": lambda: trl_capture(a.device, quick, tmp),
                            "bench": lambda: bench(a.device, quick, tmp)}[part]()
            result["seconds"] = round(time.perf_counter() - t0, 1)
            write(result, a, quiet=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["complete"] = True
    return result


def write(result: dict, a, quiet: bool = False) -> Path:
    """The pass's JSON, replaced atomically (a kill mid-write leaves the previous version, never half a file)."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # named after the device the parts ran on: a --device cpu pass on a GPU machine is a CPU measurement
    gpu = result["machine"].get("gpu") if a.device.startswith("cuda") else None
    tag = re.sub(r"[^A-Za-z0-9]+", "-", gpu or a.device).strip("-").lower()
    path = out / f"gpu-check-{time.strftime('%Y%m%d')}-{tag}{'-quick' if result['quick'] else ''}.json"
    part = path.with_name(path.name + ".partial")
    part.write_text(json.dumps(result, indent=1, default=str))
    os.replace(part, path)
    if quiet:
        return path
    print(f"[gpu-check] {path} ({result.get('seconds')} s)")
    s = result.get("suite", {}).get("counts")
    if s:
        print(f"[gpu-check] suite: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped")
    r = result.get("bench", {}).get("ratios")
    if r:
        print(f"[gpu-check] bench ratios (median): {r}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="only the quick pass: two test files, small steps, the "
                                                         "tiny bench (a rehearsal, or a short loan)")
    ap.add_argument("--long-only", action="store_true", help="only the long pass (a second call on a machine whose "
                                                             "quick pass already wrote its JSON)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--out", default=str(REPO / "docs" / "bench"))
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: suite, commands, trl, bench")
    a = ap.parse_args()
    skip = {p.strip() for p in a.skip.split(",") if p.strip()}
    # its arguments first, before anything is measured: never a part silently run, nor a traceback at the end
    refusal = (f"--skip {a.skip!r}: unknown parts {sorted(skip - set(PARTS))}; the parts are {', '.join(PARTS)}"
               if skip - set(PARTS) else out_refusal(a.out) or device_refusal(a.device))
    if a.quick and a.long_only:
        refusal = "--quick and --long-only: choose one pass (neither runs both)"
    if a.workers < 1:
        refusal = f"--workers {a.workers}: must be at least 1"
    if refusal:                  # never a JSON that reads like a measurement of a GPU this machine does not have
        print(f"gpu-check: error: {refusal}", file=sys.stderr)
        return 2
    # the quick pass first, its JSON written before the long pass starts: a short loan still yields numbers
    if not a.long_only:
        write(measure(a, True, skip), a)
    if not a.quick:
        # the parts only a GPU can measure first: the suite runs on the CPU cores and the quick pass sampled it
        write(measure(a, False, skip, order=("commands", "trl", "bench", "suite")), a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
