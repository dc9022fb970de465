"""Backward postprocess (sm_90a, CuTe DSL): dQ = fp32 dQaccum * softmax_scale, converted to the input dtype.

dQaccum is a (batch, heads, seqlen_q padded, head_dim) fp32 buffer in one of two orders:
- ``blocked=False`` (row-major; used by no kernel now): each thread converts 8 elements of a row.
- ``blocked=True`` (the main kernels' bulk reductions): per Q tile, ``chunks`` chunks (one per dQ GEMM of an MMA
  warpgroup) each holding one thread's dQ accumulator fragment (values grouped by 4, thread-minor); chunk c covers
  columns [c*hdim/chunks, ...) of a 64-row tile, or rows [64c, 64c+64) of a 128-row tile (FlashBwdSm90: 2 chunks,
  one per warpgroup; FlashBwdWideSm90 at hd256: 4, each warpgroup's half of the head dim in two GEMMs); with
  ``transposed`` chunk c is dQ^T of shape ``dq_shape`` = (head-dim rows, Q rows): 80-row tiles (2 chunks of 64 x 80,
  head-dim rows [64c, ...)); two_cta (4 chunks of 64 x 32, chunk 2 * rank + w of CTA rank's warpgroup w: the head-dim
  halves of Q rows [32 rank, ...) at hd128, Q rows [32c, ...) with the whole head dim at hd64). The
  postprocess rebuilds the same wgmma tiled MMA to recover each value's (row, column), one warpgroup per chunk,
  puts the converted tile into shared memory and stores it to dQ (batch, seqlen_q, heads, hdim) in 16-byte row
  pieces. (Scattering 2-byte values straight to global memory, as before, took 154-194 us per call at 16k tokens,
  hidden 2048, against official FA4's 49 us; H200, torch.profiler.)

``pdl=True`` (AttnConfig.bwd_pdl, opt-in; not varlen): launched with the programmaticStreamSerialization attribute
after the main kernel, which signals launch_dependents at the start of each CTA (bwd.py FlashBwdSm90._set_pdl), so
this grid may launch while the main kernel's last CTAs still run: every thread executes griddepcontrol.wait (the main
grid complete and its dQaccum reductions visible) before any global access. It signals nothing itself (whatever
follows in the stream is launched without the attribute and waits for this grid as usual).

``stream=True`` (AttnConfig.bwd_stream_post, with ``pdl``; launched through ``call_stream``): no grid-wide wait. The
main kernel's writer counts, per dQ row unit (``unit_rows``: the Q tile, or 8 rows under diag_align), the K/V tiles
whose reductions into it have completed (bwd.py _set_stream_post); lanes of warp 0 spin (acquire loads, GPU scope)
until each unit of this CTA's tile below seqlen_q has the count of K/V tiles that visit it -- all of them, or causal
(bottom-right) those n with n tile_n < r0 + unit_rows + seqlen_k - seqlen_q -- and the CTA then converts the tile. The
counters were zeroed by the preprocess before it let the main grid launch, so before this grid could. Causal rows
below seqlen_q - seqlen_k see no key: dQ = 0 there, written without reading dQaccum (their zeros come from the
preprocess, which may still be running). One CTA waits for the main grid at its end (griddepcontrol.wait), so this
grid completes after it, as the stream order promises whatever comes next.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.cute.nvgpu import OperandMajorMode

from .bwd_dq_writer import stream_unit_count
from .bwd_pre import varlen_pad_offset


@dsl_user_op
def nanosleep(ns: int, *, loc=None, ip=None) -> None:
    """nanosleep.u32: suspend the thread for about ``ns`` nanoseconds (a spin loop's back-off)."""
    llvm.inline_asm(None, [Int32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;", "r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class FlashBwdPostSm90:
    def __init__(self, dtype, hdim: int, tile_m: int = 64, blocked: bool = False, chunks: int = 2,
                 transposed: bool = False, varlen: bool = False, dq_shape: tuple | None = None, pdl: bool = False,
                 chunk_major: bool = False, stream: bool = False, unit_rows: int = 0, causal: bool = False,
                 tile_n: int = 128):
        self.dtype = dtype
        # stream (module docstring): per-unit completion counts instead of griddepcontrol.wait; unit_rows divides
        # tile_m; causal / tile_n: the main kernel's, for the counts each unit waits for
        self.stream = bool(stream)
        assert not self.stream or (pdl and not varlen and blocked and unit_rows and tile_m % unit_rows == 0)
        self.unit_rows, self.causal, self.tile_n = int(unit_rows), bool(causal), int(tile_n)
        self.spin_ns = 500  # back-off per unfinished poll
        # chunk_major (the main kernel's diag_align, bwd.py _set_diag_align): dQaccum (rows, d) holds chunk c of every
        # Q row before chunk c + 1, chunk c of tile m at (c * rows + m * tile_m) * dq_shape[0] floats (transposed,
        # one-CTA tiles, not varlen); otherwise a tile's chunks are stored back to back
        self.chunk_major = bool(chunk_major)
        assert not self.chunk_major or (transposed and blocked and not varlen and dq_shape is None), "chunk_major"
        self.pdl = bool(pdl)  # programmatic dependent launch after the main kernel (module docstring)
        assert not (self.pdl and varlen), "pdl: the plain (non-varlen) launch only"
        self.varlen = bool(varlen)  # packed dQ (total_q, h, d), padded per-sequence dQaccum slots: call_varlen
        assert not self.varlen or blocked
        self.hdim = hdim
        self.tile_m = tile_m
        self.blocked = blocked
        self.chunks = chunks
        self.transposed = bool(transposed)
        self.tpr = hdim // 8
        self.num_threads = 128 * chunks if blocked else 128
        self.rows_per_cta = self.num_threads // self.tpr
        # as the main kernel's dQ GEMM: 64-row tiles split the head dim into chunks, 128-row tiles the rows in two;
        # transposed (80-row tiles): chunk c is dQ^T of head-dim rows [c*hdim/chunks, ...) x all tile_m Q rows
        # dq_shape given (two_cta, transposed): chunks of (head-dim rows, Q rows) tiling the head dim first, then the
        # tile's Q rows (chunk c at head-dim row (c % d_chunks) * dq_shape[0], Q row (c // d_chunks) * dq_shape[1])
        if dq_shape is not None:
            assert self.transposed and chunks * dq_shape[0] * dq_shape[1] == tile_m * hdim, (dq_shape, chunks)
            self.dq_shape = tuple(dq_shape)
        elif self.transposed:
            self.dq_shape = (hdim // chunks, tile_m)
        else:
            self.dq_shape = (tile_m, hdim // chunks) if tile_m == 64 else (64, hdim)
        assert tile_m == 64 or chunks == 2 or dq_shape is not None
        self.d_chunks = hdim // self.dq_shape[0] if self.transposed else chunks  # chunks across the head dim
        assert tile_m != 80 or self.transposed or not blocked
        assert not blocked or (tile_m * hdim // 8) % self.num_threads == 0
        self.dq_vals = self.dq_shape[0] * self.dq_shape[1] // 128
        # offset of warpgroup w's chunk in the tile: (w * row_step, w * col_step)
        self.row_step = self.dq_shape[0] if self.dq_shape[0] < tile_m else 0
        self.col_step = self.dq_shape[1] if self.dq_shape[1] < hdim else 0

    def dq_mma(self):
        """The main kernel's dQ (or dQ^T) wgmma tiled MMA: its partition gives each blocked value's (row, column)."""
        return sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.MN, OperandMajorMode.MN,
                                                 Float32, (1, 1, 1), self.dq_shape)

    @cute.jit
    def __call__(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream):
        if cutlass.const_expr(self.blocked):
            mma_dQ = self.dq_mma()
            grid = (cute.ceil_div(mdQ.shape[1], self.tile_m), mdQ.shape[2], mdQ.shape[0])
            self.kernel_blocked(mdQaccum, mdQ, softmax_scale, mma_dQ).launch(
                grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=self.pdl)
        else:
            grid = (cute.ceil_div(mdQ.shape[1], self.rows_per_cta), mdQ.shape[2], mdQ.shape[0])
            self.kernel(mdQaccum, mdQ, softmax_scale).launch(grid=grid, block=[self.num_threads, 1, 1],
                                                             stream=stream, use_pdl=self.pdl)

    @cute.jit
    def call_stream(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, mSem: cute.Tensor, seqlen_k: Int32,
                    softmax_scale: Float32, stream: cuda.CUstream):
        """``stream`` launch (module docstring): mSem (batch, heads, padded rows / unit_rows) int32, the main kernel's
        completion counts; seqlen_k for the counts each unit waits for."""
        assert self.stream, "call_stream needs FlashBwdPostSm90(stream=True)"
        mma_dQ = self.dq_mma()
        grid = (cute.ceil_div(mdQ.shape[1], self.tile_m), mdQ.shape[2], mdQ.shape[0])
        self.kernel_stream(mdQaccum, mdQ, mSem, seqlen_k, softmax_scale, mma_dQ).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True)

    @cute.jit
    def call_varlen(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, mCuSeqlensQ: cute.Tensor, max_seqlen_q: Int32,
                    softmax_scale: Float32, stream: cuda.CUstream):
        """Varlen launch (blocked dQaccum only): mdQaccum (h, total_q_pad, d) with sequence b's Q tiles from padded
        tile varlen_pad_offset(cu_seqlens_q[b], b, tile_m) / tile_m on, mdQ packed (total_q, h, d). Grid
        (ceil(max_seqlen_q / tile_m), h, b); a CTA past its sequence's last tile leaves at once."""
        assert self.varlen, "call_varlen needs FlashBwdPostSm90(varlen=True)"
        mma_dQ = self.dq_mma()
        grid = ((max_seqlen_q + self.tile_m - 1) // self.tile_m, mdQ.shape[1], mCuSeqlensQ.shape[0] - 1)
        self.kernel_blocked_varlen(mdQaccum, mdQ, softmax_scale, mma_dQ, mCuSeqlensQ).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32):
        if cutlass.const_expr(self.pdl):  # the main grid complete before any global access (module docstring)
            cute.arch.griddepcontrol_wait()
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

    @cute.kernel
    def kernel_blocked(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32,
                       mma_dQ: cute.TiledMma):
        """One Q tile per CTA: each warpgroup reads its chunk (16-byte loads), scales and converts it, and puts it
        into a shared-memory tile (32-bit stores, rows padded by 16 bytes: no bank conflicts); then every thread
        stores 16-byte row pieces of the tile to dQ, predicated on the sequence end (blocked_tile)."""
        if cutlass.const_expr(self.pdl):  # the main grid complete before any global access (module docstring)
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        self.blocked_tile(mdQaccum[batch, head, None, None], mdQ[batch, None, head, None], softmax_scale, mma_dQ,
                          tidx, m_block, m_block, mdQ.shape[1])

    @cute.kernel
    def kernel_stream(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, mSem: cute.Tensor, seqlen_k: Int32,
                      softmax_scale: Float32, mma_dQ: cute.TiledMma):
        """kernel_blocked once the tile's units are counted complete (module docstring, ``stream``)."""
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        seqlen_q = mdQ.shape[1]
        causal_off = seqlen_k - seqlen_q
        n_tiles = (seqlen_k + self.tile_n - 1) // self.tile_n
        units = self.tile_m // self.unit_rows
        if tidx < units:
            r0 = m_block * self.tile_m + tidx * self.unit_rows
            if r0 < seqlen_q:
                want = stream_unit_count(r0, self.unit_rows, self.causal, causal_off, self.tile_n, n_tiles)
                ptr = mSem.iterator + cute.crd2idx((batch, head, m_block * units + tidx), mSem.layout)
                cur = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
                while cur < want:
                    nanosleep(self.spin_ns)  # (a tight spin of every waiting CTA would load the L2 the main grid uses)
                    cur = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
        cute.arch.sync_threads()
        zero_rows = Int32(0)
        if cutlass.const_expr(self.causal):
            zero_rows = cutlass.max(-causal_off, Int32(0))
        self.blocked_tile(mdQaccum[batch, head, None, None], mdQ[batch, None, head, None], softmax_scale, mma_dQ,
                          tidx, m_block, m_block, seqlen_q, zero_rows)
        if m_block == 0 and head == 0 and batch == 0:  # this grid completes after the main one (module docstring)
            cute.arch.griddepcontrol_wait()

    @cute.kernel
    def kernel_blocked_varlen(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32,
                              mma_dQ: cute.TiledMma, mCuSeqlensQ: cute.Tensor):
        """kernel_blocked for one sequence of a packed batch: the sequence's padded dQaccum tile slot in, its packed
        rows out; the CTA does nothing past the sequence's last tile."""
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        offset_q = mCuSeqlensQ[batch]
        seqlen_q = mCuSeqlensQ[batch + 1] - offset_q
        if m_block * self.tile_m < seqlen_q:
            pad_tile = varlen_pad_offset(offset_q, batch, self.tile_m) // self.tile_m
            self.blocked_tile(mdQaccum[head, None, None], cute.domain_offset((offset_q, 0), mdQ[None, head, None]),
                              softmax_scale, mma_dQ, tidx, m_block, pad_tile + m_block, seqlen_q)

    @cute.jit
    def blocked_tile(self, mdQ2: cute.Tensor, mdQs: cute.Tensor, softmax_scale: Float32, mma_dQ: cute.TiledMma,
                     tidx: Int32, m_block: Int32, acc_tile: Int32, seqlen_q: Int32, zero_rows=None):
        """One Q tile: dQaccum tile ``acc_tile`` of mdQ2 ((padded) rows, d) -> rows of tile m_block of mdQs
        (seqlen rows, d), rows below seqlen_q only; ``zero_rows`` (stream): rows before it get zeros."""
        tm, d, nv = self.tile_m, self.hdim, self.dq_vals
        wg = tidx // 128
        tid = tidx % 128
        thr = mma_dQ.get_slice(tid)
        tcoord = thr.partition_C(cute.make_identity_tensor(self.dq_shape))
        base = mdQ2.iterator + ((acc_tile * self.chunks + wg) * 128 * nv + tid * 4)
        if cutlass.const_expr(self.chunk_major):
            base = mdQ2.iterator + ((wg * mdQ2.shape[0] + acc_tile * tm) * self.dq_shape[0] + tid * 4)
        gacc = cute.make_tensor(base.align(16), cute.make_layout((4, nv // 4), stride=(1, 512)))
        racc = cute.make_rmem_tensor((4, nv // 4), Float32)
        for j in cutlass.range_constexpr(nv // 4):
            cute.autovec_copy(gacc[None, j], racc[None, j])
        rdQ = cute.make_rmem_tensor((4, nv // 4), self.dtype)
        rdQ.store((racc.load() * softmax_scale).to(self.dtype))

        smem = cutlass.memory.SmemAllocator()
        pitch = d + 8  # bf16 elements per smem row: +16 bytes shifts each row by 4 banks
        sdQ = smem.allocate_tensor(self.dtype, cute.make_layout((tm, d), stride=(pitch, 1)), byte_alignment=16)
        sdQ32 = cute.recast_tensor(sdQ, cutlass.Uint32)  # (tm, d / 2): one column pair per word
        rdQ32 = cute.recast_tensor(rdQ, cutlass.Uint32)  # (2, nv // 4): value pairs (i, i + 1), i even
        if cutlass.const_expr(self.transposed):
            # values are (head-dim row, Q column) of dQ^T: adjacent fragment values are adjacent Q rows, 2-byte stores
            if cutlass.const_expr(self.d_chunks == self.chunks):  # the chunks split the head dim only
                for i in cutlass.range_constexpr(nv):
                    dl, ql = tcoord[i]
                    sdQ[ql, dl + wg * self.dq_shape[0]] = rdQ[i]
            else:  # two_cta: chunk wg at (Q row, head-dim row) ((wg // d_chunks) * dq_shape[1], (wg % d_chunks) * ...)
                q_off = (wg // self.d_chunks) * self.dq_shape[1]
                d_off = (wg % self.d_chunks) * self.dq_shape[0]
                for i in cutlass.range_constexpr(nv):
                    dl, ql = tcoord[i]
                    sdQ[ql + q_off, dl + d_off] = rdQ[i]
        else:
            for j in cutlass.range_constexpr(nv // 4):
                for e in cutlass.range_constexpr(2):
                    r, c = tcoord[2 * e + 4 * j]
                    sdQ32[r + wg * self.row_step, (c + wg * self.col_step) // 2] = rdQ32[e, j]
        cute.arch.sync_threads()

        vecs_per_row = d // 8
        for k in cutlass.range_constexpr(tm * vecs_per_row // self.num_threads):
            idx = tidx + k * self.num_threads
            r = idx // vecs_per_row
            v8 = idx % vecs_per_row
            row = m_block * tm + r
            if row < seqlen_q:
                if cutlass.const_expr(zero_rows is None):
                    cute.autovec_copy(cute.local_tile(sdQ[r, None], (8,), (v8,)),
                                      cute.local_tile(mdQs[row, None], (8,), (v8,)))
                else:
                    if row < zero_rows:
                        cute.local_tile(mdQs[row, None], (8,), (v8,)).fill(0.0)
                    else:
                        cute.autovec_copy(cute.local_tile(sdQ[r, None], (8,), (v8,)),
                                          cute.local_tile(mdQs[row, None], (8,), (v8,)))
