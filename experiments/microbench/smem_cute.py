"""Shared-memory load bandwidth (CuTe DSL kernel of our own).

Each CTA fills a 64 KiB fp32 buffer in shared memory, then every thread repeatedly loads 16-byte vectors
(LDS.128) at consecutive 16-byte slots across the warp (no bank conflicts) from a window whose base moves
every iteration (so the loads cannot be hoisted out of the loop), summing them into registers; one value
per thread is stored at the end so nothing is dead. Bytes loaded / time / SMs / clock = bytes per clock
per SM. Needs CUTLASS DSL 4.x and a GPU to run; compiles anywhere (``compile_for``).
"""
from __future__ import annotations

from experiments.microbench.smem_params import BUF, THREADS, UNROLL, VEC, WINDOW  # noqa: F401


def _build():
    from experiments.microbench._smem_kernel import SmemBandwidth

    return SmemBandwidth()


def bytes_per_launch(grid: int, iters: int) -> int:
    return grid * iters * WINDOW * 4


def compile_for(arch: str = "sm_90a"):
    """Compile for ``arch`` without a GPU; returns the compiled object (keep artefacts via CUTE_DSL_KEEP)."""
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    op = _build()
    out = make_fake_compact_tensor(cutlass.Float32, (THREADS * 4,), assumed_align=16)
    return cute.compile(op, out, cutlass.Int32(16), cutlass.Int32(4))


def run(writer, facts: dict, iters: int = 2048, waves: int = 4) -> None:
    import torch

    from experiments.microbench.common import bench, per_clk_per_sm

    method = (f"CuTe DSL kernel: {THREADS} threads/CTA, LDS.128 at consecutive 16 B slots, sliding "
              f"{WINDOW * 4 // 1024} KiB window, {iters} iters, grid {waves} x SMs")
    try:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import from_dlpack

        sms = facts["sms"]
        grid = sms * waves
        out = torch.empty(grid * THREADS, device="cuda", dtype=torch.float32)
        op = _build()
        t_out = from_dlpack(out, assumed_align=16)
        compiled = cute.compile(op, t_out, cutlass.Int32(iters), cutlass.Int32(grid))

        def call():
            compiled(t_out, cutlass.Int32(iters), cutlass.Int32(grid))

        call()
        torch.cuda.synchronize()
        if not torch.isfinite(out).all():
            raise RuntimeError("smem kernel produced non-finite sums")
        ms, clk, reps = bench(call)
        rate = bytes_per_launch(grid, iters) / (ms * 1e-3)
        writer.add(metric="smem_load_tb_s", value=rate / 1e12, unit="TB/s", method=method, time_ms=ms, reps=reps,
                   clock_mhz=clk)
        writer.add(metric="smem_bytes_per_clk_sm", value=per_clk_per_sm(rate, sms, clk), unit="B/clk/SM",
                   method=method, time_ms=ms, reps=reps, clock_mhz=clk)
    except Exception as e:
        writer.add(metric="smem_bytes_per_clk_sm", value=None, unit="B/clk/SM", method=method, status="fail",
                   reason=f"{type(e).__name__}: {e}"[:500])
