"""det_schedule="lpt" (deterministic backward, opt-in; causal here, non-causal is naive's walk regrouped): its schedule arithmetic, its fallbacks, its SASS (CPU).

Causal K/V tile n (of N) visits Q tiles m_min(n) .. M-1 (m_min(n) = max(0, n * tile_n - (seqlen_k - seqlen_q)) //
tile_m, kernels/sm90/bwd.py tile_schedule). With "lpt" the grid launches K/V tile 0 (the longest walk) first, g heads
interleaved (launch_order; g = max(bwd_lpt_heads, DET_LPT_HEADS)), each CTA walks its Q tiles from M-1 down to
m_min(n) (desc_block) and a Q tile's dQ turns go in K/V tile order (dq_turn without spt: turn = n). Checked here on
a Python mirror of that arithmetic: every Q tile gets each visiting K/V tile's dQ exactly once, in one fixed order
(turns 0 .. k-1, a permutation: the sum is the same sequence of fp32 adds on every run, so bitwise-deterministic by
construction), every turn's predecessors were launched earlier (no residency bound), and a slot simulation finishes
with any number of slots.
"""
from __future__ import annotations

import itertools
import re

import pytest

from kernels import AttnConfig
from kernels.config import DET_SCHEDULES

bwd = pytest.importorskip("kernels.sm90.bwd")


def launch_ranks(n_tiles: int, heads: int, g: int) -> list[tuple[int, int]]:
    """(head, K/V tile) of each launch rank: FlashBwdSm90.launch_order (g > 1: g consecutive heads' K/V tiles
    alternate, a last smaller group takes the rest) over tile_schedule without spt (n_block = block index)."""
    out = []
    for rank in range(n_tiles * heads):
        if g > 1:
            group = rank // (n_tiles * g)
            first = group * g
            size = min(heads - first, g)
            r = rank - group * (n_tiles * g)
            out.append((first + r % size, r // size))
        else:
            out.append((rank // n_tiles, rank % n_tiles))
    return out


def walk(n: int, seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int) -> list[int]:
    """The Q tiles of K/V tile n in walk order (tile_schedule's causal range, desc_block's order)."""
    first_row = max(0, n * tile_n - (seqlen_k - seqlen_q))
    lo, hi = first_row // tile_m, -(-seqlen_q // tile_m)
    return [bwd.desc_block(i, lo, hi) for i in range(lo, hi)]


SHAPES = [(1024, 1024, 80, 128), (1000, 1000, 80, 128), (4096, 4096, 80, 128), (1024, 1024, 128, 128),
          (300, 1003, 80, 128), (1003, 300, 80, 128), (333, 397, 128, 128), (77, 300, 64, 128), (8192, 8192, 80, 128)]


@pytest.mark.parametrize("seqlen_q,seqlen_k,tile_m,tile_n", SHAPES)
def test_each_q_tile_gets_each_visitor_once_in_kv_order(seqlen_q, seqlen_k, tile_m, tile_n):
    n_tiles, m_tiles = -(-seqlen_k // tile_n), -(-seqlen_q // tile_m)
    adds = {m: [] for m in range(m_tiles)}
    for n in range(n_tiles):
        w = walk(n, seqlen_q, seqlen_k, tile_m, tile_n)
        assert w == sorted(w, reverse=True) and len(set(w)) == len(w)  # from the last tile down, each once
        for m in w:
            adds[m].append(n)
    for m in range(m_tiles):
        # the visitors of a Q tile: every K/V tile whose keys reach one of its rows (causal, bottom-right aligned)
        want = [n for n in range(n_tiles)
                if n * tile_n <= (m + 1) * tile_m - 1 + (seqlen_k - seqlen_q) and m * tile_m < seqlen_q]
        assert sorted(adds[m]) == want, (m, adds[m], want)
        # turn = n: the visitors are 0 .. k-1, so the turns are a permutation of 0 .. k-1 (one fixed order)
        assert sorted(adds[m]) == list(range(len(adds[m])))


@pytest.mark.parametrize("n_tiles,heads,g", [(8, 16, 4), (8, 5, 4), (16, 3, 2), (64, 4, 4), (33, 7, 8), (5, 9, 1)])
def test_launch_order_is_a_permutation_and_kv_tiles_ascend(n_tiles, heads, g):
    ranks = launch_ranks(n_tiles, heads, g)
    assert sorted(ranks) == [(h, n) for h in range(heads) for n in range(n_tiles)]
    first = {}
    for r, (h, n) in enumerate(ranks):
        first.setdefault(h, []).append(n)
    for h, ns in first.items():  # within a head, K/V tile n - 1 launches before n: every turn's predecessors earlier
        assert ns == list(range(n_tiles)), (h, ns)


def simulate(seqlen, tile_m, tile_n, heads, g, slots):
    """Rounds until every CTA has added its dQ to each Q tile of its walk (launch order into ``slots`` free slots,
    one add per CTA and round, an add allowed once the tile's semaphore has reached the CTA's turn n; semaphores move
    at the end of a round). None on a deadlock."""
    n_tiles = -(-seqlen // tile_n)
    ctas = launch_ranks(n_tiles, heads, g)
    walks = {c: walk(c[1], seqlen, seqlen, tile_m, tile_n) for c in ctas}
    sem = {}
    step = {c: 0 for c in ctas}
    pending, resident, rounds = [c for c in ctas], [], 0
    while pending or resident:
        while pending and len(resident) < slots:
            resident.append(pending.pop(0))
        resident = [c for c in resident if step[c] < len(walks[c])]
        if not resident:
            continue
        moved = [c for c in resident if sem.get((c[0], walks[c][step[c]]), 0) == c[1]]
        if not moved:
            return None
        for c in moved:
            sem[(c[0], walks[c][step[c]])] = sem.get((c[0], walks[c][step[c]]), 0) + 1
            step[c] += 1
        rounds += 1
    return rounds


@pytest.mark.parametrize("seqlen,tile_m,g", [(1024, 80, 4), (1024, 128, 1), (2048, 80, 4), (640, 80, 2)])
def test_no_deadlock_whatever_the_residency(seqlen, tile_m, g):
    """A CTA waits only for K/V tiles of its head launched before it: any number of slots finishes (the rotated
    non-causal order needs a head's CTAs resident at once; tests/test_det_schedule.py)."""
    n_tiles = seqlen // 128
    for slots in (1, 2, 3, n_tiles - 1, n_tiles, 2 * n_tiles + 1, 10 ** 6):
        assert simulate(seqlen, tile_m, 128, 3, g, max(1, slots)) is not None, slots


def test_lockstep_fill():
    """All of a head's CTAs resident and in lockstep: they meet Q tile M-1 at the same step, so K/V tile order delays
    CTA n by n adds (the first wave's fill; later launches are spaced by the grid). The head still ends with K/V tile
    0's walk (M rounds): the fill costs the short CTAs' slots, not the head's length."""
    for seqlen, tile_m in ((1024, 80), (2048, 80), (1024, 128)):
        n_tiles, m_tiles = seqlen // 128, -(-seqlen // tile_m)
        want = max(n + m_tiles - (n * 128) // tile_m for n in range(n_tiles))
        assert simulate(seqlen, tile_m, 128, 1, 1, 10 ** 6) == want == m_tiles


# ---- config, per-call choice, kernel flags -----------------------------------------------------------------------
def test_config_value():
    assert "lpt" in DET_SCHEDULES
    cfg = AttnConfig(deterministic=True, det_schedule="lpt")
    assert AttnConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.config_hash() != AttnConfig(deterministic=True).config_hash()
    assert AttnConfig().det_schedule is None  # resolve() picks: lpt only where DEFAULTS' det pair says so
    assert AttnConfig(deterministic=True).resolve("sm90", 128, False).det_schedule == "rotate"
    hd64 = AttnConfig(deterministic=True).resolve("sm90", 64, False)  # the hd64 non-causal deterministic default
    assert (hd64.det_schedule, hd64.bwd_lpt_heads, hd64.bwd_dq_stages) == ("lpt", 16, 2)
    explicit = AttnConfig(deterministic=True, det_schedule="rotate").resolve("sm90", 64, False)  # stays the old default
    assert (explicit.det_schedule, explicit.bwd_lpt_heads, explicit.bwd_dq_stages) == ("rotate", None, None)


def _call(hdim=128, hdim_v=None, causal=True, det=True, features=False, varlen=False, two_cta=False, seqlen_k=None,
          sm_count=None, sched="lpt"):
    from kernels.sm90.backward import backward_config, det_schedule_for_call

    hdim_v = hdim if hdim_v is None else hdim_v
    cfg = AttnConfig(deterministic=det, det_schedule=sched, two_cta=two_cta).resolve("sm90", hdim, causal)
    cfg = backward_config(cfg, varlen=varlen, hdim=hdim, hdim_v=hdim_v, features=features)
    return det_schedule_for_call(cfg, causal, hdim, hdim_v, features, varlen, seqlen_k, sm_count).det_schedule


def test_det_schedule_for_call():
    for hd in (64, 128):
        assert _call(hd) == "lpt"
        assert _call(hd, seqlen_k=10 ** 6, sm_count=132) == "lpt"  # no residency bound
        assert _call(hd, causal=False) == "lpt"  # non-causal: naive's walk and turns, heads interleaved
        assert _call(hd, causal=False, seqlen_k=10 ** 6, sm_count=132) == "lpt"
        assert _call(hd, causal=False, features=True) == "spt"
        assert _call(hd, features=True) == "spt"
        assert _call(hd, varlen=True) == "spt"
        assert _call(hd, two_cta=True) == "spt"
        assert _call(hd, det=False) == "spt"  # the non-deterministic kernel's key
    assert _call(192, 128) == "spt" and _call(256) == "spt"  # no lpt in the wide kernels
    assert _call(128, sched="rotate") == "spt"  # the default: causal runs spt


def test_kernel_flags():
    import cutlass

    from kernels.sm90.bwd import FlashBwdSm90
    from kernels.sm90.bwd_wide192 import FlashBwd192Sm90

    bf = cutlass.BFloat16
    for hdim, tile_m, g in ((64, 128, 1), (128, 80, 4), (128, 64, 0), (128, 80, 16)):
        k = FlashBwdSm90(bf, hdim, True, deterministic=True, det_schedule="lpt", tile_m=tile_m, lpt_heads=g)
        assert k.det_lpt and k.m_desc and not k.spt and not k.m_rotate and not k.diag_align
        assert k.lpt_heads == max(g, bwd.DET_LPT_HEADS)
        spt = FlashBwdSm90(bf, hdim, True, deterministic=True, det_schedule="spt", tile_m=tile_m, lpt_heads=g)
        assert spt.spt and not spt.det_lpt and not spt.m_desc and spt.lpt_heads == 0
    for kw in (dict(two_cta=True), dict(varlen=True), dict(window_left=256), dict(deterministic=False)):
        args = dict(deterministic=True, det_schedule="lpt") | kw
        k = FlashBwdSm90(bf, 128, True, **args)
        assert not k.det_lpt and not k.m_desc, kw
    for hdim in (64, 128):  # non-causal: ascending walks (naive's), g heads interleaved
        k = FlashBwdSm90(bf, hdim, False, deterministic=True, det_schedule="lpt", lpt_heads=32)
        assert k.det_lpt and not k.m_desc and not k.spt and not k.m_rotate and k.lpt_heads == 32
        naive = FlashBwdSm90(bf, hdim, False, deterministic=True, det_schedule="naive", lpt_heads=32)
        assert not naive.det_lpt and naive.lpt_heads == 0
    k192 = FlashBwd192Sm90(bf, 192, True, deterministic=True, det_schedule="lpt", hdim_v=128)
    assert not k192.det_lpt and k192.spt


def test_desc_block():
    for lo, hi in itertools.product(range(0, 5), range(0, 9)):
        assert [bwd.desc_block(i, lo, hi) for i in range(lo, hi)] == list(range(hi - 1, lo - 1, -1))


# ---- SASS ---------------------------------------------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.parametrize("hdim", [64, 128])
def test_lpt_sass(tmp_path, hdim):
    """The lpt kernel: no local memory, the same HGMMA count as the spt kernel, a different main kernel (walk and
    grid); pre / post identical to spt's."""
    from test_bwd_sass import _bwd_kernels_sass

    from kernels.sm90.sass import opcode_counts

    lpt = _bwd_kernels_sass(tmp_path, "deterministic=True, det_schedule='lpt'", hdim, True)
    spt = _bwd_kernels_sass(tmp_path, "deterministic=True, det_schedule='spt'", hdim, True)
    c_lpt, c_spt = opcode_counts(lpt["main"][0]), opcode_counts(spt["main"][0])
    local = {k: v for k, v in c_lpt.items() if re.match(r"(LDL|STL)\b", k)}
    assert not local, local
    assert sum(v for k, v in c_lpt.items() if k.startswith("HGMMA")) == \
        sum(v for k, v in c_spt.items() if k.startswith("HGMMA"))
    assert lpt["main"][0] != spt["main"][0]
    for kind in ("pre", "post"):
        assert lpt[kind][0] == spt[kind][0], kind
