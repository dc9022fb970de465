"""The persistent causal forward's greedy walk (``AttnConfig.persistent_greedy``), built on the host.

The one-tile causal grid issues its tiles longest first (kernels/sm90/scheduler.py tile_coords: L2 groups of (head,
batch) pairs, m_block descending within a group) and the hardware hands each next tile to the first SM that frees up:
list scheduling. The persistent kernel's static round robin (CTA c: tiles c, c + G, ...) gives every CTA the same
number of tiles instead, and with the L2 groups the tile lengths of a round are a sawtooth, not a descending run.
The greedy walk replays the hardware's list scheduling on a cost model -- tile i costs its K/V blocks plus
``TILE_OVERHEAD_BLOCKS`` -- and hands the kernel each CTA's list of tiles: row c of an int32 table (G, 1 + max
tiles per CTA) holds [count, tile, tile, ...] in the tile numbering of scheduler.tile_at, so every tile is computed
once, by one CTA, whatever the model's error. Plain Python (no DSL): the interface builds and caches the table per
shape, ``analysis.waves`` reads the same model.
"""
from __future__ import annotations

import heapq

# a tile's cost beyond its K/V blocks, in blocks (its Q load, the first block's QK^T without overlap, the last P V)
TILE_OVERHEAD_BLOCKS = 1.0


def causal_tile_order(m_blocks: int, pairs: int, hb_group: int) -> list[tuple[int, int]]:
    """(m_block, pair) of every tile in the issue order of scheduler.tile_at (causal): groups of ``hb_group``
    (head, batch) pairs, m_block descending within a group, pairs fastest; pair = batch * heads + head."""
    out = []
    for g0 in range(0, pairs, hb_group):
        size = min(hb_group, pairs - g0)
        for w in range(size * m_blocks):
            out.append((m_blocks - 1 - w // size, g0 + w % size))
    return out


def causal_blocks(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int,
                  window_left: int = -1) -> int:
    """K/V blocks a causal Q tile visits (kernels/sm90/mask.py n_block_range / window_block_range, bottom-right
    aligned), at least 1."""
    off = seqlen_k - seqlen_q
    n_max = min(-(-seqlen_k // tile_n), -(-max((m_block + 1) * tile_m + off, 0) // tile_n))
    n_min = 0
    if window_left >= 0:
        n_min = max(m_block * tile_m + off - window_left, 0) // tile_n
    return max(n_max - n_min, 1)


def list_schedule(costs: list[float], num_ctas: int) -> list[list[int]]:
    """Tiles 0 .. len(costs) - 1, in order, each to the CTA whose work ends first (ties: the lowest CTA): each CTA's
    tiles in the order it computes them."""
    walks: list[list[int]] = [[] for _ in range(num_ctas)]
    heap = [(0.0, c) for c in range(num_ctas)]
    for i, cost in enumerate(costs):
        end, c = heapq.heappop(heap)
        walks[c].append(i)
        heapq.heappush(heap, (end + cost, c))
    return walks


def greedy_walks(m_blocks: int, pairs: int, hb_group: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int,
                 num_ctas: int, window_left: int = -1) -> list[list[int]]:
    """Each CTA's tiles (tile_at numbers) under list scheduling of the causal issue order."""
    costs = [causal_blocks(m, tile_m, tile_n, seqlen_q, seqlen_k, window_left) + TILE_OVERHEAD_BLOCKS
             for m, _ in causal_tile_order(m_blocks, pairs, hb_group)]
    return list_schedule(costs, num_ctas)


def walk_table(walks: list[list[int]]) -> list[list[int]]:
    """The kernel's table: row c = [len(walks[c]), walks[c]..., 0 padding], every row 1 + the longest walk long."""
    width = 1 + max((len(w) for w in walks), default=0)
    return [[len(w)] + w + [0] * (width - 1 - len(w)) for w in walks]
