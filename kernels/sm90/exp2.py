"""exp2 building blocks for the sm90 kernels: MUFU.EX2 and the FMA-pipe polynomial (software exp2).

Stable API (the backward kernel imports these names; keep them):
  ``exp2_mufu(x)``          -> 2**x on the MUFU pipe (ex2.approx.ftz.f32)
  ``exp2_poly(x, coeffs)``  -> 2**x on the FMA/ALU pipes only, ``coeffs`` = (1, p1, p2, p3) of 2**f, f in [-0.5, 0.5]
  ``emulated_fragments(n_frag, fraction)`` -> static tuple of fragment indices that use ``exp2_poly``
  ``POLY_COEFFS``           -> the degree-3 coefficients used by default (from kernels.exp2_model when present)

``exp2_poly`` is Cody-Waite range reduction written so that nothing lands on the MUFU pipe, bit-for-bit the
scheme of kernels/exp2_model.py (the oracle): x is rounded to the nearest integer n with the 1.5*2^23 magic
add (FADD, no F2I / FRND), f = x - n in [-0.5, 0.5] goes through a Horner FFMA chain with
EXP2_POLY_COEFFS[3], and 2^n is added straight into the exponent bits (shift + integer add of the magic sum's
bits). Inputs are clamped to >= -127, so exp2_poly(-inf) == 0 exactly (p0 == 1: 0x3F800000 - (127 << 23) == 0).
The model's upper clamp (128) is not emitted: softmax arguments are <= tau <= 64.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

_MAGIC = 12582912.0  # 1.5 * 2**23: adding it leaves round(x) in the low mantissa bits

from ..exp2_model import EXP2_POLY_COEFFS, MAGIC_ROUND

POLY_COEFFS = tuple(float(c) for c in EXP2_POLY_COEFFS[3])  # the model's coefficients, f in [-0.5, 0.5]
assert POLY_COEFFS[0] == 1.0 and MAGIC_ROUND == _MAGIC


def _f32_hex(v: float) -> str:
    import struct

    return "0f%08X" % struct.unpack("<I", struct.pack("<f", float(v)))[0]


@dsl_user_op
def exp2_mufu(x: Float32, *, loc=None, ip=None) -> Float32:
    """2**x with MUFU.EX2 (flush-to-zero approximate; exp2(-inf) == 0)."""
    return Float32(
        llvm.inline_asm(
            T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "ex2.approx.ftz.f32 $0, $1;", "=f,f",
            has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def exp2_poly(x: Float32, coeffs: tuple = POLY_COEFFS, *, loc=None, ip=None) -> Float32:
    """2**x on the FMA pipe: FMNMX, magic-add round (FADD), 2 FADD, 3 FFMA (Horner), SHL + IADD into the exponent."""
    p0, p1, p2, p3 = (_f32_hex(c) for c in coeffs)
    magic = _f32_hex(_MAGIC)
    asm = (
        "{\n\t"
        ".reg .f32 xc, t, n, f, p;\n\t"
        ".reg .b32 ti, pi, e;\n\t"
        f"max.f32 xc, $1, 0fC2FE0000;\n\t"          # clamp at -127
        f"add.rn.f32 t, xc, {magic};\n\t"          # t = 1.5*2^23 + rint(xc)
        f"sub.rn.f32 n, t, {magic};\n\t"           # n = rint(xc) as float
        "sub.rn.f32 f, xc, n;\n\t"                  # f in [-0.5, 0.5]
        f"fma.rn.f32 p, f, {p3}, {p2};\n\t"
        f"fma.rn.f32 p, p, f, {p1};\n\t"
        f"fma.rn.f32 p, p, f, {p0};\n\t"
        "mov.b32 ti, t;\n\t"
        "mov.b32 pi, p;\n\t"
        "shl.b32 e, ti, 23;\n\t"                    # (bits(t) << 23) == n << 23 (mod 2^32)
        "add.s32 pi, pi, e;\n\t"
        "mov.b32 $0, pi;\n\t"
        "}\n"
    )
    return Float32(
        llvm.inline_asm(
            T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], asm, "=f,f",
            has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


def emulated_fragments(n_frag: int, fraction: float) -> tuple:
    """Which of a row's ``n_frag`` register fragments use exp2_poly: round(fraction * n_frag) of them,
    spread evenly so FMA-pipe and MUFU work interleave. Static (Python) so the split is compiled in."""
    n_emu = int(round(float(fraction) * n_frag))
    n_emu = max(0, min(n_frag, n_emu))
    return tuple(i for i in range(n_frag) if ((i + 1) * n_emu) // n_frag > (i * n_emu) // n_frag)


def compiled_fraction(n_frag: int, fraction: float) -> float:
    """The share of exponentials the kernel actually computes with exp2_poly."""
    return len(emulated_fragments(n_frag, fraction)) / n_frag
