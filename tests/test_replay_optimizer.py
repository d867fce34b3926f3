"""The replay's optimizer step (torch's functional kernels, no torch.optim object) against torch's own Adam, AdamW
and SGD, bit for bit; the settings torch refuses are refused; a replay builds no torch.optim object."""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch

from rookworld_debug.diagnosis.replay.optimizers import CLASSES, RecordedOptimizer
from rookworld_debug.diagnosis.replay.update import load_recorded_state, recorded_optimizer

SETTINGS = {
    "AdamW": [dict(), dict(lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1), dict(amsgrad=True),
              dict(maximize=True, weight_decay=0.0)],
    "Adam": [dict(), dict(lr=1e-2, weight_decay=0.01), dict(amsgrad=True, maximize=True)],
    "SGD": [dict(), dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True),
            dict(lr=0.05, momentum=0.5, dampening=0.1, weight_decay=1e-3, maximize=True)],
}
CASES = [(k, s) for k, ss in SETTINGS.items() for s in ss]


def _params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (7,), (2, 4, 3)]
    ps = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(dtype)
    return ps


def _state(kind, settings, params, seed=1):
    """Recorded state of a few earlier steps: moments of each parameter's shape, a step count."""
    g = torch.Generator().manual_seed(seed)
    if kind == "SGD":
        return {f"p{i}": {"momentum_buffer": torch.randn(p.shape, generator=g)}
                for i, p in enumerate(params)} if settings.get("momentum") else {}
    keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if settings.get("amsgrad") else ())
    return {f"p{i}": {"step": torch.tensor(3.0), **{k: torch.randn(p.shape, generator=g).abs() for k in keys}}
            for i, p in enumerate(params)}


@pytest.mark.parametrize("kind,settings", CASES, ids=[f"{k}-{i}" for k, ss in SETTINGS.items() for i in range(len(ss))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("loaded", [False, True], ids=["fresh", "loaded"])
def test_the_replay_step_is_torchs_step_bit_for_bit(kind, settings, dtype, loaded):
    theirs, ours = _params(dtype), _params(dtype)
    names = [f"p{i}" for i in range(len(ours))]
    state = _state(kind, settings, ours) if loaded else None
    # two groups: the last parameter with its own rate, as a recorded optimizer's later group
    groups = ((("p2",), {"lr": 0.02}),)
    ref = CLASSES[kind]([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.02}], **settings)
    if state:
        load_recorded_state(ref, names, state)
    opt = recorded_optimizer(kind, ours, names, {k: list(v) if isinstance(v, tuple) else v
                                                 for k, v in settings.items()}, state, groups)
    for _ in range(2):                                  # a second step reads the state the first one left
        ref.step()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours))
    for a, b in zip(theirs, ours):
        assert ref.state[a].keys() == opt.state[b].keys()
        assert all(torch.equal(ref.state[a][k], opt.state[b][k]) for k in ref.state[a])


BAD = [("AdamW", dict(lr=-1.0)), ("AdamW", dict(betas=(1.0, 0.9))), ("Adam", dict(betas=(0.9, -0.1))),
       ("Adam", dict(eps=-1e-8)), ("AdamW", dict(weight_decay=-0.1)), ("Adam", dict(lr=float("nan"))),
       ("SGD", dict(lr=-0.1)), ("SGD", dict(momentum=-0.5)), ("SGD", dict(nesterov=True)),
       ("SGD", dict(nesterov=True, momentum=0.9, dampening=0.1)), ("SGD", dict(weight_decay=-1.0))]


@pytest.mark.parametrize("kind,settings", BAD, ids=[f"{k}-{s}" for k, s in BAD])
def test_settings_torch_refuses_are_refused_with_its_words(kind, settings):
    with pytest.raises(ValueError) as theirs:
        CLASSES[kind](_params(torch.float32), **settings)
    with pytest.raises(ValueError) as ours:
        RecordedOptimizer(kind, [{"params": _params(torch.float32)}], **settings)
    assert str(ours.value) == str(theirs.value)


def test_settings_torch_takes_are_taken():
    for kind, (lr, wd) in itertools.product(CLASSES, [(0.0, 0.0), (1e-3, 0.0), (0.0, 1e-2)]):
        CLASSES[kind](_params(torch.float32), lr=lr, weight_decay=wd)
        RecordedOptimizer(kind, [{"params": _params(torch.float32)}], lr=lr, weight_decay=wd)


def test_a_replay_of_the_update_builds_no_torch_optimizer():
    """torch.optim objects import torch._dynamo on construction (seconds of a diagnosis); the update re-run never
    builds one."""
    code = ("import sys, torch; from rookworld_debug.diagnosis.replay.update import rerun_update\n"
            "b = {'w': torch.randn(4, 3)}; g = {'w': torch.randn(4, 3)}\n"
            "after = rerun_update(b, g, ['w'], 'AdamW', {'lr': 1e-3}, None, 1.0)\n"
            "assert not torch.equal(after['w'], b['w'])\n"
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]
