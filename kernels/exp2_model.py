"""Software exp2 exactly as the kernels compute it on the FMA pipe, in plain PyTorch (CPU or GPU).

The FA4 trick: compute part of each softmax row's exponentials with FMA-pipe arithmetic instead of
the MUFU.EX2 unit. Scheme used by this repo (model and kernels share the constants below), in fp32:

  1. u = sat(x / 256 + 127 / 256)      one FFMA.SAT: clamps x to [-127, 129] (sat maps -inf and NaN to 0, so
                                        masked scores give exactly +0.0) -- no FMNMX; the forward folds the softmax
                                        scale and row offset into it: u = sat(s * a + b) (``exp2_poly_affine``)
  2. t = 256 u + (1.5 * 2^23 - 127)    FFMA whose fp32 rounding is the "magic add": t = 1.5*2^23 + n, n = rint(x)
                                        (ties to even), n in t's low mantissa bits -- no FRND/F2I on the MUFU pipe
  3. d = (1.5 * 2^23 - 127) - t        FADD, exact (integers)
  4. f = 256 u + d = x - n             FFMA, f in [-0.5, 0.5]
  5. p = 1 + f*(c1 + f*(c2 + f*c3))     Horner, 3 FFMA (p0 = 1 exactly)
  6. result bits = bits(p) + (bits(t) << 23)   one LEA: multiplies p by 2^n

Seven FMA/ALU instructions per exponential (the forward's step 1 replaces the FFMA that computes x for MUFU).
Step 1 quantises x to a 2^-16 grid (u's ulp times 256; |error| <= 2^-17 in x, 2.6e-6 relative in 2^x), far below
the polynomial's 1e-4. Domain: x <= 128 (x = 128 gives +inf); the softmax has x <= tau <= 64 and the kernels have
no upper clamp (their result for x > 128 is undefined); this model returns +inf there.

Range choice: round-to-nearest puts f in [-0.5, 0.5], so the coefficients are fitted for that
interval, not the FA4 paper's [0, 1) (its p1=0.6951, p2=0.2276, p3=0.0771 assume a floor). p0 is
pinned to 1 so integer inputs (in particular x = 0, the row maximum when the max is fresh) give
exact powers of two. The fit is minimax in relative error (Lawson's iteratively reweighted least
squares on a dense grid); pinning p0 at the centre of the interval costs a little accuracy against an
unconstrained fit (degree 3: ~1.0e-4 vs the paper's 8.8e-5), invisible after bf16/fp16 rounding (see
``poly_accuracy_table``). ``EXP2_POLY_COEFFS[d]`` = (1.0, c1, ..., cd), fp32-representable floats,
produced by ``fit_poly(d)`` (a test checks they agree).

``exp2_split`` applies the polynomial to a deterministic, fragment-quantised share of each row's
columns and ``torch.exp2`` (fp32; the stand-in for MUFU.EX2) to the rest.
"""
from __future__ import annotations

import math

import torch

MAGIC_ROUND = 12582912.0  # 1.5 * 2**23: x + MAGIC in fp32 rounds x to an integer (|x| < 2**22)
EXP2_CLAMP_LO = -127.0  # 2^n with n = -127 added to p = 1.0 gives the all-zero bit pattern (+0.0)
EXP2_CLAMP_HI = 128.0  # n = 128 added to p = 1.0 gives 0x7F800000 (+inf), like a hardware overflow
EXP2_SPAN = 256.0  # u = sat((x - EXP2_CLAMP_LO) / EXP2_SPAN): a power of two, so x -> u -> 256 u is exact at integers
T_BIAS = MAGIC_ROUND + EXP2_CLAMP_LO  # 1.5*2^23 - 127: fp32 t = T_BIAS + 256 u rounds 256 u to an integer
FRAGMENT_COLS = 8  # Hopper wgmma accumulator: a "register fragment" spans 8 columns of a row

# Minimax (relative error) coefficients for 2^f on f in [-0.5, 0.5] with p0 = 1, rounded to fp32.
# Regenerate with: {d: fit_poly(d) for d in range(1, 6)}  (tests/test_exp2_model.py checks this).
EXP2_POLY_COEFFS: dict[int, tuple[float, ...]] = {
    1: (1.0, 0.6666638851165771),
    2: (1.0, 0.7029422521591187, 0.239864319562912),
    3: (1.0, 0.6932829022407532, 0.2422110140323639, 0.05500895157456398),
    4: (1.0, 0.6931241750717163, 0.24024099111557007, 0.05590642988681793, 0.009582855738699436),
    5: (1.0, 0.6931470036506653, 0.24022242426872253, 0.05550733581185341, 0.009671512991189957, 0.0013264728477224708),
}

# The FA4 paper's degree-3 coefficients, for f in [0, 1) (floor range reduction); kept for comparison.
PAPER_COEFFS_FLOOR = (1.0, 0.6951, 0.2276, 0.0771)


def fit_poly(degree: int, lo: float = -0.5, hi: float = 0.5, points: int = 4001, iters: int = 3000) -> tuple[float, ...]:
    """Minimax-relative-error fit of 2^f on [lo, hi] with p0 = 1; returns fp32-rounded (1.0, c1, ..., cd).

    Lawson's algorithm: weighted least squares whose weights are multiplied by the current error,
    which converges to the discrete minimax solution on the grid.
    """
    import numpy as np

    if not isinstance(degree, int) or not 1 <= degree <= 8:
        raise ValueError(f"degree={degree!r}: must be an int in [1, 8]")
    f = np.linspace(lo, hi, points)
    y = np.exp2(f)
    a = np.stack([f**k for k in range(1, degree + 1)], axis=1) / y[:, None]
    b = (y - 1.0) / y
    w = np.full(points, 1.0 / points)
    c = None
    for _ in range(iters):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        e = np.abs(a @ c - b)
        w = w * e
        s = w.sum()
        if not s > 0:
            break
        w /= s
    c32 = np.asarray(c, dtype=np.float32)
    return (1.0,) + tuple(float(v) for v in c32)


def _fma32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """fp32 fused multiply-add, correctly rounded: the product of two fp32 values is exact in fp64 (24+24 bits fit
    in 53), the sum is formed exactly as s + e (TwoSum) and rounded to odd in fp64, so the final rounding to fp32
    is the single rounding of a*b+c (53 >= 24 + 2 bits: no double-rounding error)."""
    a64 = a.double()
    b64 = (b if b.dtype == torch.float64 else b.double()) if isinstance(b, torch.Tensor) else float(b)
    c64 = c.double() if isinstance(c, torch.Tensor) else torch.full_like(a64, float(c))
    prod = a64 * b64
    s = prod + c64
    bb = s - prod
    e = (prod - (s - bb)) + (c64 - bb)  # exact: s + e == prod + c (TwoSum), for finite values
    inexact = (e != 0) & torch.isfinite(s)
    if bool(inexact.any()):
        bits = s.view(torch.int64)
        toward_zero = inexact & ((e < 0) != (s < 0))  # |s| > |exact|: step one ulp towards zero
        bits = torch.where(toward_zero, bits - 1, bits)  # same sign, magnitude - 1 ulp (s != 0 when inexact)
        bits = torch.where(inexact, bits | 1, bits)  # round to odd
        s = bits.view(torch.float64)
    return s.float()


def _poly_from_u(u: torch.Tensor, cs: tuple) -> torch.Tensor:
    """Steps 2-6 of the module docstring on fp32 u in [0, 1], bit for bit as the kernels' PTX."""
    t = _fma32(u, EXP2_SPAN, T_BIAS)  # 1.5*2^23 + n
    d = (T_BIAS - t.double()).float()  # exact
    f = _fma32(u, EXP2_SPAN, d)  # x - n in [-0.5, 0.5]
    f64 = f.double()
    p = torch.full_like(f, cs[-1])
    for c in reversed(cs[:-1]):
        p = _fma32(p, f64, c)
    bits = (p.view(torch.int32).long() + (t.view(torch.int32).long() << 23)) & 0xFFFFFFFF  # LEA, mod 2^32
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return bits.view(torch.float32)


def _sat(v: torch.Tensor) -> torch.Tensor:
    """PTX .sat on an fp32 result: clamp to [0, 1], NaN -> +0.0."""
    return torch.nan_to_num(v, nan=0.0).clamp(0.0, 1.0)


def _coeffs(degree: int, coeffs) -> tuple[float, ...]:
    if coeffs is not None:
        cs = tuple(float(v) for v in coeffs)
        if len(cs) < 2:
            raise ValueError(f"coeffs={coeffs!r}: need at least (p0, p1)")
        return cs
    if degree not in EXP2_POLY_COEFFS:
        raise ValueError(f"degree={degree!r}: supported degrees are {sorted(EXP2_POLY_COEFFS)}")
    return EXP2_POLY_COEFFS[degree]


def exp2_poly(x: torch.Tensor, degree: int = 3, coeffs=None, reduction: str = "round") -> torch.Tensor:
    """2^x in fp32 as the kernels compute it on the FMA pipe (see the module docstring).

    ``reduction='round'`` (the kernels' scheme, ``kernels/sm90/exp2.py: exp2_poly``): u = sat(x/256 + 127/256), the
    magic-add round to nearest, f in [-0.5, 0.5]. x <= -127 (incl. -inf) and NaN give +0.0 (as the kernels' .sat does),
    x >= 128 gives +inf (the kernels' domain ends at 128).
    ``reduction='floor'``: n = floor(x), f in [0, 1), x clamped to [-127, 128], NaN stays NaN -- only to evaluate the
    paper's coefficients.
    Returns an fp32 tensor of x's shape.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    cs = _coeffs(degree, coeffs)
    if reduction == "round":
        xf = x.float().clamp(max=EXP2_CLAMP_HI)  # model only: the kernels' domain is x <= 128
        u = _sat(_fma32(xf, 1.0 / EXP2_SPAN, -EXP2_CLAMP_LO / EXP2_SPAN))
        return _poly_from_u(u, cs)
    if reduction != "floor":
        raise ValueError(f"reduction={reduction!r}: supported are 'round' (kernels) and 'floor' (paper's [0,1) fit)")
    xf = x.float().clamp(EXP2_CLAMP_LO, EXP2_CLAMP_HI)
    n = torch.floor(xf)
    f = xf - n  # exact in fp32 (Sterbenz)
    f64 = f.double()
    p = torch.full_like(f, cs[-1])
    for c in reversed(cs[:-1]):
        p = _fma32(p, f64, c)
    ni = torch.nan_to_num(n, nan=0.0).to(torch.int32)
    bits = p.view(torch.int32) + torch.bitwise_left_shift(ni, 23)
    out = bits.view(torch.float32)
    return torch.where(torch.isnan(xf), xf, out)


def affine_args(scale_log2, m_s) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) of ``exp2_poly_affine`` for P = 2^(s * scale_log2 - m_s), fp32 as the forward kernel computes them:
    a = scale_log2 / 256 (exact), b = 127/256 - m_s/256 (one FFMA per row; its rounding, <= 2^-25 |127 - m_s|, is the
    only difference from x = s * scale_log2 - m_s besides u's grid)."""
    sl = torch.as_tensor(scale_log2, dtype=torch.float32)
    ms = torch.as_tensor(m_s, dtype=torch.float32)
    a = (sl.double() / EXP2_SPAN).float()
    b = _fma32(ms, -1.0 / EXP2_SPAN, -EXP2_CLAMP_LO / EXP2_SPAN)
    return a, b


def exp2_poly_affine(s: torch.Tensor, a, b, degree: int = 3, coeffs=None) -> torch.Tensor:
    """The forward kernel's fused software exp2 (``kernels/sm90/exp2.py: exp2_poly_affine``), bit for bit:
    u = sat(fma(s, a, b)) then steps 2-6, i.e. 2^(256 (s a + b) - 127); with ``affine_args(scale_log2, m_s)`` that is
    2^(s * scale_log2 - m_s). s = -inf (masked) and NaN give +0.0."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"s: expected a torch.Tensor, got {type(s).__name__}")
    cs = _coeffs(degree, coeffs)
    a = torch.as_tensor(a, dtype=torch.float32)
    b = torch.as_tensor(b, dtype=torch.float32)
    u = _sat(_fma32(s.float(), a.double(), b))
    return _poly_from_u(u, cs)


def emulated_fragments(ncols: int, fraction: float, fragment: int = FRAGMENT_COLS) -> torch.Tensor:
    """Bool mask over the ``ceil(ncols / fragment)`` fragments of a tile row: True = polynomial.

    The number of emulated fragments is ``round(fraction * fragments)`` (whole fragments only); they
    are spread evenly along the row (fragment i is emulated when floor((i+1)*k/F) > floor(i*k/F)),
    so every thread of a quad gets the same count and the choice is a compile-time constant.
    """
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"fraction={fraction!r}: must be in [0, 1]")
    if not isinstance(fragment, int) or fragment < 1:
        raise ValueError(f"fragment={fragment!r}: must be a positive int (columns per register fragment)")
    nfrag = max(1, math.ceil(int(ncols) / fragment))
    k = round(float(fraction) * nfrag)
    i = torch.arange(nfrag)
    return ((i + 1) * k) // nfrag > (i * k) // nfrag


def quantized_fraction(ncols: int, fraction: float, fragment: int = FRAGMENT_COLS) -> float:
    """The share of a ``ncols``-column tile row that ``exp2_split`` really computes with the polynomial."""
    m = emulated_fragments(ncols, fraction, fragment)
    return float(m.sum().item()) / m.numel()


def emulated_columns(ncols: int, fraction: float, fragment: int = FRAGMENT_COLS) -> torch.Tensor:
    """Bool mask over the ``ncols`` columns of a tile row: True where the polynomial is used."""
    m = emulated_fragments(ncols, fraction, fragment)
    return m.repeat_interleave(fragment)[: int(ncols)]


def exp2_split(x: torch.Tensor, fraction: float, fragment: int = FRAGMENT_COLS, degree: int = 3,
               return_fraction: bool = False, tile_cols: int | None = None):
    """exp2 of a tile of scores (last dim = the tile's columns) with the FA4 split.

    Columns in the emulated fragments (``emulated_columns``) use ``exp2_poly``; the others use
    ``torch.exp2`` in fp32, the stand-in for MUFU.EX2. ``tile_cols`` is the kernel's tile width when
    ``x`` is a partial (last) tile: the fragment choice is made for the full tile, then truncated.
    Returns fp32 [, the quantised fraction used, i.e. of the full tile row].
    """
    xf = x.float()
    ncols = xf.shape[-1]
    width = ncols if tile_cols is None else int(tile_cols)
    if width < ncols:
        raise ValueError(f"tile_cols={tile_cols!r}: must be >= the {ncols} columns of x")
    used = quantized_fraction(width, fraction, fragment)
    if used == 0.0:
        y = torch.exp2(xf)
    elif used == 1.0:
        y = exp2_poly(xf, degree)
    else:
        cols = emulated_columns(width, fraction, fragment)[:ncols].to(xf.device)
        y = torch.exp2(xf)
        y[..., cols] = exp2_poly(xf[..., cols], degree)
    return (y, used) if return_fraction else y


def _bf16_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ULP distance| between two non-negative bf16 tensors (bit patterns are monotonic for x >= 0)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def poly_accuracy(coeffs, n: int = 4_000_000, reduction: str = "round", seed: int = 0, lo: float = 0.0,
                  hi: float = 1.0, chunk: int = 1 << 21) -> dict:
    """Accuracy of one coefficient set over ``n`` uniform fp32 inputs in [lo, hi) against torch.exp2 (fp32).

    Returns max_rel_err_fp32 (vs exp2 in fp64 of the same fp32 inputs), max_rel_err_vs_hw (vs
    torch.exp2 fp32), and after bf16 rounding: bf16_equal_share, bf16_1ulp_share, bf16_max_ulp.
    """
    g = torch.Generator().manual_seed(seed)
    max_rel = max_rel_hw = 0.0
    eq = ulp1 = 0
    max_ulp = 0
    done = 0
    while done < n:
        m = min(chunk, n - done)
        x = lo + (hi - lo) * torch.rand(m, generator=g, dtype=torch.float32)
        y = exp2_poly(x, coeffs=coeffs, reduction=reduction)
        ref64 = torch.exp2(x.double())
        hw = torch.exp2(x)
        max_rel = max(max_rel, ((y.double() - ref64).abs() / ref64).max().item())
        max_rel_hw = max(max_rel_hw, ((y.double() - hw.double()).abs() / hw.double()).max().item())
        d = _bf16_ulp_distance(y.bfloat16(), hw.bfloat16())
        eq += int((d == 0).sum())
        ulp1 += int((d <= 1).sum())
        max_ulp = max(max_ulp, int(d.max()))
        done += m
    return dict(max_rel_err_fp32=max_rel, max_rel_err_vs_hw=max_rel_hw, bf16_equal_share=eq / n,
                bf16_1ulp_share=ulp1 / n, bf16_max_ulp=float(max_ulp), n=n)


def poly_accuracy_table(n: int = 4_000_000, degrees=(1, 2, 3, 4, 5), include_paper: bool = True, seed: int = 0) -> list[dict]:
    """The FA4 paper's Table 2 for our fits (and the paper's own degree-3 coefficients): one dict per row."""
    rows = []
    for d in degrees:
        r = poly_accuracy(EXP2_POLY_COEFFS[d], n=n, reduction="round", seed=seed)
        rows.append(dict(degree=d, coeffs="ours_round", **r))
    if include_paper:
        r = poly_accuracy(PAPER_COEFFS_FLOOR, n=n, reduction="floor", seed=seed)
        rows.append(dict(degree=3, coeffs="paper_floor", **r))
    return rows
