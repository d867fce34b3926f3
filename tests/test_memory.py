"""models.memory: freed host memory of large tensors goes back to the OS (124M peak RSS)."""
import subprocess
import sys
import textwrap

import pytest

from rookworld_debug.models import memory

PROBE = textwrap.dedent("""
    import sys, psutil, torch
    from rookworld_debug.models import memory
    # "off": the threshold the update restores (glibc's own ceiling), set explicitly so that the result does not
    # depend on what this process's allocator did before; "on": the update's 1 MB threshold
    assert memory.set_mmap_threshold(memory.UPDATE_MMAP_THRESHOLD if sys.argv[1] == "on"
                                     else memory.DEFAULT_MMAP_THRESHOLD)
    rss = lambda: psutil.Process().memory_info().rss / 2**20
    torch.empty(2**19).fill_(1.0)
    base = rss()
    xs = [torch.empty(2**19).fill_(1.0) for _ in range(200)]   # 200 × 2 MB = 400 MB
    last = xs.pop()                                            # the newest stays: the heap top cannot shrink
    del xs
    print(round(rss() - base))
""")


def _held_mb(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_tensors_go_back_to_the_os_only_with_the_setting():
    held_default, held_on = _held_mb("off"), _held_mb("on")
    assert held_default > 300           # a 32 MB threshold keeps the freed 2 MB tensors in the heap
    assert held_on < 50                 # fixed 1 MB threshold: each was mmap'd and unmapped on free


def test_only_a_large_models_update_changes_the_threshold(monkeypatch):
    import torch
    calls = []
    monkeypatch.setattr(memory, "set_mmap_threshold", lambda t: calls.append(t) or True)
    with memory.update_memory(torch.nn.Linear(10, 10)):
        pass
    assert calls == []                                          # the tiny model: untouched (it would cost 15 %)
    monkeypatch.setattr(memory, "LARGE_MODEL_PARAMETERS", 100)
    with pytest.raises(RuntimeError):                           # restored even when the update fails
        with memory.update_memory(torch.nn.Linear(10, 10)):
            raise RuntimeError("update failed")
    assert calls == [memory.UPDATE_MMAP_THRESHOLD, memory.DEFAULT_MMAP_THRESHOLD]
