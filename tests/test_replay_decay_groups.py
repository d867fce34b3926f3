"""The optimizer's weight-decay groups read from the recorded state: biases spared and norm weights decayed is a
no-decay filter that missed the norms; both spared, both decayed, or one group is no finding."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from rookworld_debug.diagnosis.replay.update import decay_groups_check

SHAPES = {"h.0.attn.c_attn.weight": (8, 24), "h.0.attn.c_attn.bias": (24,), "h.0.ln_1.weight": (8,),
          "h.0.ln_1.bias": (8,), "ln_f.weight": (8,), "ln_f.bias": (8,), "wte.weight": (50, 8)}


def _state(spared: list, wd: float = 0.1):
    """The recorded optimizer: its first group decays everything except `spared`, in a later group at 0."""
    before = {n: torch.zeros(s) for n, s in SHAPES.items()}
    later = ((tuple(spared), {"weight_decay": 0.0}),) if spared else ()
    return SimpleNamespace(before=before, trainable=tuple(SHAPES), optimizer="AdamW",
                           optimizer_settings={"lr": 1e-3, "weight_decay": wd}, optimizer_groups=later)


def test_biases_spared_and_norms_decayed_is_named():
    c = decay_groups_check(_state([n for n in SHAPES if n.endswith("bias")]))
    assert c is not None and c.status == "disagree" and c.cause == "weight_decay_on_norm_weights"
    assert "ln_1.weight" in c.explanation and "ln_f.weight" in c.explanation and "0.1" in c.explanation


def test_the_usual_groupings_are_no_finding():
    vectors = [n for n, s in SHAPES.items() if len(s) == 1]
    assert decay_groups_check(_state(vectors)) is None              # biases and norms spared (nanoGPT, HF Trainer)
    assert decay_groups_check(_state([])) is None                   # one group: every parameter decayed alike
    assert decay_groups_check(_state([n for n in SHAPES if n.endswith("bias")], wd=0.0)) is None   # no decay at all
