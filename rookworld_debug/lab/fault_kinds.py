"""The fault benchmark's shared vocabulary: what a fault is (`Fault`), each case's seeds (SEEDS) and base settings.
Its own module so that the benchmark and its held-out fault types both import it, and neither the other."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

SEEDS = (0, 1, 2)
BASE = dict(task="A", batch_size=4, num_generations=4, max_new_tokens=80, eval_max_new_tokens=80, heldout_n=0,
            reward_mode="dataset", lr=1e-5, beta=0.1, device="cpu", top_k_alternatives=5)
P_TASK = {"task": "P", "max_new_tokens": 160, "eval_max_new_tokens": 160}


@dataclass(frozen=True)
class Fault:
    name: str
    accept: frozenset                     # finding codes that name this fault (equivalent causes)
    how: str                              # how it is injected, in words
    config: dict = field(default_factory=dict)     # StepConfig changes that ARE the fault
    base: dict = field(default_factory=dict)       # case settings shared with its fault-free twin
    patch: Optional[Callable] = None      # (setup) -> context manager applied around run_step
    rewards: Optional[Callable] = None    # seed -> (reward_funcs, reward_weights)
