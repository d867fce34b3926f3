"""Loader of the rookworld-rlvr "mini" golden file (tests/fixtures/rookworld/rlvr_mini_golden.json): tensors decoded
exactly, non-finite strings restored. Shared by the tests that run its cases."""
from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path

import pytest
import torch

CANDIDATES = (Path(__file__).resolve().parent / "fixtures" / "rookworld" / "rlvr_mini_golden.json",
              *([Path(os.environ["ROOKWORLD_SHARED"]) / "fixtures" / "rlvr_mini_golden.json"]
                if os.environ.get("ROOKWORLD_SHARED") else []))
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def golden_path() -> Path:
    for p in CANDIDATES:
        if p.exists():
            return p
    pytest.fail(f"the rlvr mini golden file is missing (looked in {[str(p) for p in CANDIDATES]})")


@lru_cache(maxsize=1)
def golden() -> dict:
    return json.loads(golden_path().read_text())


def _num(x):
    if isinstance(x, list):
        return [_num(v) for v in x]
    return _NONFINITE.get(x, x) if isinstance(x, str) else x


def tensor(spec, dtype=None) -> torch.Tensor:
    """{dtype, shape, values} → torch tensor (float32 values are exact float64s of float32s)."""
    dt = getattr(torch, spec["dtype"]) if dtype is None else dtype
    return torch.tensor(_num(spec["values"]), dtype=torch.float64).to(dt).reshape(spec["shape"])


def number(x) -> float:
    return _num(x)


def rel_err(got, exp) -> float:
    """max |got − exp| / max(|exp|, 1e-12) elementwise, NaN matching NaN and equal infinities counting 0."""
    g = torch.as_tensor(got, dtype=torch.float64).flatten()
    e = torch.as_tensor(exp, dtype=torch.float64).flatten()
    assert g.shape == e.shape, (g.shape, e.shape)
    same = (torch.isnan(g) & torch.isnan(e)) | (g == e)
    err = (g - e).abs() / e.abs().clamp(min=1e-12)
    err = torch.where(same, torch.zeros_like(err), err)
    return float(err.max()) if err.numel() else 0.0


def abs_err(got, exp) -> float:
    g = torch.as_tensor(got, dtype=torch.float64).flatten()
    e = torch.as_tensor(exp, dtype=torch.float64).flatten()
    same = (torch.isnan(g) & torch.isnan(e)) | (g == e)
    err = torch.where(same, torch.zeros_like(g), (g - e).abs())
    return float(err.max()) if err.numel() else 0.0


def tol_ok(got, exp, dtype) -> tuple[bool, float]:
    """float64: ≤ 1e-9 relative; float32: ≤ 1e-5 (relative, or absolute near 0)."""
    if dtype == torch.float64:
        e = rel_err(got, exp)
        return e <= 1e-9 or abs_err(got, exp) <= 1e-15, e
    e = min(rel_err(got, exp), abs_err(got, exp))
    return e <= 1e-5, e
