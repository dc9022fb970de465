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

Backward (the transpose: a CTA owns K/V tile n_block and walks Q tiles): key j is seen by the query rows i with
j - (s_k - s_q) - right <= i <= j - (s_k - s_q) + left. ``m_block_range_window`` -> (m_block_min, m_block_max), the Q
tiles a K/V tile visits (possibly none: its dK / dV are then zero); ``m_block_visitors`` -> (n_lo, n_hi), the K/V tiles
whose range holds a Q tile, derived from the same formulas (the deterministic dQ turns count inside it);
``bwd_tile_needs_mask`` says whether a (K/V rows, Q columns) tile of S^T crosses a bound or seqlen_k. Plain Python
traced with DSL integers, and evaluated with Python ints by the CPU tests.
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


def m_block_range_window(n_block, tile_m: int, tile_n: int, seqlen_q, seqlen_k, causal: bool, window_left: int,
                         window_right: int):
    """Backward: (m_block_min, m_block_max), the Q tiles m_block_min .. m_block_max-1 that see some key of K/V tile
    n_block (keys n_block*tile_n .. +tile_n-1; the last tile's keys past seqlen_k count too, they are masked). An
    empty range (m_block_max == m_block_min) is possible with a left bound: no query sees the tile's keys."""
    right = 0 if causal else window_right
    off = seqlen_k - seqlen_q
    m_block_max = (seqlen_q + tile_m - 1) // tile_m
    m_block_min = 0
    if const_expr(right >= 0):
        # first row whose right bound reaches the tile's first key
        m_block_min = cutlass.max(n_block * tile_n - off - right, 0) // tile_m
    if const_expr(window_left >= 0):
        # last row whose left bound reaches the tile's last key, + 1
        row_end = cutlass.max(n_block * tile_n + tile_n - off + window_left, 0)
        m_block_max = cutlass.min(m_block_max, (row_end + tile_m - 1) // tile_m)
    m_block_max = cutlass.max(m_block_max, m_block_min)
    return m_block_min, m_block_max


def m_block_visitors(m_block, tile_m: int, tile_n: int, off, num_n_blocks, causal: bool, window_left: int,
                     window_right: int):
    """(n_lo, n_hi): the K/V tiles n_lo .. n_hi-1 whose ``m_block_range_window`` holds Q tile m_block (for
    m_block < ceil(seqlen_q / tile_m)); the exact inverse of that range (n visits m iff m_min(n) <= m < m_max(n):
    m_min(n) <= m iff n * tile_n < (m+1) * tile_m + off + right, m < m_max(n) iff n >= floor((m * tile_m + off -
    left) / tile_n), off = seqlen_k - seqlen_q), so deterministic dQ turns counted inside it never wait for a tile
    that does not come."""
    right = 0 if causal else window_right
    n_lo = 0
    n_hi = num_n_blocks
    if const_expr(right >= 0):
        n_hi = cutlass.min(n_hi, (cutlass.max((m_block + 1) * tile_m + off + right, 0) + tile_n - 1) // tile_n)
    if const_expr(window_left >= 0):
        n_lo = cutlass.max(m_block * tile_m + off - window_left, 0) // tile_n
    return n_lo, n_hi


def bwd_tile_needs_mask(n_first, n_end, m_first, m_last, seqlen_k, off, causal: bool, window_left: int,
                        window_right: int):
    """Backward: does the S^T tile of keys n_first .. n_end-1 and query rows m_first .. m_last hold an element that is
    not visible (a key >= seqlen_k, right of some row's right bound or left of some row's left bound)?"""
    right = 0 if causal else window_right
    need = n_end > seqlen_k
    if const_expr(right >= 0):
        need = need | (n_end - 1 > m_first + off + right)
    if const_expr(window_left >= 0):
        need = need | (n_first < m_last + off - window_left)
    return need
