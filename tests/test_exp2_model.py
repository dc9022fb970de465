"""Tests of kernels/exp2_model.py: the FMA-pipe exp2 (accuracy, edge cases, exponent-bit add), the fitted
coefficient table, the fragment-quantised split, and the Table-2 accuracy metrics."""
import pytest
import torch

from kernels.exp2_model import (EXP2_POLY_COEFFS, PAPER_COEFFS_FLOOR, emulated_columns, emulated_fragments, exp2_poly,
                                exp2_split, fit_poly, poly_accuracy, quantized_fraction)


def _max_rel(y, x):
    ref = torch.exp2(x.double())
    return ((y.double() - ref).abs() / ref).max().item()


def test_degree3_max_relative_error_on_dense_grid():
    x = torch.linspace(-60.0, 60.0, 2_000_001, dtype=torch.float32)
    assert _max_rel(exp2_poly(x, 3), x) < 2e-4
    frac = torch.linspace(0.0, 1.0, 1_000_001, dtype=torch.float32)[:-1]
    err3 = _max_rel(exp2_poly(frac, 3), frac)
    assert 5e-5 < err3 < 1.2e-4  # minimax with p0 = 1 on [-0.5, 0.5]: ~1.01e-4 (measured, see module docstring)


def test_error_decreases_with_degree():
    x = torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 8 - 4
    errs = [_max_rel(exp2_poly(x, d), x) for d in sorted(EXP2_POLY_COEFFS)]
    assert all(a > 5 * b for a, b in zip(errs, errs[1:])), errs


def test_very_negative_inputs_give_zero_and_overflow_gives_inf():
    x = torch.tensor([float("-inf"), -1e30, -1e4, -200.0, -128.0, -127.0], dtype=torch.float32)
    y = exp2_poly(x)
    assert torch.equal(y, torch.zeros_like(y)) and not torch.signbit(y).any()
    y = exp2_poly(torch.tensor([128.0, 1e4, float("inf")]))
    assert torch.isposinf(y).all()
    assert torch.isnan(exp2_poly(torch.tensor([float("nan")]))).all()
    # just above the clamp: tiny, non-negative, finite (denormal range), never garbage
    x = torch.linspace(-127.0, -120.0, 10_001)
    y = exp2_poly(x)
    assert torch.isfinite(y).all() and (y >= 0).all() and (y <= 2.0 ** -119).all()


def test_exact_powers_of_two_at_integers():
    n = torch.arange(-126, 128, dtype=torch.float32)
    for d in sorted(EXP2_POLY_COEFFS):
        assert torch.equal(exp2_poly(n, d), torch.exp2(n.double()).float()), d


def test_large_negative_scores_in_the_softmax_range():
    # masked / far-below-max scores as the softmax sees them (x = s - m <= 0): relative accuracy kept to -126
    x = -torch.rand(500_000, generator=torch.Generator().manual_seed(1)) * 126
    assert _max_rel(exp2_poly(x), x) < 2e-4


def test_coefficient_table_is_the_fit():
    for d in (2, 3):
        fitted = fit_poly(d)
        assert fitted[0] == 1.0 and EXP2_POLY_COEFFS[d][0] == 1.0
        assert max(abs(a - b) for a, b in zip(fitted, EXP2_POLY_COEFFS[d])) < 1e-5, (d, fitted)
        x = torch.linspace(-0.5, 0.5, 100_001)
        e_table = _max_rel(exp2_poly(x, coeffs=EXP2_POLY_COEFFS[d]), x)
        e_fit = _max_rel(exp2_poly(x, coeffs=fitted), x)
        assert e_table <= 1.01 * e_fit
    for d, cs in EXP2_POLY_COEFFS.items():  # fp32-representable, as the kernels embed them
        assert len(cs) == d + 1 and all(torch.tensor(c, dtype=torch.float32).item() == c for c in cs)


def test_paper_coefficients_with_floor_reduction():
    x = torch.rand(1_000_000, generator=torch.Generator().manual_seed(2))
    err = _max_rel(exp2_poly(x, coeffs=PAPER_COEFFS_FLOOR, reduction="floor"), x)
    assert 8e-5 < err < 1.2e-4  # the paper's Table 2 says 8.8e-5 (its coefficients are printed to 4 digits)
    with pytest.raises(ValueError, match="reduction"):
        exp2_poly(x, reduction="ceil")
    with pytest.raises(ValueError, match="degree"):
        exp2_poly(x, degree=9)


def test_fragment_quantisation():
    assert emulated_fragments(128, 0.125).sum() == 2 and quantized_fraction(128, 0.125) == 0.125
    assert quantized_fraction(112, 0.125) == pytest.approx(2 / 14)
    assert quantized_fraction(128, 0.0) == 0.0 and quantized_fraction(128, 1.0) == 1.0
    assert quantized_fraction(128, 0.03) == 0.0  # less than half a fragment rounds to none
    cols = emulated_columns(128, 0.25)
    assert cols.sum() == 32
    groups = cols.view(16, 8)
    assert torch.all(groups.all(1) | ~groups.any(1))  # whole 8-column fragments only
    with pytest.raises(ValueError, match="fraction"):
        emulated_columns(128, 1.5)


def test_exp2_split_uses_the_polynomial_on_exactly_the_chosen_columns():
    x = torch.rand(64, 128, generator=torch.Generator().manual_seed(3)) * -20
    hw, poly = torch.exp2(x), exp2_poly(x)
    assert torch.equal(exp2_split(x, 0.0), hw)
    assert torch.equal(exp2_split(x, 1.0), poly)
    y, used = exp2_split(x, 0.25, return_fraction=True)
    cols = emulated_columns(128, 0.25)
    assert used == 0.25
    assert torch.equal(y[:, cols], poly[:, cols]) and torch.equal(y[:, ~cols], hw[:, ~cols])
    assert not torch.equal(y[:, cols], hw[:, cols])  # the polynomial really differs from MUFU's stand-in
    # a partial last tile keeps the full tile's fragment choice
    # (torch.exp2 itself may differ by an ulp between vectorised and tail lanes: compare those loosely)
    part = exp2_split(x[:, :50], 0.25, tile_cols=128)
    c50 = cols[:50]
    assert c50.any() and torch.equal(part[:, c50], poly[:, :50][:, c50])
    torch.testing.assert_close(part[:, ~c50], hw[:, :50][:, ~c50], rtol=3e-7, atol=0)


def test_poly_accuracy_metrics():
    r3 = poly_accuracy(EXP2_POLY_COEFFS[3], n=300_000)
    assert r3["max_rel_err_fp32"] < 1.2e-4
    assert r3["bf16_equal_share"] > 0.98 and r3["bf16_1ulp_share"] == 1.0 and r3["bf16_max_ulp"] == 1.0
    r1 = poly_accuracy(EXP2_POLY_COEFFS[1], n=300_000)  # the metric can fail: degree 1 is far off
    assert r1["max_rel_err_fp32"] > 0.04 and r1["bf16_1ulp_share"] < 0.6
