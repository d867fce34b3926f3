"""Host memory of the update on large models: freed gradient and activation memory goes back to the OS.

glibc's malloc serves a request from `mmap` only above a threshold that adapts upward (to 32 MB) after the first
large free; below it, a request comes from the heap, whose freed pages stay in the process. An update on GPT-2
124M allocates and frees many 1–32 MB tensors (per-parameter gradients, per-layer activations of each
micro-batch), so its resident memory grows by what the heap keeps: on the 124M update (8 micro-batches,
per-term gradients) the peak RSS was 4.0 GB with the default and 3.1 GB with a fixed 1 MB threshold. The same
threshold makes the 124M decode loop ~15 % slower (a fault on every fresh (rows, V) tensor) and a tiny-model step
~15 % slower, so it holds only while a large model's update runs (`update_memory`); afterwards the threshold is
fixed at glibc's own ceiling, 32 MB, where the adaptive one ends up anyway.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from contextlib import contextmanager

UPDATE_MMAP_THRESHOLD = 1 << 20          # during a large update: requests of 1 MB and up are mmap'd
DEFAULT_MMAP_THRESHOLD = 32 << 20        # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the adaptive ceiling
LARGE_MODEL_PARAMETERS = 50_000_000      # GPT-2 124M is large; the 4.9 M-parameter tiny model is not
_M_MMAP_THRESHOLD = -3                   # glibc mallopt parameter (malloc.h)
_libc: dict = {}


def set_mmap_threshold(threshold: int) -> bool:
    """glibc `mallopt(M_MMAP_THRESHOLD, threshold)` for this process. Returns whether it took effect: False off
    Linux/glibc (macOS, musl), where nothing is changed."""
    if "lib" not in _libc:
        lib = None
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.mallopt                       # noqa: B018 - AttributeError when not glibc
            except (OSError, AttributeError):
                lib = None
        _libc["lib"] = lib
    return _libc["lib"] is not None and bool(_libc["lib"].mallopt(_M_MMAP_THRESHOLD, int(threshold)))


def is_large(model) -> bool:
    return sum(p.numel() for p in model.parameters()) >= LARGE_MODEL_PARAMETERS


@contextmanager
def update_memory(model):
    """While the block runs (models with ≥ LARGE_MODEL_PARAMETERS parameters only): requests of 1 MB and up are
    mmap'd, so a freed gradient or activation is unmapped at once; after it, the threshold is 32 MB."""
    if not is_large(model) or not set_mmap_threshold(UPDATE_MMAP_THRESHOLD):
        yield
        return
    try:
        yield
    finally:
        set_mmap_threshold(DEFAULT_MMAP_THRESHOLD)


DEVICE_SHARE = 0.5     # of the memory free on an accelerator: what one phase's working set may plan for


def memory_budget(device, cpu_bytes: int, share: float = DEVICE_SHARE) -> int:
    """Bytes a phase may plan one chunk or micro-batch for on `device`.

    On CUDA: `share` of the memory free there now (`torch.cuda.mem_get_info`), so a 141 GB card runs a batch in
    one pass where a 12 GB card splits it. Elsewhere `cpu_bytes`: host memory is shared with everything else on
    the machine and freed memory is not returned at once, so the CPU keeps a fixed, modest rule."""
    import torch
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(cpu_bytes, int(free * share))
    return cpu_bytes
