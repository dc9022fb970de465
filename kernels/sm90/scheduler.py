"""Tile scheduling of the sm90 forward kernel: which (m_block, head, batch) a CTA computes.

Non-causal: grid (m_blocks, heads, batch), one tile per CTA.
Causal (longest-processing-time first): a 1-D grid whose blocks are issued in order of decreasing work --
the Q tiles with the most K blocks (the last m_blocks) go first. Heads are taken in groups of ``hb_group``
(head, batch) pairs whose K and V fit in a slice of L2, so the tiles running together share K/V in L2:
within a group the order is m_block descending, then (head, batch).
Persistent (AttnConfig.persistent): grid = min(SM count, tiles); CTA c walks tiles c, c + grid, c + 2 grid, ... of the
same order (``tile_at``; non-causal: m_block fastest, then head, then batch), a static round robin that for causal
hands out the longest tiles first; with AttnConfig.persistent_snake every odd full round in reverse CTA order
(``snake_tile``), else CTA 0 takes the longest tile of every round and CTA grid - 1 the shortest.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr

L2_BUDGET_BYTES = 32 * 1024 * 1024  # part of the H100/H200 50 MB L2 used for one group's K and V


def lpt_group_size(heads: int, batch: int, seqlen_k: int, hdim: int, hdim_v: int, elem_bytes: int,
                   budget_bytes: int = L2_BUDGET_BYTES) -> int:
    """(head, batch) pairs per L2 group: a power of two whose K+V fit in ``budget_bytes`` (host side;
    AttnConfig.lpt_l2_mb sets it, None = L2_BUDGET_BYTES)."""
    kv_bytes = max(1, seqlen_k * (hdim + hdim_v) * elem_bytes)
    g = max(1, budget_bytes // kv_bytes)
    g = 1 << (g.bit_length() - 1)
    return max(1, min(g, heads * batch))


def grid_shape(m_blocks: int, heads: int, batch: int, causal: bool):
    return (m_blocks * heads * batch, 1, 1) if causal else (m_blocks, heads, batch)


@cute.jit
def tile_coords(m_blocks: Int32, heads: Int32, batch: Int32, hb_group: Int32, causal: cutlass.Constexpr[bool]):
    """(m_block, head, batch) of this CTA."""
    bx, by, bz = cute.arch.block_idx()
    m_block, head, bidx = bx, by, bz
    if const_expr(causal):
        num_hb = heads * batch
        per_group = hb_group * m_blocks
        group = bx // per_group
        within = bx - group * per_group
        g_size = cutlass.min(hb_group, num_hb - group * hb_group)
        m_block = m_blocks - 1 - within // g_size
        hb = group * hb_group + within % g_size
        bidx = hb // heads
        head = hb - bidx * heads
    return m_block, head, bidx


@cute.jit
def tile_at(tile: Int32, m_blocks: Int32, heads: Int32, batch: Int32, hb_group: Int32,
            causal: cutlass.Constexpr[bool]):
    """(m_block, head, batch) of tile number ``tile`` in the issue order (persistent kernel): causal as
    ``tile_coords`` orders its 1-D grid; non-causal m_block fastest, then head, then batch."""
    hb = Int32(0)
    m_block = Int32(0)
    if const_expr(causal):
        num_hb = heads * batch
        per_group = hb_group * m_blocks
        group = tile // per_group
        within = tile - group * per_group
        g_size = cutlass.min(hb_group, num_hb - group * hb_group)
        m_block = m_blocks - 1 - within // g_size
        hb = group * hb_group + within % g_size
    else:
        hb = tile // m_blocks
        m_block = tile - hb * m_blocks
    bidx = hb // heads
    head = hb - bidx * heads
    return m_block, head, bidx


@cute.jit
def snake_tile(t: Int32, bx: Int32, gx: Int32, num_tiles: Int32) -> Int32:
    """Persistent causal: the tile CTA ``bx`` of ``gx`` computes at its step ``t`` = bx + k gx of the static round
    robin. Rounds are slices of the longest-first order; an odd round that is full runs in reverse CTA order (the CTA
    that took one round's longest tile takes the next round's shortest), a partial last round keeps the plain order,
    so every tile below ``num_tiles`` is computed exactly once."""
    k = (t - bx) // gx
    tile = t
    if k % 2 == 1 and (k + 1) * gx <= num_tiles:
        tile = k * gx + (gx - 1 - bx)
    return tile
