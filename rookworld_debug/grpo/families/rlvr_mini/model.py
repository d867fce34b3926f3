"""The rookworld-rlvr "mini"'s own GPT-2 forward as a function of a state dict, and its position ids.

Why here: the mini's padding conventions decide which log-probs it trains. Its model (a) re-indexes each
row's real tokens to positions 0..n−1 from the first unmasked index on the first (uncached) forward with a
mask, pads at position 0; (b) excludes padded keys (−1e9 before the softmax) and zeroes the attention output
of padded queries; (c) uses the exact erf GELU, LayerNorm ε 1e-5 and an LM head tied to `wte`; and (d) on
KV-cached steps uses positions past_length, past_length + 1, … for EVERY row — a left-padded row's positions
jump by its pad count after the first generated token (`mini_position_ids(..., past_length=P)`).

Shape legend: N rows, S tokens, D model width, H heads, V vocab. Weights as the mini names them
(`wte.weight`, `h.0.attn.c_attn.weight` in nn.Linear's [out, in] layout, c_attn = [q | k | v]).
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import torch
import torch.nn.functional as F

PAD_FILL = -1e9


def mini_position_ids(attention_mask: Optional[torch.Tensor], seq_len: int, past_length: int = 0) -> torch.Tensor:
    """The mini's position ids (N, S): uncached with a mask → real tokens 0..n−1, pads 0; cached or without a
    mask → arange(past_length, past_length + S) for every row (the left-padding shift after the cache)."""
    if attention_mask is not None and past_length == 0:
        pos = attention_mask.long().cumsum(-1) - 1                                      # (N, S)
        return pos.clamp(min=0).masked_fill(attention_mask == 0, 0)
    n = 1 if attention_mask is None else attention_mask.shape[0]
    device = None if attention_mask is None else attention_mask.device
    return torch.arange(past_length, past_length + seq_len, device=device).unsqueeze(0).expand(n, seq_len)


def _attention(x, w: Mapping[str, torch.Tensor], prefix: str, n_head: int, key_mask) -> torch.Tensor:
    n, s, d = x.shape
    qkv = F.linear(x, w[f"{prefix}.c_attn.weight"], w[f"{prefix}.c_attn.bias"])         # (N, S, 3D)
    q, k, v = qkv.split(d, dim=-1)
    hd = d // n_head
    q, k, v = (t.view(n, s, n_head, hd).transpose(1, 2) for t in (q, k, v))            # (N, H, S, hd)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)                                     # (N, H, S, S)
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
    att = att.masked_fill(~causal, float("-inf"))
    if key_mask is not None:
        att = att.masked_fill(key_mask[:, None, None, :] == 0, float("-inf"))
    att = att.masked_fill(torch.isinf(att) & (att < 0), PAD_FILL)
    y = torch.softmax(att, dim=-1) @ v                                                  # (N, H, S, hd)
    if key_mask is not None:
        y = y * key_mask[:, None, :, None].to(y.dtype)                                  # padded queries → 0
    y = y.transpose(1, 2).reshape(n, s, d)
    return F.linear(y, w[f"{prefix}.c_proj.weight"], w[f"{prefix}.c_proj.bias"])


def mini_forward(weights: Mapping[str, torch.Tensor], input_ids: torch.Tensor, *, n_layer: int, n_head: int,
                 attention_mask: Optional[torch.Tensor] = None, eps: float = 1e-5,
                 position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Logits (N, S, V) of the mini's GPT2Model for `input_ids` (N, S) (uncached forward)."""
    w = weights
    n, s = input_ids.shape
    pos = mini_position_ids(attention_mask, s) if position_ids is None else position_ids
    x = w["wte.weight"][input_ids] + w["wpe.weight"][pos]                               # (N, S, D)
    d = x.shape[-1]
    for i in range(n_layer):
        p = f"h.{i}"
        h = F.layer_norm(x, (d,), w[f"{p}.ln_1.weight"], w[f"{p}.ln_1.bias"], eps)
        x = x + _attention(h, w, f"{p}.attn", n_head, attention_mask)
        h = F.layer_norm(x, (d,), w[f"{p}.ln_2.weight"], w[f"{p}.ln_2.bias"], eps)
        h = F.gelu(F.linear(h, w[f"{p}.mlp.c_fc.weight"], w[f"{p}.mlp.c_fc.bias"]))
        x = x + F.linear(h, w[f"{p}.mlp.c_proj.weight"], w[f"{p}.mlp.c_proj.bias"])
    x = F.layer_norm(x, (d,), w["ln_f.weight"], w["ln_f.bias"], eps)
    return F.linear(x, w["wte.weight"])
