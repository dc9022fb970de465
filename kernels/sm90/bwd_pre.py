"""Backward preprocess (sm_90a, CuTe DSL): dPsum = rowsum(dO * O), LSE to the log2 domain, zero fp32 dQaccum.

Rows are padded up to a multiple of the main kernel's tile_m: padded rows get dPsum = 0 and LSE = +inf (so
the recomputed P is 0 there); a row with LSE = -inf (no visible key) gets 0, its scores are all masked anyway.
Each row is handled by head_dim_v/8 threads (8 elements of O and dO each) reduced with warp shuffles; the same
threads zero the row's head_dim fp32 dQaccum columns (8 at a time, in as many passes as head_dim needs).

``pdl=True`` (AttnConfig.bwd_pdl, opt-in; not varlen): programmatic dependent launch, see backward.py's
``attention_backward``. The kernel is launched with the programmaticStreamSerialization attribute, so it may start
while the previous kernel in the stream is still running: every thread first executes griddepcontrol.wait (the
previous grid complete and its memory visible) before touching global memory -- reads of O / dO / LSE and writes
of the scratch buffers alike (the caching allocator may hand out memory a preceding kernel still uses). Right after
it, griddepcontrol.launch_dependents: the main kernel (launched with the same attribute) may then launch once every
CTA of this grid has started. Early is harmless here: a main CTA needs a whole SM (all registers, ~200 KB shared
memory), so it only takes SMs the preprocess has left, and the dependent grid launches only after the last
preprocess CTA is resident. The main kernel waits (griddepcontrol.wait) before it reads what this kernel writes.

``call_stream`` (AttnConfig.bwd_stream_post, with ``pdl``): also zeroes the main kernel's per-unit dQ completion
counters (``unit_rows`` Q rows each, bwd_post.py ``stream``) of its rows, and only then (after a GPU-scope fence and a
CTA barrier) signals launch_dependents: the streaming postprocess, which launches after every main CTA has started and
so after every preprocess CTA has signalled, never reads a counter from before this call. ``claim``
(AttnConfig.bwd_dq_claim): leaves dQaccum as it is (the main kernel's first writer per unit, or a deterministic tile's
turn 0, stores instead of adding: bwd.py _set_dq_claim); ``call_stream`` zeroes the units' claim states too (the second
half of the same array).
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

LOG2_E = math.log2(math.e)


@cute.jit
def varlen_pad_offset(offset_q: Int32, batch: Int32, tile_m: cutlass.Constexpr[int]) -> Int32:
    """Varlen: the first padded row of sequence ``batch`` in the (h, total_q_pad) LSE / dPsum and dQaccum buffers,
    (cu_seqlens_q[b] + b * tile_m) rounded down to a multiple of tile_m. Each sequence's ceil(seqlen / tile_m) tile
    slots then end at or before the next sequence's first one (the rounding loses < tile_m, the added tile_m per
    sequence covers it), and total_q_pad = (total_q + b * tile_m) rounded up to tile_m holds them all."""
    return (offset_q + batch * tile_m) // tile_m * tile_m


class FlashBwdPreSm90:
    def __init__(self, dtype, hdim: int, tile_m: int, hdim_v: int | None = None, varlen: bool = False,
                 pdl: bool = False, claim: bool = False):
        self.dtype = dtype
        self.claim = bool(claim)  # dQaccum not zeroed; call_stream: the claim states zeroed (module docstring)
        assert not self.claim or pdl
        self.pdl = bool(pdl)  # programmatic dependent launch (module docstring); the plain launch only
        assert not (self.pdl and varlen), "pdl: the plain (non-varlen) launch only"
        self.tile_m = tile_m
        self.varlen = bool(varlen)  # packed sequences + padded per-sequence tile slots: call_varlen
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
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.jit
    def call_stream(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
                    mLSE2: cute.Tensor, mdQaccum: cute.Tensor, mSem: cute.Tensor, unit_rows: cutlass.Constexpr[int],
                    stream: cuda.CUstream):
        """__call__ that also zeroes mSem (batch, heads, padded rows / unit_rows) before signalling (module docstring)."""
        assert self.pdl, "call_stream: the PDL launch only"
        sqp = mdPsum.shape[2]
        grid = (cute.ceil_div(sqp, self.rows_per_cta), mO.shape[2], mO.shape[0])
        self.kernel_stream(mO, mdO, mLSE, mdPsum, mLSE2, mdQaccum, mSem, unit_rows).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True)

    @cute.jit
    def call_varlen(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
                    mLSE2: cute.Tensor, mdQaccum: cute.Tensor, mCuSeqlensQ: cute.Tensor, max_seqlen_q: Int32,
                    stream: cuda.CUstream):
        """Varlen launch: packed mO / mdO (total_q, h, dv), mLSE (h, total_q); padded mdPsum / mLSE2 (h, total_q_pad),
        mdQaccum (h, total_q_pad, d), where sequence b owns the tile slots from padded row
        varlen_pad_offset(cu_seqlens_q[b], b, tile_m) on (ceil(seqlen / tile_m) tiles; kernels/sm90/backward.py).
        Grid (rows of max_seqlen_q rounded up to tile_m / rows_per_cta, h, b)."""
        assert self.varlen, "call_varlen needs FlashBwdPreSm90(varlen=True)"
        m_pad = (max_seqlen_q + self.tile_m - 1) // self.tile_m * self.tile_m
        grid = ((m_pad + self.rows_per_cta - 1) // self.rows_per_cta, mO.shape[1], mCuSeqlensQ.shape[0] - 1)
        self.kernel_varlen(mO, mdO, mLSE, mdPsum, mLSE2, mdQaccum, mCuSeqlensQ).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel_varlen(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
                      mLSE2: cute.Tensor, mdQaccum: cute.Tensor, mCuSeqlensQ: cute.Tensor):
        """As ``kernel`` for one sequence of a packed batch: rows of the sequence's padded tile slots (a whole CTA is
        in one tile, so it is in or out as one); rows past the sequence's end get LSE +inf, dPsum 0, dQaccum 0."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, head, batch = cute.arch.block_idx()
        offset_q = mCuSeqlensQ[batch]
        seqlen_q = mCuSeqlensQ[batch + 1] - offset_q
        pad_q = varlen_pad_offset(offset_q, batch, self.tile_m)
        row = bidx * self.rows_per_cta + tidx // self.tpr
        if bidx * self.rows_per_cta < (seqlen_q + self.tile_m - 1) // self.tile_m * self.tile_m:
            col0 = (tidx % self.tpr) * 8
            acc = Float32(0.0)
            if row < seqlen_q:
                gO = cute.local_tile(mO[offset_q + row, head, None], (8,), (tidx % self.tpr,))
                gdO = cute.local_tile(mdO[offset_q + row, head, None], (8,), (tidx % self.tpr,))
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
            prow = pad_q + row
            for j in cutlass.range_constexpr(self.zero_passes):
                if cutlass.const_expr(self.zero_passes == 1):
                    gdQ = cute.local_tile(mdQaccum[head, prow, None], (8,), (tidx % self.tpr,))
                    gdQ.fill(0.0)
                else:
                    if col0 + j * self.hdim_v < self.hdim:
                        gdQ = cute.local_tile(mdQaccum[head, prow, None], (8,), (tidx % self.tpr + j * self.tpr,))
                        gdQ.fill(0.0)
            if col0 == 0:
                lse2 = Float32(float("inf"))
                if row < seqlen_q:
                    lse = mLSE[head, offset_q + row]
                    lse2 = lse * LOG2_E
                    if lse == -Float32.inf:
                        lse2 = Float32(0.0)
                mLSE2[head, prow] = lse2
                mdPsum[head, prow] = acc

    @cute.kernel
    def kernel_stream(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
                      mLSE2: cute.Tensor, mdQaccum: cute.Tensor, mSem: cute.Tensor, unit_rows: cutlass.Constexpr[int]):
        """``kernel`` with the counters of units starting in this CTA's rows zeroed before the signal."""
        cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        bidx, head, batch = cute.arch.block_idx()
        if tidx < self.rows_per_cta:
            row = bidx * self.rows_per_cta + tidx
            if row % unit_rows == 0 and row < mdPsum.shape[2]:
                mSem[batch, head, row // unit_rows] = Int32(0)
                if cutlass.const_expr(self.claim):  # the unit's claim state (the array's second half)
                    mSem[batch, head, mSem.shape[2] // 2 + row // unit_rows] = Int32(0)
                cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        cute.arch.griddepcontrol_launch_dependents()
        self.rows(mO, mdO, mLSE, mdPsum, mLSE2, mdQaccum)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor,
               mLSE2: cute.Tensor, mdQaccum: cute.Tensor):
        if cutlass.const_expr(self.pdl):  # before any global access: the previous grid done (module docstring)
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        self.rows(mO, mdO, mLSE, mdPsum, mLSE2, mdQaccum)

    @cute.jit
    def rows(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdPsum: cute.Tensor, mLSE2: cute.Tensor,
             mdQaccum: cute.Tensor):
        """This CTA's rows: dPsum, LSE in the log2 domain, dQaccum zeroed (module docstring)."""
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
        for j in cutlass.range_constexpr(0 if self.claim else self.zero_passes):
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
