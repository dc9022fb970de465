"""CuTe DSL kernel of the shared-memory bandwidth microbenchmark (see smem_cute.py); imports cutlass at
module level (CuTe DSL evaluates annotations, so no ``from __future__ import annotations`` here)."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from experiments.microbench.smem_params import BUF, THREADS, UNROLL, VEC, WINDOW


class SmemBandwidth:
    """CTA = THREADS threads; ``iters`` windows of WINDOW fp32 words per CTA."""

    @cute.jit
    def __call__(self, out: cute.Tensor, iters: Int32, grid: Int32):
        self.kernel(out, iters).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], smem=BUF * 4 + 128)

    @cute.kernel
    def kernel(self, out: cute.Tensor, iters: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        alloc = cutlass.memory.SmemAllocator()
        s = alloc.allocate_tensor(Float32, cute.make_layout((VEC, BUF // VEC)), byte_alignment=16)
        for i in cutlass.range(tidx, BUF // VEC, THREADS):
            for v in cutlass.range_constexpr(VEC):
                s[v, i] = Float32(i * VEC + v) * Float32(1e-6)
        cute.arch.sync_threads()
        acc = cute.make_rmem_tensor((VEC,), Float32)
        acc.fill(0.0)
        frag = cute.make_rmem_tensor((VEC,), Float32)
        for it in cutlass.range(iters, unroll=1):
            base = (it * 37) % (BUF // VEC - WINDOW // VEC)  # slide the window (in 16-byte slots)
            for j in cutlass.range_constexpr(UNROLL):
                col = base + tidx + j * THREADS
                cute.autovec_copy(s[None, col], frag)
                for v in cutlass.range_constexpr(VEC):
                    acc[v] = acc[v] + frag[v]
        out[bidx * THREADS + tidx] = acc[0] + acc[1] + acc[2] + acc[3]
