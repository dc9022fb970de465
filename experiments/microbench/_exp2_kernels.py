"""Triton kernels of the exp2 microbenchmark (see exp2_triton.py); imports triton at module level."""
import triton
import triton.language as tl


@triton.jit
def _mufu_neg(x):
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [-x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _poly_neg(x, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    # 2^(-x): clamp, then the negation folds into the FADD operands
    xc = tl.minimum(x, 127.0)
    t = 12582912.0 - xc  # rounds -xc to an integer n, kept in t's low mantissa bits
    m = 12582912.0 - t  # = -n (every add here takes its negation as a free operand modifier)
    f = m - xc  # = -xc - n, in [-0.5, 0.5]
    p = tl.fma(tl.fma(tl.fma(f, C3, C2), f, C1), f, 1.0)
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _step(x, POLY: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    if POLY:
        return _poly_neg(x, C1, C2, C3)
    else:
        return _mufu_neg(x)


@triton.jit
def exp2_chain_kernel(X, Y, iters, KP: tl.constexpr, U: tl.constexpr, C1: tl.constexpr,
                      C2: tl.constexpr, C3: tl.constexpr):
    o = tl.program_id(0) * 8 * U + tl.arange(0, U)
    x0 = tl.load(X + o)
    x1 = tl.load(X + o + U)
    x2 = tl.load(X + o + 2 * U)
    x3 = tl.load(X + o + 3 * U)
    x4 = tl.load(X + o + 4 * U)
    x5 = tl.load(X + o + 5 * U)
    x6 = tl.load(X + o + 6 * U)
    x7 = tl.load(X + o + 7 * U)
    for _ in range(iters):
        x0 = _step(x0, KP > 0, C1, C2, C3)
        x1 = _step(x1, KP > 1, C1, C2, C3)
        x2 = _step(x2, KP > 2, C1, C2, C3)
        x3 = _step(x3, KP > 3, C1, C2, C3)
        x4 = _step(x4, KP > 4, C1, C2, C3)
        x5 = _step(x5, KP > 5, C1, C2, C3)
        x6 = _step(x6, KP > 6, C1, C2, C3)
        x7 = _step(x7, KP > 7, C1, C2, C3)
    tl.store(Y + o, x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7)
