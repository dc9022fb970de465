"""Backward postprocess (sm_90a, CuTe DSL): dQ = fp32 dQaccum * softmax_scale, converted to the input dtype.

dQaccum is (batch, heads, seqlen_q padded, head_dim) fp32; dQ is (batch, seqlen_q, heads, head_dim). Each
thread converts 8 contiguous elements of one row.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass.cute as cute
from cutlass import Float32


class FlashBwdPostSm90:
    def __init__(self, dtype, hdim: int):
        self.dtype = dtype
        self.hdim = hdim
        self.tpr = hdim // 8
        self.num_threads = 128
        self.rows_per_cta = self.num_threads // self.tpr

    @cute.jit
    def __call__(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream):
        grid = (cute.ceil_div(mdQ.shape[1], self.rows_per_cta), mdQ.shape[2], mdQ.shape[0])
        self.kernel(mdQaccum, mdQ, softmax_scale).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, head, batch = cute.arch.block_idx()
        row = bidx * self.rows_per_cta + tidx // self.tpr
        if row < mdQ.shape[1]:
            gacc = cute.local_tile(mdQaccum[batch, head, row, None], (8,), (tidx % self.tpr,))
            gdQ = cute.local_tile(mdQ[batch, row, head, None], (8,), (tidx % self.tpr,))
            racc = cute.make_rmem_tensor((8,), Float32)
            cute.autovec_copy(gacc, racc)
            rdQ = cute.make_rmem_tensor((8,), self.dtype)
            rdQ.store((racc.load() * softmax_scale).to(self.dtype))
            cute.autovec_copy(rdQ, gdQ)
