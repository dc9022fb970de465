"""The persistent forward's split tail (``AttnConfig.split_tail``): the last partial wave's tiles spread over every CTA.

A persistent non-causal forward over T tiles on G CTAs walks T // G rounds of whole tiles; the R = T mod G tiles left
over would run on R CTAs while G - R idle (the paper grid at hd128: 4096 tiles on 132 SMs, 4 left: a 32nd round for
4 tiles, about 3% of the call). With the split tail the R tiles' K/V blocks (N per tile, R * N in all) are cut into
G contiguous ranges of the concatenated sequence, CTA c taking blocks [c * R * N // G, (c + 1) * R * N // G): fewer
than N blocks, so at most two pieces (the end of one tile, the start of the next). A CTA computes its pieces first,
each as a tile over its blocks only, and writes the piece's normalised O (fp32) and LSE to slot 2 c + k of a workspace;
then its whole tiles. ``TailCombine`` (launched after the forward, same stream) merges each tail row's pieces:
LSE = log sum_i exp(LSE_i), O = sum_i exp(LSE_i - LSE) O_i. ``tail_piece`` and ``piece_of`` are the one schedule both
kernels read. Non-causal, no window, not varlen (every tile has the same N blocks).
"""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .scheduler import tile_at

LOG2_E = math.log2(math.e)
LN2 = math.log(2.0)


@cute.jit
def tail_range(c: Int32, n_tail: Int32, n_blocks: Int32, num_ctas: Int32):
    """(start, end): CTA ``c``'s blocks of the concatenated tail (n_tail tiles of n_blocks each)."""
    total = n_tail * n_blocks
    return c * total // num_ctas, (c + 1) * total // num_ctas


@cute.jit
def tail_pieces(c: Int32, n_tail: Int32, n_blocks: Int32, num_ctas: Int32) -> Int32:
    """How many pieces (0, 1 or 2) CTA ``c`` computes."""
    start, end = tail_range(c, n_tail, n_blocks, num_ctas)
    n = Int32(0)
    if end > start:
        n = Int32(1)
        if end > (start // n_blocks + 1) * n_blocks:
            n = Int32(2)
    return n


@cute.jit
def tail_piece(c: Int32, k: Int32, n_tail: Int32, n_blocks: Int32, num_ctas: Int32):
    """Piece ``k`` of CTA ``c``: (tail tile index, first block, end block) -- blocks [lo, hi) of tail tile i."""
    start, end = tail_range(c, n_tail, n_blocks, num_ctas)
    i = start // n_blocks + k
    lo = cutlass.max(start - i * n_blocks, 0)
    hi = cutlass.min(end - i * n_blocks, n_blocks)
    return i, lo, hi


@cute.jit
def piece_of(c: Int32, i: Int32, n_tail: Int32, n_blocks: Int32, num_ctas: Int32):
    """(has a piece, its slot): whether CTA ``c`` computed blocks of tail tile ``i``, and the workspace slot."""
    start, end = tail_range(c, n_tail, n_blocks, num_ctas)
    lo = cutlass.max(start, i * n_blocks)
    hi = cutlass.min(end, (i + 1) * n_blocks)
    slot = 2 * c
    if start < i * n_blocks:
        slot = 2 * c + 1
    return lo < hi, slot


def schedule(n_tail: int, n_blocks: int, num_ctas: int) -> list[tuple[int, int, int, int, int]]:
    """Host-side copy of the device schedule above, for tests and notes: (cta, tail tile, lo, hi, slot) of every
    piece, in CTA order."""
    total = n_tail * n_blocks
    out = []
    for c in range(num_ctas):
        start, end = c * total // num_ctas, (c + 1) * total // num_ctas
        if end <= start:
            continue
        pieces = 2 if end > (start // n_blocks + 1) * n_blocks else 1
        for k in range(pieces):
            i = start // n_blocks + k
            out.append((c, i, max(start - i * n_blocks, 0), min(end - i * n_blocks, n_blocks), 2 * c + k))
    return out


class TailCombine:
    """Merge the split tail's pieces into O and LSE: 128 threads per CTA, dv / 4 threads per row, each thread four
    adjacent columns of one row; grid = tail rows / rows per CTA."""

    num_threads = 128

    def __init__(self, dtype, tile_m: int, hdim_v: int):
        self.dtype = dtype
        self.tile_m = tile_m
        self.hdim_v = hdim_v
        self.tpr = hdim_v // 4
        self.rows_per_cta = self.num_threads // self.tpr
        assert tile_m % self.rows_per_cta == 0

    @cute.jit
    def launch(self, mOacc: cute.Tensor, mLSEacc: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, n_full: Int32,
               n_tail: Int32, n_blocks: Int32, num_ctas: Int32, stream):
        """mOacc (tile_m, dv, slots) / mLSEacc (tile_m, slots) fp32; mO (s, dv, h, b); mLSE (s, h, b)."""
        grid = (n_tail * (self.tile_m // self.rows_per_cta), 1, 1)
        self.kernel(mOacc, mLSEacc, mO, mLSE, n_full, n_tail, n_blocks, num_ctas).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mOacc: cute.Tensor, mLSEacc: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, n_full: Int32,
               n_tail: Int32, n_blocks: Int32, num_ctas: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        seqlen_q = mO.shape[0]
        m_blocks = (seqlen_q + self.tile_m - 1) // self.tile_m
        row_t = bid * self.rows_per_cta + tidx // self.tpr  # row among the tail tiles' rows
        c0 = (tidx % self.tpr) * 4
        i = row_t // self.tile_m
        r = row_t - i * self.tile_m
        m_block, head, bidx = tile_at(n_full + i, m_blocks, mO.shape[2], mO.shape[3], Int32(1), False)
        row = m_block * self.tile_m + r
        if row < seqlen_q:
            total = n_tail * n_blocks
            c_lo = cutlass.max(i * n_blocks * num_ctas // total - 1, 0)
            c_hi = cutlass.min(((i + 1) * n_blocks + 1) * num_ctas // total + 1, num_ctas)
            # every (c, slot) lies in the workspace (2 slots per CTA), so the loads are unconditional and the
            # unrolled iterations' loads overlap (one L2 round trip per iteration serialised ~30 us at 33 pieces)
            m = -Float32.inf
            for c in cutlass.range(c_lo, c_hi, unroll=8):
                has, slot = piece_of(c, i, n_tail, n_blocks, num_ctas)
                lse_c = mLSEacc[r, slot]
                if has:
                    m = cutlass.max(m, lse_c)
            wsum = Float32(0.0)
            acc = cute.make_rmem_tensor((4,), Float32)
            acc.fill(0.0)
            m_log2 = m * Float32(LOG2_E)
            for c in cutlass.range(c_lo, c_hi, unroll=8):
                has, slot = piece_of(c, i, n_tail, n_blocks, num_ctas)
                lse_c = mLSEacc[r, slot]
                part = cute.make_rmem_tensor((4,), Float32)
                cute.autovec_copy(cute.local_tile(mOacc[r, None, slot], (4,), (tidx % self.tpr,)), part)
                if has:
                    w = cute.math.exp2(lse_c * Float32(LOG2_E) - m_log2, fastmath=True)
                    wsum = wsum + w
                    for j in cutlass.range_constexpr(4):
                        acc[j] = acc[j] + w * part[j]
            inv = Float32(1.0) / wsum
            out = cute.make_rmem_tensor((4,), self.dtype)
            for j in cutlass.range_constexpr(4):
                out[j] = (acc[j] * inv).to(self.dtype)
            cute.autovec_copy(out, cute.local_tile(mO[row, None, head, bidx], (4,), (tidx % self.tpr,)))
            if c0 == 0:
                mLSE[row, head, bidx] = m + cute.math.log2(wsum, fastmath=True) * Float32(LN2)
