"""Install like a TRL user. The `[trl]` extra pins the TRL minor the capture reads, and a wheel
works on its own: built from this checkout, installed into a fresh folder (not editable), it renders a
capture with `report --trace` from a folder outside the checkout (the notebooks ship inside the package)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _extra(name: str) -> list[str]:
    import tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]


def test_trl_extra_pins_the_minor_the_capture_reads():
    from rookworld_debug.trl.record import SUPPORTED_TRL

    for extra in ("trl", "dev"):
        (spec,) = [d for d in _extra(extra) if re.match(r"trl\b", d)]
        lo = re.search(r">=\s*(\d+)\.(\d+)", spec)
        hi = re.search(r"<\s*(\d+)\.(\d+)", spec)
        assert lo and hi, f"[{extra}] must pin a TRL minor range, got {spec!r}"
        allowed = {f"{lo[1]}.{m}" for m in range(int(lo[2]), int(hi[2]))} if lo[1] == hi[1] else None
        assert allowed == set(SUPPORTED_TRL), (extra, spec, SUPPORTED_TRL)
    assert {"accelerate", "datasets"} <= {re.split(r"[<>=\[ ]", d)[0] for d in _extra("trl")}


def test_the_package_ships_its_notebooks():
    from rookworld_debug.notebook import notebook_path
    for name in ("01_grpo_step.ipynb", "02_tune_beta_temperature.ipynb", "03_multi_step.ipynb"):
        p = notebook_path(name)
        assert p.is_file() and p.parent.name == "notebooks" and "rookworld_debug" in p.parts, p


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_install_renders_a_capture_outside_the_checkout(tmp_path, fixtures_dir):
    py = sys.executable
    wheels = tmp_path / "wheels"
    subprocess.run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
                   check=True, stdin=subprocess.DEVNULL, timeout=300)
    (wheel,) = wheels.glob("rookworld_debug-*.whl")
    target = tmp_path / "site"
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], check=True,
                   stdin=subprocess.DEVNULL, timeout=300)
    assert (target / "rookworld_debug" / "notebooks" / "01_grpo_step.ipynb").is_file()
    # a saved step from the installed package itself
    import torch
    from rookworld_debug.config import StepConfig
    from rookworld_debug.grpo.step import run_step
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = run_step(StepConfig().replace(reward_mode="dataset", dataset=str(fixtures_dir / "rook_p_lines.txt"),
                                              batch_size=2, num_generations=2, max_new_tokens=12,
                                              eval_max_new_tokens=8, heldout_n=0))
    step = trace.save(tmp_path / "capture" / "step-000001")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    where = subprocess.run([py, "-c", "import rookworld_debug; print(rookworld_debug.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    r = subprocess.run([py, "-m", "rookworld_debug.cli", "report", "--trace", str(step), "--out", str(elsewhere / "rep"),
                        "--no-progress"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert list((elsewhere / "rep").glob("*/*/report.html"))
