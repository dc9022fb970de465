"""Software exp2 on the FMA pipe for the backward's recomputation of P (sm_90a).

2^x = 2^n * 2^f with n = floor(x), f in [0, 1): the floor comes from one round-toward-minus-infinity add of
the magic constant 1.5 * 2^23 (no F2I / FRND, which share MUFU's pipe), 2^f from a degree-3 Horner
polynomial (p0 = 1, p1..p3 the DESIGN.md coefficients), and 2^n is added straight into the exponent bits.
x is clamped at -127 so masked (-inf) inputs give ~1e-38 rather than NaN; inputs are <= 0 in the backward.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# Degree-3 minimax fit of 2^f on [0, 1) (p0 = 1); DESIGN.md: p1~0.6951, p2~0.2276, p3~0.0771.
EXP2_POLY = (1.0, 0.6951461434, 0.2275643945, 0.0771190897)
_MAGIC = 12582912.0  # 1.5 * 2**23


@dsl_user_op
def exp2_poly(x: Float32, *, loc=None, ip=None) -> Float32:
    """2**x for x <= 127 with FFMA/FADD/integer ops only (compiled SASS has no MUFU, F2I or FRND)."""
    p0, p1, p2, p3 = EXP2_POLY
    asm = (
        "{\n\t.reg .f32 xc, t, n, f, p;\n\t.reg .b32 ti, pi;\n\t"
        "max.f32 xc, $1, 0fC2FE0000;\n\t"  # clamp at -127
        f"add.rm.f32 t, xc, {_f32hex(_MAGIC)};\n\t"  # t = 1.5*2^23 + floor(x)
        f"sub.f32 n, t, {_f32hex(_MAGIC)};\n\t"
        "sub.f32 f, xc, n;\n\t"
        f"fma.rn.f32 p, f, {_f32hex(p3)}, {_f32hex(p2)};\n\t"
        f"fma.rn.f32 p, p, f, {_f32hex(p1)};\n\t"
        f"fma.rn.f32 p, p, f, {_f32hex(p0)};\n\t"
        "mov.b32 ti, t;\n\tmov.b32 pi, p;\n\t"
        "shl.b32 ti, ti, 23;\n\t"
        "add.s32 pi, pi, ti;\n\t"
        "mov.b32 $0, pi;\n\t}"
    )
    return Float32(
        llvm.inline_asm(
            T.f32(),
            [Float32(x).ir_value(loc=loc, ip=ip)],
            asm,
            "=f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


def _f32hex(v: float) -> str:
    import struct

    return "0f%08X" % struct.unpack("<I", struct.pack("<f", float(v)))[0]


def emulated_groups(fraction: float, groups: int) -> int:
    """How many of a thread's ``groups`` register fragments use the polynomial (whole fragments only)."""
    return int(round(float(fraction) * groups))
