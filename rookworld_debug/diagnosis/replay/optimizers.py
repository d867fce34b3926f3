"""The recorded optimizer's step through torch's own kernels, without building a `torch.optim` optimizer: its
constructor imports torch._dynamo (1.2 s on a 2-core CPU, and about 0.7 s more when the process exits), more than
the replay's forwards take.

`RecordedOptimizer` holds what torch's Adam, AdamW and SGD hold — parameter groups (torch's defaults under the
recorded settings, refused where torch's constructor refuses them) and per-parameter state — and its `step()` calls
`torch.optim.adam.adam` / `torch.optim.sgd.sgd` as `Adam.step` / `SGD.step` call them, state created as their
`_init_group` creates it. tests/test_replay_optimizer.py holds it bit for bit against the classes (each kind, the
recorded settings, fresh and loaded state, several groups, bf16 weights).
"""
from __future__ import annotations

import inspect
from collections import defaultdict

import torch
from torch.optim.adam import adam as _adam_step
from torch.optim.sgd import sgd as _sgd_step

CLASSES = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}


def defaults(kind: str) -> dict:
    """The group settings torch's constructor of `kind` gives when none is passed (read from its signature, so they
    follow the installed torch); AdamW's decoupled weight decay, which it sets itself."""
    sig = inspect.signature(CLASSES[kind].__init__)
    out = {k: p.default for k, p in sig.parameters.items()
           if k not in ("self", "params") and p.default is not inspect.Parameter.empty}
    if kind in ("Adam", "AdamW"):
        out["decoupled_weight_decay"] = kind == "AdamW"
    return out


def check(kind: str, g: dict) -> None:
    """ValueError where torch's constructor of `kind` refuses these settings (its own checks, its words)."""
    bad = [(not 0.0 <= g["lr"], f"Invalid learning rate: {g['lr']}"),
           (not 0.0 <= g["weight_decay"], f"Invalid weight_decay value: {g['weight_decay']}")]
    if kind == "SGD":
        bad += [(not 0.0 <= g["momentum"], f"Invalid momentum value: {g['momentum']}"),
                (g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0),
                 "Nesterov momentum requires a momentum and zero dampening")]
    else:
        bad += [(not 0.0 <= g["eps"], f"Invalid epsilon value: {g['eps']}"),
                (not 0.0 <= g["betas"][0] < 1.0, f"Invalid beta parameter at index 0: {g['betas'][0]}"),
                (not 0.0 <= g["betas"][1] < 1.0, f"Invalid beta parameter at index 1: {g['betas'][1]}")]
    for refused, message in bad:
        if refused:
            raise ValueError(message)


class RecordedOptimizer:
    """`param_groups` ({"params": [...], settings}) and `state` ({param: {key: tensor}}) as torch's optimizer of
    `kind` holds them; `step()` is its step."""

    def __init__(self, kind: str, param_groups: list, **settings):
        base = {**defaults(kind), **settings}
        self.kind, self.state = kind, defaultdict(dict)
        self.param_groups = [{**base, **g, "params": list(g["params"])} for g in param_groups]
        for g in self.param_groups:
            check(kind, g)

    def load(self, per_param: dict) -> None:
        """Recorded state ({param: {key: tensor}}), cast as torch's load_state_dict casts it: the step count a 0-dim
        float, every moment to its parameter's dtype."""
        for p, st in per_param.items():
            self.state[p] = {k: v.clone().float().reshape(()) if k == "step" else
                             v.clone().to(dtype=p.dtype, device=p.device) for k, v in st.items()}

    @torch.no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            (self._sgd if self.kind == "SGD" else self._adam)(g)

    def _adam(self, g: dict) -> None:
        params = [p for p in g["params"] if p.grad is not None]
        for p in params:
            st = self.state[p]
            if not st:                                   # Adam._init_group, neither fused nor capturable
                st["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if g["amsgrad"]:
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        s = [self.state[p] for p in params]
        _adam_step(params, [p.grad for p in params], [x["exp_avg"] for x in s], [x["exp_avg_sq"] for x in s],
                   [x["max_exp_avg_sq"] for x in s] if g["amsgrad"] else [], [x["step"] for x in s],
                   amsgrad=g["amsgrad"], has_complex=any(torch.is_complex(p) for p in params),
                   beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"], weight_decay=g["weight_decay"],
                   eps=g["eps"], maximize=g["maximize"], foreach=g["foreach"], capturable=g["capturable"],
                   differentiable=g["differentiable"], fused=g["fused"], grad_scale=None, found_inf=None,
                   decoupled_weight_decay=g["decoupled_weight_decay"])

    def _sgd(self, g: dict) -> None:
        params = [p for p in g["params"] if p.grad is not None]
        buffers = [self.state[p].get("momentum_buffer") for p in params] if g["momentum"] != 0 else []
        _sgd_step(params, [p.grad for p in params], buffers, weight_decay=g["weight_decay"], momentum=g["momentum"],
                  lr=g["lr"], dampening=g["dampening"], nesterov=g["nesterov"], maximize=g["maximize"],
                  has_sparse_grad=any(p.grad.is_sparse for p in params), foreach=g["foreach"], fused=g["fused"],
                  grad_scale=None, found_inf=None)
        if g["momentum"] != 0:
            for p, b in zip(params, buffers):
                self.state[p]["momentum_buffer"] = b


def _scalar_dtype():
    """torch's own choice for a step count (optimizer._get_scalar_dtype, not fused)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
