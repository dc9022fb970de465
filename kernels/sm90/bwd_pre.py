"""Backward preprocess (sm_90a, CuTe DSL): dPsum = rowsum(dO * O), LSE to the log2 domain, zero fp32 dQaccum.

Rows are padded up to a multiple of the main kernel's tile_m: padded rows get dPsum = 0 and LSE = +inf (so
the recomputed P is 0 there); a row with LSE = -inf (no visible key) gets 0, its scores are all masked anyway.
Each row is handled by head_dim_v/8 threads (8 elements of O and dO each) reduced with warp shuffles; the same
threads zero the row's head_dim fp32 dQaccum columns (8 at a time, in as many passes as head_dim needs).
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

LOG2_E = math.log2(math.e)


class FlashBwdPreSm90:
    def __init__(self, dtype, hdim: int, tile_m: int, hdim_v: int | None = None):
        self.dtype = dtype
        self.hdim = hdim  # dQaccum columns
        self.hdim_v = hdim_v or hdim  # O / dO columns
        self.tpr = self.hdim_v // 8  # threads per row
        self.zero_passes = -(-hdim // self.hdim_v)  # passes of 8 * tpr dQaccum columns each
        self.num_threads = 128
        self.rows_per_cta = self.num_threads // self.tpr
        assert tile_m % self.rows_per_cta == 0 and self.tpr <= 32 and self.tpr & (self.tpr - 1) == 0

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
                 mLSE2: cute.Tensor, mdQaccum: cute.Tensor, stream: cuda.CUstream):
        sqp = mdPsum.shape[2]
        grid = (cute.ceil_div(sqp, self.rows_per_cta), mO.shape[2], mO.shape[0])
        self.kernel(mO, mdO, mLSE, mdPsum, mLSE2, mdQaccum).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
               mLSE2: cute.Tensor, mdQaccum: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, head, batch = cute.arch.block_idx()
        seqlen_q = mO.shape[1]
        row = bidx * self.rows_per_cta + tidx // self.tpr
        col0 = (tidx % self.tpr) * 8
        acc = Float32(0.0)
        if row < seqlen_q:
            gO = cute.local_tile(mO[batch, row, head, None], (8,), (tidx % self.tpr,))
            gdO = cute.local_tile(mdO[batch, row, head, None], (8,), (tidx % self.tpr,))
            rO = cute.make_rmem_tensor((8,), self.dtype)
            rdO = cute.make_rmem_tensor((8,), self.dtype)
            cute.autovec_copy(gO, rO)
            cute.autovec_copy(gdO, rdO)
            prod = rO.load().to(Float32) * rdO.load().to(Float32)
            acc = prod.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
        off = self.tpr // 2
        while cutlass.const_expr(off >= 1):
            acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=off)
            off //= 2
        for j in cutlass.range_constexpr(self.zero_passes):
            if cutlass.const_expr(self.zero_passes == 1):
                gdQ = cute.local_tile(mdQaccum[batch, head, row, None], (8,), (tidx % self.tpr,))
                gdQ.fill(0.0)
            else:
                if col0 + j * self.hdim_v < self.hdim:
                    gdQ = cute.local_tile(mdQaccum[batch, head, row, None], (8,), (tidx % self.tpr + j * self.tpr,))
                    gdQ.fill(0.0)
        if col0 == 0:
            lse2 = Float32(float("inf"))
            if row < seqlen_q:
                lse = mLSE[batch, head, row]
                lse2 = lse * LOG2_E
                if lse == -Float32.inf:
                    lse2 = Float32(0.0)
            mLSE2[batch, head, row] = lse2
            mdPsum[batch, head, row] = acc
