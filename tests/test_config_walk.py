"""A step resolves its objective once: following the configuration through `run_step` (scripts/config_walk.py, the
calls that pass it on) stays within its targets, and no phase looks the family registry up again."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_walk_of_the_config_through_a_step_stays_short():
    r = subprocess.run([sys.executable, "scripts/config_walk.py", "--json"], cwd=ROOT, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["stays"] <= 35 and out["max_visits"] <= 4, {k: out[k] for k in ("stays", "max_visits", "visits")}
    assert out["walk"][0][1].endswith("grpo.step._setup_phase")


def test_no_phase_looks_the_family_up_after_the_setup(tiny_byte_model_dir, fixtures_dir):
    """After the setup resolved the objective, a whole step (and a reused session's next step) asks the registry
    for the loss type's family 0 times."""
    from rookworld_debug.grpo import registry
    from rookworld_debug.grpo.multistep.start import setup
    from rookworld_debug.grpo.step import run_step
    from tinymodels import tiny_step_config
    cfg = tiny_step_config(tiny_byte_model_dir, dataset=str(fixtures_dir / "rook_p_lines.txt"), eval_max_new_tokens=4)
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is registry.family_of.__code__:
            calls.append(frame.f_back.f_code.co_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = setup(cfg)
        sys.setprofile(profile)
        try:
            run_step(cfg, session=s)
            run_step(cfg.replace(seed=cfg.seed + 1), session=s)      # a changed config: resolved once, at its setup
        finally:
            sys.setprofile(None)
    assert len(calls) <= 1, calls
