"""exp2 throughput on one GPU: MUFU.EX2, the FMA-pipe polynomial, and the two mixed in eighths (Triton).

Each program holds 8 chunks of U fp32 values and iterates ``x <- 2^(-x)`` on each chunk (values stay in
[0.5, 1]); chunk i uses the polynomial when i < KP, MUFU otherwise, so the emulated fraction is KP/8,
decided at compile time (one kernel per fraction, no per-element branch), as the attention kernels
split a softmax row by register fragments. 8 chunks x U/128 values per thread are independent chains.

MUFU: ``ex2.approx.ftz.f32`` by inline PTX (the negation is one FADD on the FMA pipe, as the softmax's
FFMA would be). Polynomial: the repo's software exp2 (kernels/exp2_model.py): clamp, 1.5*2^23 magic-add
rounding, f in [-0.5, 0.5], degree-3 Horner in FFMA, 2^n added into the exponent bits with an integer
shift-add. No float->int conversion, so nothing should reach the MUFU/XU pipe: ``sass_counts`` reports
the F2I / FRND / MUFU counts of each compiled variant (SASS when a disassembler is found, else PTX).
"""
from __future__ import annotations

import re

from experiments.microbench.common import bench, per_clk_per_sm

MAGIC = 12582912.0  # 1.5 * 2**23
FRACTIONS_KP = (0, 1, 2, 3, 4, 8)  # emulated eighths: MUFU only, 1/8, 1/4, 3/8, 1/2, polynomial only
CHUNKS = 8


def _coeffs() -> tuple[float, float, float]:
    try:
        from kernels.exp2_model import EXP2_POLY_COEFFS

        c = EXP2_POLY_COEFFS[3]
        return float(c[1]), float(c[2]), float(c[3])
    except Exception:
        # same minimax fit (f in [-0.5, 0.5], p0 = 1) as kernels/exp2_model.py, for a checkout without it
        return 0.6932829022407532, 0.2422110140323639, 0.05500895157456398


_KERNEL = {}


def kernel():
    """The Triton kernel (imported on first use: triton is only needed on the GPU host)."""
    if "k" not in _KERNEL:
        from experiments.microbench._exp2_kernels import exp2_chain_kernel

        _KERNEL["k"] = exp2_chain_kernel
    return _KERNEL["k"]


def constexprs(kp: int, u: int = 256) -> dict:
    c1, c2, c3 = _coeffs()
    return dict(KP=kp, U=u, C1=c1, C2=c2, C3=c3)


def compile_for(kp: int, cc: int = 90, u: int = 256, num_warps: int = 4):
    """Compile one variant ahead of time for compute capability ``cc`` (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel(), signature={"X": "*fp32", "Y": "*fp32", "iters": "i32"},
                    constexprs=constexprs(kp, u))
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": num_warps})


SASS_OPS = ("F2I", "FRND", "MUFU", "FFMA", "FADD", "FMNMX", "LEA", "SHF", "IADD3")


def sass_counts(compiled) -> dict:
    """Opcode counts in a compiled Triton kernel: from SASS (nvdisasm) when available, else PTX
    (cvt.rni/rzi/rmi/rpi and cvt.*s32.f32 would become FRND / F2I; ex2.approx becomes MUFU)."""
    asm = getattr(compiled, "asm", {}) or {}
    sass = None
    try:
        sass = asm["sass"]
    except Exception:
        sass = None
    if not sass and "cubin" in asm:
        sass = _disassemble(asm["cubin"])
    if sass:
        ops = _opcodes(sass)
        out = {op: sum(1 for o in ops if o == op) for op in SASS_OPS}
        out["source"] = "sass"
        return out
    ptx = asm.get("ptx", "")
    out = dict.fromkeys(SASS_OPS, None)
    out.update(F2I=len(re.findall(r"cvt\.rzi?\.s32\.f32|cvt\.rni\.s32\.f32|cvt\.rmi\.s32|cvt\.rpi\.s32", ptx)),
               FRND=len(re.findall(r"cvt\.r[nmpz]i\.f32\.f32", ptx)),
               MUFU=len(re.findall(r"ex2\.approx", ptx)), source="ptx")
    return out


def _opcodes(sass: str) -> list[str]:
    """Opcode of every instruction line, for nvdisasm's and Triton's SASS listings alike."""
    ops = []
    for line in sass.splitlines():
        line = re.sub(r"/\*.*?\*/", " ", line)
        line = re.sub(r"^\s*[-0-9A-Fa-fY]+(?::[-0-9A-Fa-fY]+){4}\s+", "", line)  # Triton's control codes
        m = re.match(r"\s*(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(?=[.\s;]|$)", line)
        if m:
            ops.append(m.group(1))
    return ops


def _disassemble(cubin: bytes) -> str | None:
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("nvdisasm")
    if exe is None:
        try:
            import nvidia.cu13 as _cu  # pip nvidia-cuda-nvdisasm (CUDA 13)
            from pathlib import Path

            cand = Path(list(_cu.__path__)[0]) / "bin" / "nvdisasm"
            exe = str(cand) if cand.exists() else None
        except Exception:
            exe = None
    if exe is None:
        try:
            import triton
            from pathlib import Path

            cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
            exe = str(cand) if cand.exists() else None
        except Exception:
            exe = None
    if exe is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            r = subprocess.run([exe, "-c", f.name], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
    return r.stdout if r.returncode == 0 else None


def run(writer, facts: dict, *, iters: int = 1024, u: int = 256, num_warps: int = 4, waves: int = 16) -> None:
    """Measure every variant in FRACTIONS_KP and write one row each (plus a SASS check row)."""
    import torch

    k = kernel()
    sms = facts["sms"]
    grid = sms * waves
    n = grid * CHUNKS * u
    x = torch.rand(n, device="cuda", dtype=torch.float32) * 0.5 + 0.5
    y = torch.empty_like(x)
    for kp in FRACTIONS_KP:
        frac = kp / CHUNKS
        metric = {0: "mufu_ex2", CHUNKS: "poly_exp2"}.get(kp, "mix_exp2")
        method = (f"triton chain x<-2^-x, {CHUNKS} chunks x {u} fp32/program, {kp}/8 polynomial "
                  f"(magic-add, deg-3 Horner), rest ex2.approx.ftz; grid {grid}, {iters} iters, {num_warps} warps")
        try:
            c = k[(grid,)](x, y, iters, num_warps=num_warps, **constexprs(kp, u))

            def call():
                k[(grid,)](x, y, iters, num_warps=num_warps, **constexprs(kp, u))

            ms, clk, reps = bench(call)
            rate = n * iters / (ms * 1e-3)
            writer.add(metric=f"{metric}_rate", value=rate / 1e9, unit="Gexp/s", method=method, fraction=frac,
                       time_ms=ms, reps=reps, clock_mhz=clk)
            writer.add(metric=f"{metric}_per_clk_sm", value=per_clk_per_sm(rate, sms, clk), unit="exp/clk/SM",
                       method=method, fraction=frac, time_ms=ms, reps=reps, clock_mhz=clk)
            if kp in (0, CHUNKS):
                import torch

                major, minor = torch.cuda.get_device_capability()
                # the launched kernel's own listing when Triton returns it, else the same source compiled AOT
                counts = sass_counts(c if getattr(c, "asm", None) else compile_for(kp, 10 * major + minor, u, num_warps))
                bad = (counts.get("F2I") or 0) + (counts.get("FRND") or 0)
                writer.add(metric=f"{metric}_sass_f2i_frnd", value=bad, unit="instructions",
                           method=f"opcode count in the compiled kernel ({counts['source']}): {counts}",
                           fraction=frac, status="ok" if bad == 0 else "fail",
                           reason=None if bad == 0 else "F2I/FRND found: they run on the MUFU/XU pipe")
        except Exception as e:  # one failing variant must not stop the others
            writer.add(metric=f"{metric}_per_clk_sm", value=None, unit="exp/clk/SM", method=method, fraction=frac,
                       status="fail", reason=f"{type(e).__name__}: {e}"[:500])

