"""The replay's generic fits on their own: each transformation of the right values is recovered with its fitted
parameters, the right values themselves fit nothing, and a fit with as many parameters as data is never tried."""
from __future__ import annotations

import pytest
import torch

from rookworld_debug.diagnosis.replay.fits import value_fits

G = 4


@pytest.fixture
def right() -> torch.Tensor:
    """(N,) advantages-like values of 3 groups of 4, all distinct."""
    return torch.tensor([0.8, -1.1, 0.3, 0.0, 1.3, -0.2, -0.9, -0.2 + 1e-3, 0.5, 0.45, -1.5, 0.55], dtype=torch.float64)


def fit(rec, ref, mask=None, tol=1e-6):
    return value_fits(G)(rec.double(), ref.double(), mask, tol)


def test_the_right_values_fit_nothing_they_would_agree(right):
    # compare() calls the fits only on a disagreement; on the right values every fit must still be the identity
    assert fit(right, right) is None


def test_a_sign_and_a_scale_are_recovered(right):
    assert fit(-right, right).kind == "negated"
    got = fit(0.37 * right, right)
    assert got.kind == "scaled" and abs(got.params["scale"] - 0.37) < 1e-9


def test_a_row_roll_a_stride_and_a_within_group_permutation_are_named(right):
    got = fit(torch.roll(right, 1), right)
    assert got.kind == "permuted" and got.params["layout"] == "rolled by 1 row(s)"
    stride = right.view(3, G).T.reshape(-1)
    assert fit(stride, right).params["layout"].startswith("prompt-major")
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 7, 6, 8, 9, 10, 11])
    assert fit(right[perm], right).params["layout"] == "permuted within each group"


def test_another_rows_values_are_not_called_a_permutation(right):
    src = torch.tensor([0, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    got = fit(right[src], right)
    assert got.kind == "other_rows" and got.params["source_rows"][1] == 0


def test_an_offset_and_a_clamp_are_fitted_with_their_parameters(right):
    got = fit(2.0 * right + 0.25, right)
    assert got.kind == "affine" and abs(got.params["offset"] - 0.25) < 1e-9
    got = fit(right.clamp(-0.5, 0.5), right)
    assert got.kind == "clamped" and (got.params["min"], got.params["max"]) == (-0.5, 0.5)


def test_a_rounding_to_bf16_is_recovered(right):
    got = fit(right.to(torch.bfloat16).double(), right, tol=1e-9)
    assert got.kind == "rounded" and got.params["dtype"] == "bfloat16"


def test_per_group_statistics_need_more_points_than_parameters():
    """An affine map per group of 4 is fitted (2 parameters, 4 points); per group of 2 it would fit anything."""
    torch.manual_seed(0)
    right = torch.randn(12, dtype=torch.float64)
    scale, shift = torch.tensor([1.5, 0.3, 2.0]).repeat_interleave(G), torch.tensor([0.1, -0.4, 0.0]).repeat_interleave(G)
    got = fit(right * scale + shift, right)
    assert got.kind == "affine_per_set" and got.params["grouping"] == "each group of G rows"
    assert value_fits(2)(torch.randn(12, dtype=torch.float64), right, None, 1e-6) is None


def test_a_token_shift_is_found_in_a_token_tensor():
    torch.manual_seed(1)
    right = torch.randn(4, 10, dtype=torch.float64)
    mask = torch.ones(4, 10, dtype=torch.float64)
    shifted = torch.roll(right, 1, 1)
    got = fit(shifted, right, mask)
    assert got.kind == "shifted" and got.params["tokens"] == 1


def test_noise_fits_nothing(right):
    torch.manual_seed(2)
    assert fit(right + 0.1 * torch.randn(12, dtype=torch.float64), right) is None


def test_values_written_into_an_integer_tensor_are_named_by_the_cut(right):
    """Whole numbers where the right values have fractions: truncated toward zero, floored or rounded, each named;
    a scale never claims them first."""
    assert fit(torch.trunc(right * 2), right * 2).kind == "truncated_to_integer"
    assert fit(torch.floor(right * 2), right * 2).kind == "floored_to_integer"
    assert fit(torch.round(right * 2.5), right * 2.5).kind == "rounded_to_integer"
    whole = torch.tensor([1.0, -2.0, 0.0, 3.0] * 3, dtype=torch.float64)
    assert fit(torch.zeros_like(whole), whole) is None or fit(torch.zeros_like(whole), whole).kind != \
        "truncated_to_integer"                     # right values already whole: no cut to name
