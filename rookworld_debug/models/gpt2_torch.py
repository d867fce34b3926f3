"""GPT-2 in plain torch: op for op the forward of transformers' GPT2LMHeadModel with its default SDPA attention,
with the same parameter names, so a replay rebuilds a recorded model without importing transformers (about 3 s of
a diagnosis that should take under 5 s on a 2-core machine). tests/test_gpt2_torch.py holds the two bit for bit:
fp32 and bf16, left-padded rows, a KV cache grown in two forwards and re-indexed, gradients, and dropout draws in
train mode.

It computes what a replay asks of a model — the LM and its body (`base_model`) with an attention mask, position ids
and a KV cache (`KVCache`, or any cache with transformers' `update` / `get_seq_length`) — for the configurations
`supports` accepts; any other (another activation, cross-attention, attention options of the eager path only) is
built with transformers by the caller.

Shape legend: n rows, q query tokens of this forward, k = past + q key tokens, H heads, D head width, d = H·D.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F


def gelu_new(x):
    """transformers' NewGELUActivation (GPT-2's own), op for op."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS = {"gelu_new": gelu_new,                                         # transformers' ACT2FN, these names
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "gelu": F.gelu, "relu": F.relu}
SETTINGS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True,
            "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "use_cache": True}   # GPT2Config's defaults


def supports(config: dict) -> str:
    """Why `config` (GPT2Config keys) is not computed here exactly as transformers computes it, else ""."""
    act = config.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        return f"activation_function {act!r}"
    if config.get("add_cross_attention"):
        return "cross-attention"
    return ""


@dataclass(frozen=True)
class GPT2Settings:
    """The config fields the forward reads (transformers' names, and the aliases callers ask for)."""
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: Optional[int]
    activation_function: str
    layer_norm_epsilon: float
    scale_attn_weights: bool
    scale_attn_by_inverse_layer_idx: bool
    tie_word_embeddings: bool
    resid_pdrop: float
    embd_pdrop: float
    attn_pdrop: float
    use_cache: bool = True
    model_type: str = "gpt2"
    _attn_implementation: str = "sdpa"

    @classmethod
    def of(cls, config: dict) -> "GPT2Settings":
        """A field the config leaves out or sets to None takes transformers' default (n_inner's is None)."""
        return cls(**{k: v if config.get(k) is None else config[k] for k, v in SETTINGS.items()})

    hidden_size = property(lambda self: self.n_embd)
    num_hidden_layers = property(lambda self: self.n_layer)
    num_attention_heads = property(lambda self: self.n_head)
    max_position_embeddings = property(lambda self: self.n_positions)


@dataclass(frozen=True)
class BodyOutput:
    last_hidden_state: torch.Tensor     # (n, q, d)
    cache: Optional[KVCache]


@dataclass(frozen=True)
class LMOutput:
    logits: torch.Tensor                # (n, q, V)
    cache: Optional[KVCache]


class Conv1D(nn.Module):
    """transformers' Conv1D: a linear layer with its weight stored (in, out), applied with one addmm."""

    def __init__(self, n_out: int, n_in: int):
        super().__init__()
        self.nf = n_out
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(x.size()[:-1] + (self.nf,))


class KVCache:
    """The keys and values of earlier tokens, per layer, as transformers' DynamicCache keeps them (concatenated)."""

    def __init__(self, layers: int):
        self.keys: list = [None] * layers
        self.values: list = [None] * layers

    def update(self, key, value, layer: int, *args, **kwargs):                   # (n, H, q, D) each
        if self.keys[layer] is not None:
            key, value = torch.cat([self.keys[layer], key], -2), torch.cat([self.values[layer], value], -2)
        self.keys[layer], self.values[layer] = key, value
        return key, value                                                         # (n, H, k, D) each

    def get_seq_length(self, layer: int = 0) -> int:
        return 0 if self.keys[layer] is None else self.keys[layer].shape[-2]

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        for i, k in enumerate(self.keys):
            if k is not None:
                self.keys[i], self.values[i] = k[rows, ...], self.values[i][rows, ...]


def causal_mask(attention_mask, rows: int, q: int, past: int, device) -> Optional[torch.Tensor]:
    """transformers' `sdpa_mask` for a causal LM: None where SDPA's own is_causal (or no mask) gives the same
    attention, else (n, 1, q, k) booleans: key j ≤ query position and not padding."""
    k = past + q
    pad = None if attention_mask is None else attention_mask.to(device=device, dtype=torch.bool).view(rows, -1)
    if pad is not None and pad.shape[-1] < k:
        pad = F.pad(pad, (0, k - pad.shape[-1]))
    seen = None if pad is None else pad[:, :k]
    if (q == 1 or k == q) and (seen is None or bool(seen.all())):
        return None
    if past == 0 and (seen is None or bool(seen[:, :q].all()) and bool((~seen[:, q:]).all())):
        return None
    q_at = (torch.arange(q, device=device) + past)[None, None, :, None]
    kv_at = torch.arange(k, device=device)[None, None, None, :]
    mask = torch.ones((), dtype=torch.bool, device=device) & (kv_at <= q_at)
    if pad is not None:
        mask = mask & pad[torch.arange(rows, device=device)[:, None, None, None], kv_at]
    return mask.expand(rows, -1, q, k)


class Attention(nn.Module):
    def __init__(self, s: GPT2Settings, layer: int):
        super().__init__()
        self.layer, self.heads, self.width = layer, s.n_head, s.n_embd // s.n_head
        self.scaling = (self.width ** -0.5 if s.scale_attn_weights else 1.0) / \
            (float(layer + 1) if s.scale_attn_by_inverse_layer_idx else 1.0)
        self.c_attn = Conv1D(3 * s.n_embd, s.n_embd)
        self.c_proj = Conv1D(s.n_embd, s.n_embd)
        self.attn_dropout = nn.Dropout(s.attn_pdrop)
        self.resid_dropout = nn.Dropout(s.resid_pdrop)

    def forward(self, x, mask, cache):                                            # (n, q, d)
        query, key, value = self.c_attn(x).split(x.shape[-1], dim=2)
        shape = (*x.shape[:-1], -1, self.width)
        query, key, value = (t.view(shape).transpose(1, 2) for t in (query, key, value))   # (n, H, q, D)
        if cache is not None:
            key, value = cache.update(key, value, self.layer)                     # (n, H, k, D)
        q = query.shape[2]
        causal = q > 1 and mask is None
        if causal and key.shape[2] > q:
            key, value = key[:, :, :q], value[:, :, :q]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=self.scaling,
                                             dropout_p=self.attn_dropout.p if self.training else 0.0,
                                             is_causal=causal)                    # (n, H, q, D)
        out = out.reshape(out.shape[0], -1, q, value.shape[-1]).transpose(1, 2).contiguous()
        out = out.reshape(*out.shape[:-2], -1).contiguous()                       # (n, q, d)
        return self.resid_dropout(self.c_proj(out))


class MLP(nn.Module):
    def __init__(self, s: GPT2Settings):
        super().__init__()
        inner = s.n_inner if s.n_inner is not None else 4 * s.n_embd
        self.c_fc, self.c_proj = Conv1D(inner, s.n_embd), Conv1D(s.n_embd, inner)
        self.act = ACTIVATIONS[s.activation_function]
        self.dropout = nn.Dropout(s.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, s: GPT2Settings, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.n_embd, eps=s.layer_norm_epsilon)
        self.attn = Attention(s, layer)
        self.ln_2 = nn.LayerNorm(s.n_embd, eps=s.layer_norm_epsilon)
        self.mlp = MLP(s)

    def forward(self, x, mask, cache):
        x = self.attn(self.ln_1(x), mask, cache) + x
        return x + self.mlp(self.ln_2(x))


class GPT2Body(nn.Module):
    """transformers' GPT2Model: embeddings, blocks, final layer norm. Returns `.last_hidden_state` (n, q, d) and
    `.cache`."""

    def __init__(self, s: GPT2Settings):
        super().__init__()
        self.config = s
        # uninitialised (`_weight`): `build` assigns the recorded weights; drawing inits costs more than the forward
        self.wte = nn.Embedding(s.vocab_size, s.n_embd, _weight=torch.empty(s.vocab_size, s.n_embd))
        self.wpe = nn.Embedding(s.n_positions, s.n_embd, _weight=torch.empty(s.n_positions, s.n_embd))
        self.drop = nn.Dropout(s.embd_pdrop)
        self.h = nn.ModuleList([Block(s, i) for i in range(s.n_layer)])
        self.ln_f = nn.LayerNorm(s.n_embd, eps=s.layer_norm_epsilon)

    def get_input_embeddings(self):
        return self.wte

    def forward(self, input_ids=None, cache=None, attention_mask=None, position_ids=None, use_cache=None,
                past_key_values=None, **unused):
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = KVCache(len(self.h))
        rows, q = input_ids.shape
        x = self.wte(input_ids)                                                    # (n, q, d)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(q, device=x.device) + past).unsqueeze(0)
        x = self.drop(x + self.wpe(position_ids).to(x.device))
        # transformers makes a cache whenever use_cache (its config's by default) and reads position ids that do not
        # rise by one as packed sequences only without a mask and without a cache
        caching = use_cache if use_cache is not None else self.config.use_cache
        packed = packed_mask(position_ids, rows) if attention_mask is None and cache is None and not caching else None
        mask = packed if packed is not None else causal_mask(attention_mask, rows, q, past, x.device)
        for block in self.h:
            x = block(x, mask, cache)
        return BodyOutput(last_hidden_state=self.ln_f(x), cache=cache if use_cache else None)


def packed_mask(position_ids, rows: int) -> Optional[torch.Tensor]:
    """transformers' mask for position ids that do not rise by one along a row when no attention mask is given (it
    reads them as packed sequences: `find_packed_sequence_indices`): (n, 1, q, q) booleans, a query attends to the
    keys of its own segment at positions ≤ its own; None where every row is one sequence."""
    pos = position_ids.expand(rows, -1)                                                    # (n, q)
    seg = (torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1).cumsum(-1)                # (n, q)
    if not bool((seg[:, -1] != 0).any()):
        return None
    same = seg[:, :, None] == seg[:, None, :]                                              # (n, q, k)
    return (same & (pos[:, None, :] <= pos[:, :, None]))[:, None]


class Head(nn.Module):
    """transformers' LM head, nn.Linear without bias: F.linear(x, W) (uninitialised until `build` assigns W)."""

    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, width))

    def forward(self, x):
        return F.linear(x, self.weight)


class GPT2LM(nn.Module):
    """transformers' GPT2LMHeadModel: the body and an LM head tied to the input embeddings (unless the config
    unties them). `model(input_ids, ...)` returns `.logits` (n, q, V) and `.cache`."""

    def __init__(self, s: GPT2Settings, source: Optional[dict] = None):
        super().__init__()
        self.config, self.source = s, dict(source or {})       # source: the config it was built from
        self.transformer = GPT2Body(s)
        self.lm_head = Head(s.vocab_size, s.n_embd)
        if s.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    base_model = property(lambda self: self.transformer)

    def get_input_embeddings(self):
        return self.transformer.wte

    def get_output_embeddings(self):
        return self.lm_head

    def new_cache(self) -> KVCache:
        return KVCache(self.config.n_layer)

    def save_pretrained(self, folder) -> None:
        """A folder transformers loads as this model: config.json (the config it was built from) and
        model.safetensors (the tied head left out, as transformers saves it)."""
        from safetensors.torch import save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {**self.source, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                  "dtype": str(self.lm_head.weight.dtype).removeprefix("torch.")}
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        tied = self.config.tie_word_embeddings
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()
                   if not (tied and k == "lm_head.weight")}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})

    def forward(self, input_ids=None, cache=None, attention_mask=None, position_ids=None, use_cache=None,
                logits_to_keep: int = 0, past_key_values=None, **unused):
        out = self.transformer(input_ids, cache=cache if cache is not None else past_key_values,
                               attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache)
        hidden = out.last_hidden_state[:, -logits_to_keep:] if logits_to_keep else out.last_hidden_state
        return LMOutput(logits=self.lm_head(hidden), cache=out.cache)


def build(config: dict, weights: dict) -> GPT2LM:
    """A GPT2LM of `config` holding `weights` (transformers' names; the tied head may be absent), in their dtype,
    eval mode. KeyError/RuntimeError from `load_state_dict` where they do not fit (the caller names it)."""
    model = GPT2LM(GPT2Settings.of(config), source=config)
    # assign: no second allocation; cloned, so a replay that steps this model never writes into the recorded dict
    state = {k: v.clone() for k, v in weights.items()}
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    dtype = next(iter(weights.values())).dtype
    return model.to(dtype).eval()
