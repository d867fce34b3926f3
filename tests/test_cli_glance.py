"""The CLI reads at a glance: `step --help` lists every StepConfig key with its default and one line of
help generated from the dataclass metadata, and says where output goes; the step log names completions
p0·g1 like the notebooks, explains B=label/B=SF#1, prints no raw engine dict and no '-0.000000', and shows
the clip formula only for loss types that clip. Run as a user runs them: subprocess, stdin closed, deadline."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rookworld_debug.config import StepConfig

REPO = Path(__file__).resolve().parents[1]


def _run(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rookworld_debug.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("command", ["step", "run"])
def test_help_lists_every_config_key_with_default_and_help(command):
    out = _run([command, "--help"])
    assert out.returncode == 0, out.stderr
    text = out.stdout
    lines = text.splitlines()
    for name, entry in StepConfig.glossary().items():
        hit = [ln for ln in lines if ln.strip().startswith(f"{name}={entry['default']!r} ")]
        assert len(hit) == 1, f"{name} (default {entry['default']!r}) not listed once in `{command} --help`"
        assert len(hit[0].split(None, 1)[1].strip()) > 10, f"{name}: no help text"
        assert entry["help"].split()[0] in hit[0]          # the line is generated from the field's metadata
    assert max(len(ln) for ln in lines) <= 130
    if command == "step":
        assert "trace.json" in text and "stdout" in text and "exit code 2" in text


@pytest.fixture(scope="module")
def manual_log():
    """One real step (tiny model, real Stockfish) with loss_type=manual, its log as the CLI prints it."""
    from rookworld_debug.grpo.step import run_step
    from rookworld_debug.steplog import format_step_log
    torch.set_num_threads(1)
    trace = run_step(StepConfig(batch_size=2, num_generations=2, max_new_tokens=16, eval_max_new_tokens=16,
                                heldout_n=0, engine_depth=4, loss_type="manual"))
    return trace, format_step_log(trace)


def test_step_log_names_explains_and_formats(manual_log):
    trace, log = manual_log
    for i in range(4):
        assert f"p{i // 2}·g{i % 2} " in log
    assert "[0.1]" not in log and "[1] Train_LP" not in log
    assert "B=label:Y/n = " in log and "B=SF#1:Y/n = " in log
    assert "{'calls'" not in log and "'seconds'" not in log
    assert "engine (Stockfish, this reward phase): " in log or "engine: not used" in log
    assert "-0.000000" not in log and "0.000000" not in log
    pg = [ln for ln in log.splitlines() if ln.strip().startswith("PG:")]
    assert pg and "clip" not in pg[0].replace("no clip", "") and "clip_ratio" not in log     # manual: no clipping
    assert "(greedy, this batch, before the update)" in log and "REWARDS (sampled rollout" in log


def test_small_numbers_use_scientific_notation():
    from rookworld_debug.steplog import _num
    assert _num(-0.0) == "0" and _num(0.0, signed=True) == "0"
    assert _num(-2.6e-10, signed=True) == "-2.600e-10" and _num(0.1234567) == "0.1235"
    assert _num(1e-4, "nats/token") == "1.000e-04 nats/token" and _num(float("nan")) == "nan"


def test_dapo_log_keeps_the_clip_formula(manual_log):
    from rookworld_debug.grpo.step import loss_for
    trace, _ = manual_log
    lo = loss_for(trace.rollout, trace.advantages, trace.config.replace(loss_type="dapo"))
    assert "clip(r, 0.8, 1.2)" in lo.definition.split("; L = ")[0]
