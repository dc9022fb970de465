"""exp2 building blocks for the sm90 kernels: MUFU.EX2 and the FMA-pipe polynomial (software exp2).

Stable API (the backward kernel imports these names; keep them):
  ``exp2_mufu(x)``          -> 2**x on the MUFU pipe (ex2.approx.ftz.f32)
  ``exp2_poly(x, coeffs)``  -> 2**x on the FMA/ALU pipes only, ``coeffs`` = (1, p1, p2, p3) of 2**f, f in [-0.5, 0.5]
  ``exp2_poly_affine(s, a, b, coeffs)`` -> the same with the softmax's x = s*scale_log2 - m_s folded into its first
                              FFMA; ``affine_args(scale_log2, m_s)`` -> (a, b) (the forward's emulated fragments)
  ``emulated_fragments(n_frag, fraction)`` -> static tuple of fragment indices that use the polynomial
  ``compiled_fraction(n_frag, fraction)``  -> the share those fragments really are (whole fragments)
  ``POLY_COEFFS``           -> the degree-3 coefficients used by default (from kernels.exp2_model)

The polynomial is Cody-Waite range reduction written so that nothing lands on the MUFU pipe and nothing needs a
clamp instruction, bit for bit the scheme of kernels/exp2_model.py (the oracle; its docstring has the derivation):
u = sat(x/256 + 127/256) (FFMA.SAT: the clamp to [-127, 129]; -inf and NaN give u = 0 and the result +0.0),
t = 256 u + (1.5*2^23 - 127) (FFMA: the magic-add round, no F2I / FRND), d = (1.5*2^23 - 127) - t (FADD),
f = 256 u + d = x - n in [-0.5, 0.5] (FFMA), Horner on EXP2_POLY_COEFFS[3] (3 FFMA), and 2^n added straight into
the exponent bits (shl + add: one LEA). Seven instructions, no FMNMX; in the forward the FFMA.SAT also replaces the
FFMA that computes x for MUFU, so an emulated exponential costs 6 FMA-pipe ops + 1 LEA over a MUFU one (was 7 + 1:
FMNMX, 3 FADD, 3 FFMA, LEA). Domain x <= 128 (softmax arguments are <= tau <= 64; backward ones <= ~0).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

_MAGIC = 12582912.0  # 1.5 * 2**23: adding it leaves round(x) in the low mantissa bits

from ..exp2_model import EXP2_CLAMP_LO, EXP2_POLY_COEFFS, EXP2_SPAN, MAGIC_ROUND, T_BIAS

POLY_COEFFS = tuple(float(c) for c in EXP2_POLY_COEFFS[3])  # the model's coefficients, f in [-0.5, 0.5]
assert POLY_COEFFS[0] == 1.0 and MAGIC_ROUND == _MAGIC and EXP2_SPAN == 256.0 and EXP2_CLAMP_LO == -127.0
_T_BIAS = T_BIAS  # 1.5*2^23 - 127: t = _T_BIAS + rint(256 u) = 1.5*2^23 + rint(x)


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


def _poly_asm(u_line: str, coeffs: tuple) -> str:
    """PTX of the clamp-free scheme after its first instruction ``u_line`` (which leaves u in [0, 1])."""
    p0, p1, p2, p3 = (_f32_hex(c) for c in coeffs)
    span, bias = _f32_hex(EXP2_SPAN), _f32_hex(_T_BIAS)
    return (
        "{\n\t"
        ".reg .f32 u, t, d, f, p;\n\t"
        ".reg .b32 ti, pi, e;\n\t"
        f"{u_line}\n\t"                            # u = sat((x + 127) / 256): clamp folded into the first FMA
        f"fma.rn.f32 t, u, {span}, {bias};\n\t"      # t = (1.5*2^23 - 127) + rint(256 u) = 1.5*2^23 + n
        f"sub.rn.f32 d, {bias}, t;\n\t"              # d = -rint(256 u) (exact: integers)
        f"fma.rn.f32 f, u, {span}, d;\n\t"           # f = 256 u - rint(256 u) = x - n in [-0.5, 0.5]
        f"fma.rn.f32 p, f, {p3}, {p2};\n\t"
        f"fma.rn.f32 p, p, f, {p1};\n\t"
        f"fma.rn.f32 p, p, f, {p0};\n\t"
        "mov.b32 ti, t;\n\t"
        "mov.b32 pi, p;\n\t"
        "shl.b32 e, ti, 23;\n\t"                    # (bits(t) << 23) == n << 23 (mod 2^32)
        "add.s32 pi, pi, e;\n\t"                    # shl + add: one LEA
        "mov.b32 $0, pi;\n\t"
        "}\n"
    )


def _asm_f32(asm: str, args: list, loc=None, ip=None) -> Float32:
    return Float32(
        llvm.inline_asm(
            T.f32(), [Float32(a).ir_value(loc=loc, ip=ip) for a in args], asm, "=f" + ",f" * len(args),
            has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def exp2_poly(x: Float32, coeffs: tuple = POLY_COEFFS, *, loc=None, ip=None) -> Float32:
    """2**x on the FMA pipe, x already scaled: FFMA.SAT, FFMA, FADD, FFMA, 3 FFMA (Horner), LEA. No FMNMX."""
    u_line = f"fma.rn.sat.f32 u, $1, {_f32_hex(1.0 / EXP2_SPAN)}, {_f32_hex(-EXP2_CLAMP_LO / EXP2_SPAN)};"
    return _asm_f32(_poly_asm(u_line, coeffs), [x], loc=loc, ip=ip)


@dsl_user_op
def exp2_poly_affine(s: Float32, a: Float32, b: Float32, coeffs: tuple = POLY_COEFFS, *, loc=None, ip=None) -> Float32:
    """2**(256 * (s*a + b) - 127) on the FMA pipe, the softmax's scale and row offset folded into the first FMA.

    With ``(a, b) = affine_args(scale_log2, m_s)`` this is 2**(s * scale_log2 - m_s) (the forward's P) for the cost
    of exp2_poly minus the separate FFMA that computes x: FFMA.SAT (replaces it), FFMA, FADD, 4 FFMA, LEA."""
    return _asm_f32(_poly_asm("fma.rn.sat.f32 u, $1, $2, $3;", coeffs), [s, a, b], loc=loc, ip=ip)


@dsl_user_op
def affine_args(scale_log2: Float32, m_s: Float32, *, loc=None, ip=None):
    """(a, b) for exp2_poly_affine: a = scale_log2 / 256 (exact), b = (127 - m_s) / 256 (one FFMA per row)."""
    a = Float32(scale_log2) * Float32(1.0 / EXP2_SPAN)
    b = Float32(m_s) * Float32(-1.0 / EXP2_SPAN) + Float32(-EXP2_CLAMP_LO / EXP2_SPAN)
    return a, b


def emulated_fragments(n_frag: int, fraction: float) -> tuple:
    """Which of a row's ``n_frag`` register fragments use exp2_poly: round(fraction * n_frag) of them,
    spread evenly so FMA-pipe and MUFU work interleave. Static (Python) so the split is compiled in."""
    n_emu = int(round(float(fraction) * n_frag))
    n_emu = max(0, min(n_frag, n_emu))
    return tuple(i for i in range(n_frag) if ((i + 1) * n_emu) // n_frag > (i * n_emu) // n_frag)


def compiled_fraction(n_frag: int, fraction: float) -> float:
    """The share of exponentials the kernel actually computes with exp2_poly."""
    return len(emulated_fragments(n_frag, fraction)) / n_frag
