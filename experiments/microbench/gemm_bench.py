"""Dense bf16 tensor-core rate: our Triton GEMM (wgmma on Hopper) and, for reference, torch.matmul (cuBLAS).

The roofline's measured MMA rate is the better of the two (the achievable ceiling of the tensor cores on
this GPU at the clock NVML reports during the run); both rows are written with their method.
"""
from __future__ import annotations

from experiments.microbench.common import bench, per_clk_per_sm

CONFIG = dict(BM=128, BN=256, BK=64, GROUP=8, num_warps=8, num_stages=3)


def compile_for(cc: int = 90, size: int = 4096):
    """Compile the Triton GEMM ahead of time for compute capability ``cc`` (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from experiments.microbench._gemm_kernels import matmul_kernel

    const = {k: CONFIG[k] for k in ("BM", "BN", "BK", "GROUP")}
    src = ASTSource(fn=matmul_kernel, signature={"A": "*bf16", "B": "*bf16", "C": "*bf16", "M": "i32", "N": "i32",
                                                 "K": "i32"}, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": CONFIG["num_warps"], "num_stages": CONFIG["num_stages"]})


def run(writer, facts: dict, size: int = 8192) -> None:
    import torch

    sms = facts["sms"]
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * size**3
    best = None
    variants = []
    try:
        from experiments.microbench._gemm_kernels import matmul_kernel

        grid = ((size // CONFIG["BM"]) * (size // CONFIG["BN"]),)
        kw = {k: CONFIG[k] for k in CONFIG}

        def triton_call():
            matmul_kernel[grid](a, b, c, size, size, size, **kw)

        variants.append(("triton", f"triton tl.dot GEMM {size}^3 bf16->fp32, tile {CONFIG['BM']}x{CONFIG['BN']}x"
                                   f"{CONFIG['BK']}, {CONFIG['num_warps']} warps, {CONFIG['num_stages']} stages",
                         triton_call, lambda: (a.float() @ b.float().T)))
    except Exception as e:
        writer.add(metric="mma_bf16_tflops", value=None, unit="TFLOP/s", method="triton GEMM", status="fail",
                   reason=f"{type(e).__name__}: {e}"[:500])
    variants.append(("cublas", f"torch.matmul (cuBLAS) {size}^3 bf16, A @ B^T", lambda: torch.matmul(a, b.T, out=c),
                     None))
    for name, method, call, _ in variants:
        try:
            call()
            torch.cuda.synchronize()
            if name == "triton":  # correctness spot check on a corner block: a wrong GEMM must not set a peak
                ref = a[:128].float() @ b[:256].float().T
                err = (c[:128, :256].float() - ref).abs().max().item() / ref.abs().max().item()
                if not err < 2e-2:
                    raise RuntimeError(f"triton GEMM wrong: max rel err {err:.3g}")
            ms, clk, reps = bench(call)
            tflops = flops / (ms * 1e-3) / 1e12
            per_clk = per_clk_per_sm(flops / (ms * 1e-3), sms, clk)
            writer.add(metric="mma_bf16_tflops", value=tflops, unit="TFLOP/s", method=method, variant=name,
                       time_ms=ms, reps=reps, clock_mhz=clk)
            writer.add(metric=f"mma_bf16_flops_per_clk_sm_{name}", value=per_clk, unit="FLOP/clk/SM", method=method,
                       variant=name, time_ms=ms, reps=reps, clock_mhz=clk)
            if per_clk is not None and (best is None or per_clk > best[0]):
                best = (per_clk, method, clk)
        except Exception as e:
            writer.add(metric=f"mma_bf16_flops_per_clk_sm_{name}", value=None, unit="FLOP/clk/SM", method=method,
                       variant=name, status="fail", reason=f"{type(e).__name__}: {e}"[:500])
    if best is not None:
        writer.add(metric="mma_bf16_flops_per_clk_sm", value=best[0], unit="FLOP/clk/SM",
                   method=f"best of the GEMM rows: {best[1]}", clock_mhz=best[2])
        writer.add(metric="sm_clock_mhz", value=best[2], unit="MHz",
                   method="NVML SM clock sampled while the best GEMM ran (the clock under tensor-core load)")
