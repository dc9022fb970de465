"""Attention masks of the sm90 kernels, applied to one thread's slice of a wgmma S accumulator.

Stable API (the backward kernel imports these names; keep them):
  ``apply_mask(acc_S, tScS, m_base, n_base, seqlen_q, seqlen_k, causal)`` sets to -inf every element whose key
  column is >= seqlen_k or, when ``causal``, lies to the right of the bottom-right-aligned diagonal
  (query row i sees keys j <= i + seqlen_k - seqlen_q, as FlashAttention).
  ``tScS`` is the thread's partition of an identity tensor over the (tile_m, tile_n) tile; m_base / n_base
  are the tile's first row / column in the sequence.
  ``n_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal)`` -> (n_block_max, n_block_min_masked):
  the K/V blocks a Q tile needs (blocks 0 .. n_block_max-1) and the first block that needs a causal mask.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .layout import acc_rows_cols


@cute.jit
def apply_mask(acc_S: cute.Tensor, tScS: cute.Tensor, m_base: Int32, n_base: Int32, seqlen_q: Int32,
               seqlen_k: Int32, causal: cutlass.Constexpr[bool]):
    s = acc_rows_cols(acc_S)
    c = acc_rows_cols(tScS)
    col_limit_seq = seqlen_k - n_base
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        col_limit = col_limit_seq
        if const_expr(causal):
            row = m_base + c[r, 0][0]
            col_limit = cutlass.min(col_limit_seq, row + 1 + seqlen_k - seqlen_q - n_base)
        for j in cutlass.range(cute.size(s, mode=[1]), unroll_full=True):
            s[r, j] = -Float32.inf if c[0, j][1] >= col_limit else s[r, j]


@cute.jit
def n_block_range(m_block: Int32, tile_m: cutlass.Constexpr[int], tile_n: cutlass.Constexpr[int], seqlen_q: Int32,
                  seqlen_k: Int32, causal: cutlass.Constexpr[bool]):
    n_block_max = (seqlen_k + tile_n - 1) // tile_n
    n_block_min_masked = n_block_max
    if const_expr(causal):
        # last key column any row of this tile may see, + 1
        col_end = (m_block + 1) * tile_m + seqlen_k - seqlen_q
        n_block_max = cutlass.min(n_block_max, (cutlass.max(col_end, 0) + tile_n - 1) // tile_n)
        # blocks at or after this one hold columns beyond some row's diagonal
        n_block_min_masked = cutlass.max(m_block * tile_m + seqlen_k - seqlen_q, 0) // tile_n
    # at least one block, so a tile whose rows see no key still runs (fully masked -> O = 0, LSE = -inf)
    n_block_max = cutlass.max(n_block_max, 1)
    return n_block_max, n_block_min_masked
