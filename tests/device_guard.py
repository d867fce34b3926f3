"""A second device on a CPU-only machine, to catch device mixing without a GPU.

The development and CI machines have no GPU, and the project's users train on one: a tensor left on the CPU
beside a model on `cuda` is a crash there and nothing here. `simulated_device()` gives torch a second device
that computes for real: tensors on it are wrapper tensors holding CPU data, so generation, the loss, autograd
and the optimizer all run and give the CPU's numbers, while every op that meets one of them and a CPU tensor
raises `DeviceMixError`, as CUDA's "Expected all tensors to be on the same device" does. torch's own
exceptions are kept: a 0-dim CPU tensor (a scalar) may meet a device tensor, CPU index tensors may index one,
and copies (`.to`, `.cpu()`, `copy_`) cross.

The simulated device reports itself as `meta`: of the device types a CPU-only torch build knows, it is the
one autograd accepts without a device runtime (a claimed `cuda` tensor stops in the autograd engine, which
asks the missing CUDA runtime for a stream). Code that derives its device from the model's parameters — as
the project's does — moves its records there; code that wrote `"cpu"` or kept a record where it was meets
the error. `torch.autocast` has no `meta` mode, so bf16 autocast is not part of what this device checks.
"""
from __future__ import annotations

import contextlib
import unittest.mock as um

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

SIM = torch.device("meta")


class DeviceMixError(RuntimeError):
    """An op met a tensor on the simulated device and one on the CPU (CUDA's same-device error)."""


class SimTensor(torch.Tensor):
    """A tensor on the simulated device: `.device` is SIM, `._inner` the CPU tensor that holds its data."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=SIM, layout=inner.layout, requires_grad=False)
        r._inner = inner
        return r

    def __repr__(self):
        return f"SimTensor({self._inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


aten = torch.ops.aten
_COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default}
_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _checked(func, args, kwargs) -> list:
    """The tensors of an op whose devices must agree: all but torch's exceptions (CPU indices, scalars)."""
    flat, _ = tree_flatten(((args[0], *args[2:]), kwargs) if func in _INDEXING else (args, kwargs))
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _run(func, args, kwargs):
    tensors = _checked(func, args, kwargs)
    on_sim = [t for t in tensors if isinstance(t, SimTensor)]
    on_cpu = [t for t in tensors if not isinstance(t, SimTensor) and t.device.type == "cpu" and t.dim() > 0]
    if on_sim and on_cpu and func not in _COPIES:
        raise DeviceMixError(
            f"Expected all tensors to be on the same device, but found at least two devices, {SIM} (simulated) "
            f"and cpu! ({func}: CPU tensors of shape {[tuple(t.shape) for t in on_cpu]})")
    to_sim = kwargs.get("device") is not None and torch.device(kwargs["device"]) == SIM
    if kwargs.get("device") is not None:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    unwrap = lambda t: t._inner if isinstance(t, SimTensor) else (_empty_like_meta(t) if _is_meta(t) else t)
    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if func is aten.copy_.default:
        return args[0]                                  # in place: the destination keeps its device
    stays = to_sim or (on_sim and not (func is aten._to_copy.default and "device" in kwargs))
    if not stays:
        return out
    return tree_map(lambda t: SimTensor(t) if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor) else t,
                    out)


def _is_meta(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, SimTensor) and t.device.type == "meta"


def _empty_like_meta(t: torch.Tensor) -> torch.Tensor:
    """A real meta tensor can only be empty here (`_factory` routes data to SimTensor): its CPU twin."""
    if t.numel():
        raise DeviceMixError(f"a {tuple(t.shape)} meta tensor without data met the simulated device")
    return torch.empty(t.shape, dtype=t.dtype)


class _SimMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _factory(orig):
    """`torch.tensor(data, device=SIM)` builds its tensor before the dispatcher sees it: build on the CPU, move."""
    def make(data, *a, device=None, **k):
        if device is not None and torch.device(device) == SIM:
            return orig(data, *a, **k).to(SIM)
        return orig(data, *a, device=device, **k)
    return make


@contextlib.contextmanager
def simulated_device(*patches):
    """Inside: `.to(SIM)` moves a tensor or a model to the simulated device, and device mixing raises
    DeviceMixError. `patches`: further `unittest.mock.patch` objects to hold for the same span."""
    import torch._dynamo  # noqa: F401 - before the patches: it reads torch.Generator in annotations

    orig_gen = torch.Generator

    class _Generator(orig_gen):           # a generator "on" the device draws on the CPU that holds its data
        def __new__(cls, device="cpu"):
            return orig_gen("cpu")

    with contextlib.ExitStack() as stack:
        for p in (um.patch("torch.Generator", _Generator), um.patch("torch.tensor", _factory(torch.tensor)),
                  um.patch("torch.as_tensor", _factory(torch.as_tensor)), *patches):
            stack.enter_context(p)
        stack.enter_context(_SimMode())
        yield SIM
