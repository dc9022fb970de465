"""Attention masks of the sm90 kernels, applied to one thread's slice of a wgmma S accumulator.

Stable API (the backward kernel imports these names; keep them):
  ``apply_mask(acc_S, tScS, m_base, n_base, seqlen_q, seqlen_k, causal)`` sets to -inf every element whose key
  column is >= seqlen_k or, when ``causal``, lies to the right of the bottom-right-aligned diagonal
  (query row i sees keys j <= i + seqlen_k - seqlen_q, as FlashAttention).
  ``tScS`` is the thread's partition of an identity tensor over the (tile_m, tile_n) tile; m_base / n_base
  are the tile's first row / column in the sequence.
  ``n_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal)`` -> (n_block_max, n_block_min_masked):
  the K/V blocks a Q tile needs (blocks 0 .. n_block_max-1) and the first block that needs a causal mask.

Sliding window (compile-time ``window_left`` / ``window_right``, -1 = unbounded on that side; with ``causal`` the right
bound is the diagonal, i.e. 0): query row i sees keys j with i + s_k - s_q - left <= j <= i + s_k - s_q + right
(bottom-right aligned, as FlashAttention). ``apply_mask(..., window_left=, window_right=)`` masks both bounds;
``n_block_range_window`` -> (n_block_min, n_block_max, n_block_min_masked, n_block_local_end): the tile visits blocks
n_block_min .. n_block_max-1; blocks >= n_block_min_masked need the right bound (or the seqlen_k edge), blocks
< n_block_local_end the left bound; the blocks in between are unmasked. At the defaults (-1, -1) both functions
compile the code of the window-less ones. With a left bound the mask is one unsigned compare per element,
(col - col_start) < (col_limit - col_start) (two signed compares and an OR made hd 64's 160-register kernel spill).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from .layout import acc_rows_cols


@cute.jit
def apply_mask(acc_S: cute.Tensor, tScS: cute.Tensor, m_base: Int32, n_base: Int32, seqlen_q: Int32,
               seqlen_k: Int32, causal: cutlass.Constexpr[bool], window_left: cutlass.Constexpr[int] = -1,
               window_right: cutlass.Constexpr[int] = -1):
    s = acc_rows_cols(acc_S)
    c = acc_rows_cols(tScS)
    col_limit_seq = seqlen_k - n_base
    right = 0 if causal else window_right  # right bound offset from the diagonal; -1: none
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        col_limit = col_limit_seq
        if const_expr(window_left < 0):
            if const_expr(right == 0):
                row = m_base + c[r, 0][0]
                col_limit = cutlass.min(col_limit_seq, row + 1 + seqlen_k - seqlen_q - n_base)
            elif const_expr(right > 0):
                row = m_base + c[r, 0][0]
                col_limit = cutlass.min(col_limit_seq, row + 1 + seqlen_k - seqlen_q - n_base + right)
            for j in cutlass.range(cute.size(s, mode=[1]), unroll_full=True):
                s[r, j] = -Float32.inf if c[0, j][1] >= col_limit else s[r, j]
        else:
            row = m_base + c[r, 0][0]
            diag = row + seqlen_k - seqlen_q - n_base  # the diagonal's column in this block
            if const_expr(right >= 0):
                col_limit = cutlass.min(col_limit_seq, diag + 1 + right)
            col_start = cutlass.max(diag - window_left, 0)  # first visible column (>= 0)
            # visible iff col_start <= col < col_limit: one unsigned compare, (col - col_start) < width
            width = cutlass.max(col_limit - col_start, 0).bitcast(cutlass.Uint32)
            for j in cutlass.range(cute.size(s, mode=[1]), unroll_full=True):
                s[r, j] = -Float32.inf if (c[0, j][1] - col_start).bitcast(cutlass.Uint32) >= width else s[r, j]


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


def window_block_range(m_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool, window_left: int,
                       window_right: int):
    """The body of ``n_block_range_window``, plain Python: traced with DSL integers inside the kernel, and evaluated
    with Python ints by the CPU tests that check every visible (row, key) lies in a visited block and every unmasked
    block is fully visible."""
    right = 0 if causal else window_right
    n_block_max = (seqlen_k + tile_n - 1) // tile_n
    n_block_min_masked = n_block_max
    n_block_min = 0
    n_block_local_end = 0
    m_first = m_block * tile_m
    if const_expr(right >= 0):
        # last key column any row of this tile may see, + 1
        col_end = (m_block + 1) * tile_m + seqlen_k - seqlen_q + right
        n_block_max = cutlass.min(n_block_max, (cutlass.max(col_end, 0) + tile_n - 1) // tile_n)
        # blocks at or after this one hold columns right of some row's bound
        n_block_min_masked = cutlass.max(m_first + seqlen_k - seqlen_q + right, 0) // tile_n
    n_block_max = cutlass.max(n_block_max, 1)
    if const_expr(window_left >= 0):
        # first key column the tile's first row may see: blocks before it are skipped
        n_block_min = cutlass.max(m_first + seqlen_k - seqlen_q - window_left, 0) // tile_n
        n_block_min = cutlass.min(n_block_min, n_block_max - 1)
        # blocks before the first column of the tile's last row hold columns left of some row's bound
        col_first_last_row = m_first + tile_m - 1 + seqlen_k - seqlen_q - window_left
        n_block_local_end = (cutlass.max(col_first_last_row, 0) + tile_n - 1) // tile_n
    return n_block_min, n_block_max, n_block_min_masked, n_block_local_end


@cute.jit
def n_block_range_window(m_block: Int32, tile_m: cutlass.Constexpr[int], tile_n: cutlass.Constexpr[int],
                         seqlen_q: Int32, seqlen_k: Int32, causal: cutlass.Constexpr[bool],
                         window_left: cutlass.Constexpr[int], window_right: cutlass.Constexpr[int]):
    """(n_block_min, n_block_max, n_block_min_masked, n_block_local_end) of a Q tile under a sliding window."""
    return window_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, window_left, window_right)
