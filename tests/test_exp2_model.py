"""Tests of kernels/exp2_model.py: the FMA-pipe exp2 (accuracy, edge cases, exponent-bit add), the fitted
coefficient table, the fragment-quantised split, and the Table-2 accuracy metrics."""
import pytest
import torch

from kernels.exp2_model import (EXP2_POLY_COEFFS, PAPER_COEFFS_FLOOR, _fma32, affine_args, emulated_columns,
                                emulated_fragments, exp2_poly, exp2_poly_affine, exp2_split, fit_poly, poly_accuracy,
                                quantized_fraction)


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
    assert all(a > 5 * b for a, b in zip(errs[:3], errs[1:3])), errs
    # degrees 4-5 hit the floor of the clamp-free reduction: u = sat(x/256 + 127/256) puts x on a 2^-16 grid for
    # x in [1, 129) (2^-17 below 1): <= 2^-17 * ln 2 = 5.3e-6 relative, 20x below degree 3's error
    assert errs[2] > 10 * max(errs[3:]) and max(errs[3:]) < 1e-5, errs


def test_very_negative_inputs_give_zero_and_overflow_gives_inf():
    x = torch.tensor([float("-inf"), -1e30, -1e4, -200.0, -128.0, -127.0], dtype=torch.float32)
    y = exp2_poly(x)
    assert torch.equal(y, torch.zeros_like(y)) and not torch.signbit(y).any()
    y = exp2_poly(torch.tensor([128.0, 1e4, float("inf")]))
    assert torch.isposinf(y).all()
    # NaN: the kernels' FFMA.SAT flushes it to +0.0 (the old FMNMX clamp did the same); the model follows them
    y = exp2_poly(torch.tensor([float("nan")]))
    assert torch.equal(y, torch.zeros(1)) and not torch.signbit(y).any()
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


def test_fma32_is_correctly_rounded():
    from fractions import Fraction

    # exact a*b+c = 1 + 2^-23 + 2^-24 - 2^-70: just below an fp32 midpoint; an fp64 sum rounds it onto the midpoint and
    # the fp32 tie then goes to even (1 + 2^-22): the double-rounding error a correctly rounded FFMA never makes
    a = torch.tensor([1.0 + 2.0 ** -23])
    b = torch.tensor([2.0 ** -24 - 2.0 ** -47])
    c = torch.tensor([1.0 + 2.0 ** -23])
    assert float(_fma32(a, b, c)) == 1.0 + 2.0 ** -23
    g = torch.Generator().manual_seed(7)
    n = 4000
    x = (torch.rand(n, generator=g) - 0.5) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())
    y = (torch.rand(n, generator=g) - 0.5) * 3
    z = (torch.rand(n, generator=g) - 0.5) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())
    r = _fma32(x, y, z)
    inf = torch.tensor(float("inf"))
    for i in range(0, n, 7):  # against exact rationals: no fp32 neighbour is closer
        e = Fraction(float(x[i])) * Fraction(float(y[i])) + Fraction(float(z[i]))
        ri = r[i]
        nb = [float(ri.nextafter(inf)), float(ri.nextafter(-inf))]
        assert all(abs(Fraction(float(ri)) - e) <= abs(Fraction(v) - e) for v in nb), i


def _softmax_like(n: int, seed: int, spread: float = 40.0):
    """Scores, scale and row offsets as the forward sees them: s (fp32), scale_log2, m_s with x = s*scale_log2 - m_s <= 0
    mostly, some far below (< -127), some masked (-inf)."""
    g = torch.Generator().manual_seed(seed)
    scale_log2 = torch.tensor(0.125 * 1.4426950408889634, dtype=torch.float32)  # hd64: 1/sqrt(64) * log2(e)
    s = torch.randn(n, generator=g) * spread
    m = s.max()
    s[:: 97] = float("-inf")
    s[1:: 89] = m - 3000.0  # far below the max: x << -127
    m_s = (m * scale_log2).float()
    return s.float(), scale_log2, m_s


def test_affine_entry_is_the_generic_entry_of_the_scaled_argument():
    """exp2_poly_affine(s, affine_args(scale, m_s)) == 2^(s*scale - m_s) to within u's grid; masked -> +0.0."""
    s, scale_log2, m_s = _softmax_like(400_000, 11)
    a, b = affine_args(scale_log2, m_s)
    y = exp2_poly_affine(s, a, b)
    x = _fma32(s, scale_log2.double(), -m_s)  # the MUFU path's x: one FFMA
    ref = torch.exp2(s.double() * scale_log2.double() - m_s.double())
    masked = torch.isneginf(s)
    far = x < -127
    assert torch.equal(y[masked | far], torch.zeros_like(y[masked | far])) and not torch.signbit(y).any()
    live = ~masked & ~far & (x > -120)
    rel = ((y[live].double() - ref[live]).abs() / ref[live]).max().item()
    assert rel < 1.1e-4, rel
    # same values as the generic entry on x, up to the rounding of x (one FFMA) and of b
    yg = exp2_poly(x)
    rel_g = ((y[live].double() - yg[live].double()).abs() / yg[live].double()).max().item()
    assert rel_g < 2e-5, rel_g


def test_affine_entry_edge_cases():
    a, b = affine_args(torch.tensor(1.0), torch.tensor(0.0))
    assert float(a) == 1 / 256 and float(b) == 127 / 256
    s = torch.tensor([float("-inf"), float("nan"), -1e30, -127.0, 0.0, 1.0, -3.0, 64.0, 127.0, 128.0])
    y = exp2_poly_affine(s, a, b)
    assert torch.equal(y[:4], torch.zeros(4)) and not torch.signbit(y).any()
    assert y[4:].tolist() == [1.0, 2.0, 0.125, 2.0 ** 64, 2.0 ** 127, float("inf")]
    # integer arguments through a real row offset: exact powers of two whenever m_s is an integer
    n = torch.arange(-126, 65, dtype=torch.float32)
    a, b = affine_args(torch.tensor(1.0), torch.tensor(5.0))
    assert torch.equal(exp2_poly_affine(n + 5.0, a, b), torch.exp2(n.double()).float())


def test_new_polynomial_accuracy_vs_float64_and_bf16_agreement():
    """The clamp-free polynomial: max relative error vs exp2 in fp64 on the softmax range, and bf16 rounding agreement
    with a correctly rounded exp2 (the MUFU stand-in)."""
    g = torch.Generator().manual_seed(5)
    x = -torch.rand(2_000_000, generator=g) * 126.0
    y = exp2_poly(x)
    ref = torch.exp2(x.double())
    rel = ((y.double() - ref).abs() / ref).max().item()
    assert rel < 1.1e-4, rel  # degree-3 minimax (1.01e-4) + u's grid (<= 2.6e-6 for x <= 1)
    yb, rb = y.bfloat16(), ref.float().bfloat16()
    d = (yb.view(torch.int16).int() - rb.view(torch.int16).int()).abs()
    assert int(d.max()) <= 1 and (d == 0).float().mean().item() > 0.97


def test_sixteenths_quantisation_is_reported_exactly():
    """EXP2_FRACTION_QUANTUM = 1/16: exact where a row has 16 fragments (forward tile_n 128, backward 128-row tiles),
    rounded to whole fragments elsewhere, and the kernels' compiled_fraction, the config's quantized_exp2_fraction and
    the model's quantized_fraction agree."""
    pytest.importorskip("cutlass")
    from kernels.config import EXP2_FRACTION_QUANTUM, quantized_exp2_fraction
    from kernels.sm90.exp2 import compiled_fraction, emulated_fragments as kernel_fragments

    assert EXP2_FRACTION_QUANTUM == 1 / 16
    for k in range(17):
        f = k * EXP2_FRACTION_QUANTUM
        assert compiled_fraction(16, f) == f == quantized_exp2_fraction(f, 16) == quantized_fraction(128, f)
        assert len(kernel_fragments(16, f)) == k
        for n_frag, cols in ((8, 64), (10, 80), (14, 112)):  # backward 64-row tiles; forward hd256, hd192 tiles
            got = compiled_fraction(n_frag, f)
            assert got == quantized_exp2_fraction(f, n_frag) == quantized_fraction(cols, f)
            assert abs(got - f) <= 0.5 / n_frag + 1e-12
    assert compiled_fraction(8, 1 / 16) == 0.0 and compiled_fraction(8, 3 / 16) == 0.25  # half a fragment: to even
