"""Wave quantization of the forward's tile schedule: the share of the GPU the last partial round leaves idle.

A non-causal forward runs T tiles of equal cost, one CTA per SM at a time (ours persistent or not, official FA4's one
tile per CTA alike: both hold one CTA per SM at every head dim), so it takes ceil(T / G) rounds on G SMs while the work
is T / G rounds: the efficiency is T / (G ceil(T / G)), and the rest is what ``AttnConfig.split_tail``
(kernels/sm90/fwd_tail.py) can win at most, before its own cost (each piece's Q load and fp32 store, the merge kernel;
``pred_split`` charges each CTA ``PIECE_OVERHEAD_BLOCKS`` for its pieces, a guess, and nothing for the merge). A model,
not a measurement: it assumes equal tile times and ignores launch and epilogue costs (analysis/roofline.py spreads the
tiles evenly over the SMs instead). Causal rows (``--causal``): tiles of 1 .. N K/V blocks handed out longest first to
whichever SM frees up first (the hardware's block scheduler on the one-tile-per-CTA grid), each tile costing its blocks
plus ``overhead`` blocks (prologue and epilogue); efficiency = work / (SMs x the last SM's finish).
``--causal --masked``: the share of a causal call's Q K^T and P V work spent on entries the mask zeroes (the tiles
across the diagonal, and the rows of a last Q tile that overhangs the sequence), with and without
``AttnConfig.skip_diag_wg``: 1 / (1 - that share) bounds what any narrower diagonal step could win on a tensor-bound K/V
loop. ``--causal --persistent``: the persistent causal forward's walks on the same cost model, over the kernel's own
tile order (L2 groups of (head, batch) pairs, m_block descending within a group: scheduler.tile_at): the static round
robin (``rr``: CTA c takes tiles c, c + G, ...), its snake order (``snake``: odd full rounds reversed,
AttnConfig.persistent_snake) and list scheduling of that order (``greedy``: what the one-tile grid gets from the
hardware, and AttnConfig.persistent_greedy's walk, kernels/sm90/greedy_walk.py). ``pred_*``: each walk's speed over the
one-tile grid, (walk balance / list-scheduling balance) x (1 + ``overlap`` / the mean blocks per tile): a persistent CTA
hides about ``overlap`` blocks of each tile's start and end under its neighbours' (``OVERLAP_BLOCKS``, fitted from the
non-causal A/B: persistent / one tile 1.110 / 1.057 / 1.027 / 1.012 at 8 / 16 / 32 / 64 blocks per tile, hd128, 16k
tokens; results/h200/session_ab archive of 2026-12-03, fwd128_persistent_*.jsonl). It reproduces the causal measurements
of that archive (fwd_pers_snake.jsonl, 16k tokens: round robin and snake at hd64 / hd128, 2k-8k) within 4%, most within
2% (tests/test_waves.py).

    python -m analysis.waves [--gpu h200] [--tokens 32768] [--hidden 2048] [--causal [--persistent | --masked]]
                             [--overhead 1.0]
"""
from __future__ import annotations

import argparse
import heapq
import math

from kernels.config import AttnConfig
from kernels.hardware import get_gpu

HEAD_DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
OVERLAP_BLOCKS = 0.85  # blocks of a tile's start / end a persistent CTA hides (fit: module docstring)
# a split-tail piece's own cost beyond its blocks (its Q load and first QK^T, the fp32 O store), in blocks: a guess
PIECE_OVERHEAD_BLOCKS = 2.0
SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)


def wave_row(sms: int, hdim: int, hdim_v: int, seqlen: int, tokens: int = 32768, hidden: int = 2048,
             piece_overhead: float = PIECE_OVERHEAD_BLOCKS) -> dict:
    """One paper-grid cell (batch = tokens / seqlen, heads = hidden / hdim, the sm90 default forward tile).
    ``pred_split``: the split tail's predicted speed over the persistent kernel, (full rounds + a tail round) against
    (full rounds + the CTA's share of the tail's blocks + ``piece_overhead`` blocks), in K/V blocks."""
    cfg = AttnConfig().resolve("sm90", hdim, False)
    batch, heads = max(1, tokens // seqlen), max(1, hidden // hdim)
    tiles = math.ceil(seqlen / cfg.tile_m) * heads * batch
    rounds = math.ceil(tiles / sms)
    eff = tiles / (sms * rounds)
    n_blocks = math.ceil(seqlen / cfg.tile_n)
    tail = tiles % sms
    split = (tiles // sms) * n_blocks + (tail * n_blocks / sms + piece_overhead if tail else 0)
    return dict(hdim=hdim, hdim_v=hdim_v, seqlen=seqlen, batch=batch, heads=heads, tile_m=cfg.tile_m, tiles=tiles,
                rounds=rounds, tail_tiles=tail, efficiency=round(eff, 4), idle_share=round(1 - eff, 4),
                pred_split=round(rounds * n_blocks / split, 3))


def causal_row(sms: int, hdim: int, hdim_v: int, seqlen: int, tokens: int = 32768, hidden: int = 2048,
               overhead: float = 1.0) -> dict:
    """One causal paper-grid cell: list scheduling of the tiles, longest first, on ``sms`` SMs."""
    cfg = AttnConfig().resolve("sm90", hdim, True)
    batch, heads = max(1, tokens // seqlen), max(1, hidden // hdim)
    m_blocks = math.ceil(seqlen / cfg.tile_m)
    lengths = [math.ceil(min((m + 1) * cfg.tile_m, seqlen) / cfg.tile_n) + overhead for m in range(m_blocks)]
    jobs = sorted(lengths * (heads * batch), reverse=True)
    free = [0.0] * sms
    for t in jobs:
        heapq.heapreplace(free, free[0] + t)
    eff = sum(jobs) / (sms * max(free))
    return dict(hdim=hdim, hdim_v=hdim_v, seqlen=seqlen, batch=batch, heads=heads, tile_m=cfg.tile_m,
                tiles=len(jobs), rounds="-", tail_tiles="-", efficiency=round(eff, 4), idle_share=round(1 - eff, 4))


def skipping_warpgroups(tile_m: int, tile_n: int, seqlen: int, wg_rows: int = 64) -> list[list[int]]:
    """Per Q tile of a causal seqlen x seqlen call, the consumer warpgroups that ``skip_diag_wg`` lets skip the tile's
    last K/V block: those whose last row lies before that block's first key, with a block left before it (the
    kernel's rule, kernels/sm90/fwd.py consume)."""
    from kernels.sm90.greedy_walk import causal_blocks  # the blocks a causal tile visits: 0 .. n_max - 1 here

    out = []
    for m in range(-(-seqlen // tile_m)):
        n_max = causal_blocks(m, tile_m, tile_n, seqlen, seqlen)
        out.append([w for w in range(tile_m // wg_rows)
                    if n_max > 1 and (n_max - 1) * tile_n > m * tile_m + (w + 1) * wg_rows - 1])
    return out


def masked_counts(tile_m: int, tile_n: int, seqlen: int, wg_rows: int = 64) -> tuple[int, int, int]:
    """(entries computed, entries ``skip_diag_wg`` skips, entries the mask keeps) of one causal seqlen x seqlen head:
    each consumer warpgroup computes ``wg_rows`` x tile_n entries of S (and P V's matching K-slice) per K/V block its
    tile visits; the mask keeps key <= row, r + 1 entries of row r."""
    from kernels.sm90.greedy_walk import causal_blocks

    visited = [causal_blocks(m, tile_m, tile_n, seqlen, seqlen) for m in range(-(-seqlen // tile_m))]
    computed = sum(visited) * tile_m * tile_n
    skipped = sum(len(w) for w in skipping_warpgroups(tile_m, tile_n, seqlen, wg_rows)) * wg_rows * tile_n
    return computed, skipped, seqlen * (seqlen + 1) // 2


def masked_row(hdim: int, hdim_v: int, seqlen: int, wg_rows: int = 64) -> dict:
    """One causal cell's masked share on the sm90 default tile (module docstring), without and with skip_diag_wg.
    Heads and batch scale both sides alike, so the share depends on the length and the tile only."""
    cfg = AttnConfig().resolve("sm90", hdim, True)
    computed, skipped, needed = masked_counts(cfg.tile_m, cfg.tile_n, seqlen, wg_rows)
    share, share_skip = 1 - needed / computed, 1 - needed / (computed - skipped)
    return dict(hdim=hdim, hdim_v=hdim_v, seqlen=seqlen, tile_m=cfg.tile_m, tile_n=cfg.tile_n,
                masked_share=round(share, 4), masked_share_skip=round(share_skip, 4),
                max_gain=round(1 / (1 - share), 4), skip_gain=round(computed / (computed - skipped), 4))


def persistent_causal_row(sms: int, hdim: int, hdim_v: int, seqlen: int, tokens: int = 32768, hidden: int = 2048,
                          overhead: float = 1.0, overlap: float = OVERLAP_BLOCKS, tile_m: int | None = None) -> dict:
    """One causal paper-grid cell's persistent walks (grid min(SMs, tiles)): efficiency = work / (grid x the busiest
    CTA's work) for the round robin, snake and greedy walks of the kernel's tile order, and each walk's predicted
    speed over the one-tile grid (``pred_*``, module docstring). ``tile_m``: another Q tile than the table's."""
    from kernels.sm90.greedy_walk import causal_blocks, causal_tile_order, list_schedule
    from kernels.sm90.scheduler import lpt_group_size

    cfg = AttnConfig().resolve("sm90", hdim, True)
    batch, heads = max(1, tokens // seqlen), max(1, hidden // hdim)
    tm = tile_m or cfg.tile_m
    m_blocks = math.ceil(seqlen / tm)
    pairs = heads * batch
    hb_group = lpt_group_size(heads, batch, seqlen, hdim, hdim_v, 2)
    blocks = [causal_blocks(m, tm, cfg.tile_n, seqlen, seqlen) for m, _ in causal_tile_order(m_blocks, pairs, hb_group)]
    costs = [b + overhead for b in blocks]
    n, g = len(costs), min(sms, len(costs))
    work = sum(costs)

    def eff(walks):
        return round(work / (g * max(sum(costs[t] for t in w) for w in walks)), 4)

    rr = [list(range(c, n, g)) for c in range(g)]
    snake = [[k * g + (g - 1 - c if k % 2 == 1 and (k + 1) * g <= n else c) for k in range(len(rr[c]))]
             for c in range(g)]
    row = dict(hdim=hdim, hdim_v=hdim_v, seqlen=seqlen, batch=batch, heads=heads, tile_m=tm, tiles=n,
               hb_group=hb_group, rr=eff(rr), snake=eff(snake), greedy=eff(list_schedule(costs, g)))
    gain = 1.0 + overlap * n / sum(blocks)
    for w in ("rr", "snake", "greedy"):
        row["pred_" + w] = round(row[w] / row["greedy"] * gain, 3)
    return row


def table(gpu: str = "h200", tokens: int = 32768, hidden: int = 2048, causal: bool = False,
          overhead: float = 1.0, persistent: bool = False, masked: bool = False) -> list[dict]:
    sms = get_gpu(gpu).sms
    if causal and masked:
        return [masked_row(d, dv, s) for d, dv in HEAD_DIMS for s in SEQLENS]
    if causal and persistent:
        return [persistent_causal_row(sms, d, dv, s, tokens, hidden, overhead) for d, dv in HEAD_DIMS for s in SEQLENS]
    if causal:
        return [causal_row(sms, d, dv, s, tokens, hidden, overhead) for d, dv in HEAD_DIMS for s in SEQLENS]
    return [wave_row(sms, d, dv, s, tokens, hidden) for d, dv in HEAD_DIMS for s in SEQLENS]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--causal", action="store_true", help="the causal grid (list scheduling, longest first)")
    ap.add_argument("--overhead", type=float, default=1.0, help="causal: per-tile cost beyond its blocks, in blocks")
    ap.add_argument("--persistent", action="store_true", help="with --causal: the persistent walks (rr, snake, greedy)")
    ap.add_argument("--masked", action="store_true", help="with --causal: the work the mask zeroes, per cell")
    a = ap.parse_args(argv)
    if (a.persistent or a.masked) and not a.causal:
        ap.error("--persistent and --masked model the causal grid: pass --causal too")
    if a.persistent and a.masked:
        ap.error("pass one of --persistent and --masked")
    rows = table(a.gpu, a.tokens, a.hidden, a.causal, a.overhead, a.persistent, a.masked)
    cols = ("hdim", "hdim_v", "seqlen", "tile_m", "tiles", "rounds", "tail_tiles", "efficiency", "idle_share")
    if not a.causal:
        cols += ("pred_split",)
    if a.persistent:
        cols = ("hdim", "hdim_v", "seqlen", "tile_m", "tiles", "hb_group", "rr", "snake", "greedy", "pred_rr",
                "pred_snake", "pred_greedy")
    if a.masked:
        cols = ("hdim", "hdim_v", "seqlen", "tile_m", "tile_n", "masked_share", "masked_share_skip", "max_gain",
                "skip_gain")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
