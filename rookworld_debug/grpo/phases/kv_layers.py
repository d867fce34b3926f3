"""The KV-cache layers of the decoding loops, on transformers' cache classes (imported only when a loop decodes, so
scoring and a replay never pay transformers' import)."""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


def kv_buffers(layer, key_states, value_states, new) -> tuple:
    """(keys, values) buffers of `layer.capacity` columns, (n, H, C, D) each, made by `new` (Tensor.new_empty or
    new_zeros) in the states' dtype and device; the layer is marked initialized."""
    layer.dtype, layer.device = key_states.dtype, key_states.device
    n, h, _, d = key_states.shape
    layer.is_initialized = True
    return (new(key_states, (n, h, layer.capacity, d)),
            new(value_states, (n, h, layer.capacity, value_states.shape[-1])))


class PreallocLayer(DynamicLayer):
    """A KV-cache layer with a preallocated (n, heads, C, head_dim) buffer written in place; the model
    sees views of the filled part. Row expansion/selection copy only the filled part."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.buf_k, self.buf_v = kv_buffers(self, key_states, value_states, torch.Tensor.new_empty)

    def _views(self):
        self.keys, self.values = self.buf_k[:, :, :self.length], self.buf_v[:, :, :self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, t = self.length, key_states.shape[-2]
        self.buf_k[:, :, start:start + t].copy_(key_states)
        self.buf_v[:, :, start:start + t].copy_(value_states)
        self.length = start + t
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def _remap(self, rows: torch.Tensor) -> None:
        for name in ("buf_k", "buf_v"):
            old = getattr(self, name)
            new = old.new_empty((rows.numel(), *old.shape[1:]))
            new[:, :, :self.length] = old[rows, :, :self.length]
            setattr(self, name, new)
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._remap(torch.arange(self.buf_k.shape[0], device=self.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._remap(indices.to(self.device))
