"""Which numerical path made a low-precision loop's log-probs: the forward under the declared autocast with the
log-softmax upcast to fp32 (TRL's and this package's path), or the log-softmax taken of the low-precision logits.

Both agree with the fp32 recompute inside the declared precision's tolerance, so a tolerance cannot tell them apart;
their distances to the recorded values can. The replay computes the logits once under the declared autocast and
both log-softmaxes from them; the path the recorded values lie much nearer to (PATH_RATIO × nearer, on the mean
absolute distance over the in-loss tokens) is the one the loop took. A loop that took the upcast path is never
named: its values lie nearer to it than to the other.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .records import DISAGREE, PhaseCheck

PATH_RATIO = 4.0          # a distance this many times smaller is not the noise of the matmuls' order
LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@torch.no_grad()
def path_distances(model, r, dtype: str, rows_per_forward: int = 16) -> Optional[tuple]:
    """((N, T) log-probs upcast, {low path: (N, T) log-probs}) of the sampled ids, all from the logits computed
    under `dtype` autocast; None for a precision without an autocast here. The low paths: the log-softmax taken in
    the low precision (low-precision weights, no autocast), and the logits divided by T in the low precision before
    a log-softmax that autocast itself runs in fp32 (a loop that never upcasts, under autocast)."""
    low = LOW.get(dtype)
    dev = next(model.parameters()).device
    if low is None or (dev.type == "cpu" and low is torch.float16 and not _cpu_fp16()):
        return None
    up, down, divided = [], [], []
    for s in range(0, r.completion_ids.shape[0], rows_per_forward):
        rows = slice(s, s + rows_per_forward)
        ids, mask = r.completion_ids[rows].to(dev), r.completion_mask[rows].long().to(dev)
        full = torch.cat([r.prompt_ids[rows].to(dev), ids], 1)
        attn = torch.cat([r.prompt_mask[rows].long().to(dev), mask], 1)
        with torch.autocast(dev.type, dtype=low):
            logits = model(input_ids=full, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
        p, t = r.prompt_ids.shape[1], ids.shape[1]
        at = logits[:, p - 1:p + t - 1]                                                  # (n, T, V)
        temps = r.temperatures[rows].to(dev)[:, None, None]
        pick = (lambda x: x.gather(-1, ids[..., None]).squeeze(-1).float() * mask)
        up.append(pick((at.float() / temps.float()).log_softmax(-1)).cpu())
        # a low-precision tensor ÷ a python float computes in fp32 and rounds the quotient: so does this
        scaled = (at.float() / temps.float()).to(low)                                    # (n, T, V)
        down.append(pick(scaled.log_softmax(-1)).cpu())
        divided.append(pick(scaled.float().log_softmax(-1)).cpu())
    return torch.cat(up), {f"log_softmax in {dtype}": torch.cat(down),
                           f"logits ÷ T in {dtype}, then autocast's fp32 log_softmax": torch.cat(divided)}


def _cpu_fp16() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        return True
    except RuntimeError:
        return False


def logsoftmax_path(check: PhaseCheck, rec: torch.Tensor, mask: torch.Tensor, model, r, dtype: str) -> PhaseCheck:
    """`check` named `logsoftmax_not_upcast` when the recorded log-probs lie PATH_RATIO × nearer the
    low-precision log-softmax than the upcast one; else `check` unchanged."""
    if check.cause or dtype not in LOW:
        return check
    paths = path_distances(model, r, dtype)
    m = mask.bool()
    if paths is None or not bool(m.any()):
        return check
    dist = (lambda x: float((rec.float() - x).abs()[m].mean()))
    d_up = dist(paths[0])
    path, d_low = min(((name, dist(x)) for name, x in paths[1].items()), key=lambda kv: kv[1])
    if not d_low * PATH_RATIO < d_up:
        return check
    why = (f"the loss forward did not upcast the {dtype} logits before the log-softmax ({path}): the recorded "
           f"log-probs lie {d_up / max(d_low, 1e-12):.3g}× nearer that path (mean |Δ| {d_low:.3g}) than the upcast "
           f"one (logits.float() before ÷ T and log_softmax, mean |Δ| {d_up:.3g}), over {int(m.sum())} in-loss "
           f"tokens: every log-prob and ratio carries {dtype} rounding. Upcast the logits first")
    return dataclasses.replace(check, status=DISAGREE, cause="logsoftmax_not_upcast", explanation=why,
                               fit={"kind": "precision_path", "params": {"path": path, "mean_abs_to_low": d_low,
                                                                         "mean_abs_to_upcast": d_up},
                                    "residual": d_low, "sentence": why})
