"""Parameters with a gradient that the recorded optimizer never steps: every bias and norm weight left out (a
no-weight-decay filter that dropped them) is an error; another set may be a freeze done by leaving modules out of the
optimizer, so a warning; a parameter that moved (another optimizer's) or has no gradient is no finding."""
from __future__ import annotations

import torch

from rookworld_debug.diagnosis.replay.update import untrained_check
from rookworld_debug.grpo.trace.state import RecordedState


def _state(trainable, moved=(), zero=()):
    shapes = {"w1": (4, 3), "b1": (4,), "w2": (2, 4), "ln": (2,)}
    before = {n: torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, (n, s) in enumerate(shapes.items())}
    after = {n: v + (0.1 if n in trainable or n in moved else 0.0) for n, v in before.items()}
    grad = {n: torch.zeros_like(v) if n in zero else torch.ones_like(v) for n, v in before.items()}
    return RecordedState(model_type="gpt2", model_config={}, before=before, after=after, gradient=grad,
                         reference=None, optimizer_state={}, optimizer="AdamW", optimizer_settings={"lr": 1e-3},
                         trainable=tuple(trainable), tokenizer_dir=None)


def test_every_bias_and_norm_left_out_is_an_error_naming_the_filter():
    c = untrained_check(_state(("w1", "w2")))
    assert c.status == "disagree" and c.cause == "parameters_not_in_optimizer"
    assert "no-weight-decay filter" in c.explanation and "b1" in c.explanation


def test_another_set_left_out_is_a_warning_and_moved_or_gradient_free_ones_are_nothing():
    c = untrained_check(_state(("w1", "b1", "ln")))                   # w2 left out: maybe a freeze
    assert c.status == "suspect" and c.cause == "parameters_not_in_optimizer" and "w2" in c.explanation
    assert untrained_check(_state(("w1", "b1", "ln"), moved=("w2",))) is None      # another optimizer steps it
    assert untrained_check(_state(("w1", "b1", "ln"), zero=("w2",))) is None       # frozen: no gradient
    assert untrained_check(_state(("w1", "b1", "w2", "ln"))) is None
