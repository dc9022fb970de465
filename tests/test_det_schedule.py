"""det_schedule="rotate" (deterministic backward, non-causal): the dQ turn formula, its schedule, its fallbacks (CPU).

K/V tile n (of N) walks the M Q tiles of its head starting at tile floor(n M / N) when N <= M, else n mod M
(rotate_start; kernels/sm90/bwd.py m_block_at); at each Q tile the contributors add their dQ in arrival order of those
walks, ties (K/V tiles equal mod M) broken by n (rotate_turn). A simulation checks that the closed form is that arrival
rank for every (N, M) up to 24 x 24, that CTAs in lockstep then never wait (max(M, N) steps in all, against M + N - 1
in K/V tile order), that spread starts hide a turn hand-off of up to M / N steps (starts n mod M: one step), and why the
backward falls back to "spt" when a head has more K/V tiles than there are SMs (the rotated order makes a CTA wait for
CTAs launched after it: with fewer resident slots than K/V tiles it can deadlock; K/V tile order never does).
"""
from __future__ import annotations

import itertools

import pytest

from kernels import AttnConfig
from kernels.config import DET_SCHEDULES, ConfigError

bwd = pytest.importorskip("kernels.sm90.bwd")


def start(n: int, n_tiles: int, m_tiles: int) -> int:
    """The first Q tile of K/V tile n's walk, written out: spread over the M tiles when N <= M, else n mod M."""
    return n * m_tiles // n_tiles if n_tiles <= m_tiles else n % m_tiles


def test_rotate_start():
    for n_tiles, m_tiles in itertools.product(range(1, 30), range(1, 30)):
        starts = [bwd.rotate_start(n, n_tiles, m_tiles) for n in range(n_tiles)]
        assert starts == [start(n, n_tiles, m_tiles) for n in range(n_tiles)]
        assert all(0 <= a < m_tiles for a in starts)
        if n_tiles <= m_tiles:  # distinct and increasing: consecutive arrivals at a Q tile >= 1 step apart
            assert all(b > a for a, b in zip(starts, starts[1:]))
    assert [bwd.rotate_start(n, 8, 13) for n in range(8)] == [0, 1, 3, 4, 6, 8, 9, 11]  # hd128 1k: 1.6 steps


def arrival_ranks(n_tiles: int, m_tiles: int) -> list[dict[int, int]]:
    """ranks[r][n]: the place of K/V tile n among the contributors of Q tile r, ordered by (step of arrival, n)."""
    arrivals = [[] for _ in range(m_tiles)]
    for n in range(n_tiles):
        for s in range(m_tiles):
            arrivals[(start(n, n_tiles, m_tiles) + s) % m_tiles].append((s, n))
    return [{n: i for i, (_, n) in enumerate(sorted(a))} for a in arrivals]


@pytest.mark.parametrize("n_tiles", range(1, 25))
def test_rotate_turn_is_the_arrival_rank(n_tiles):
    for m_tiles in range(1, 25):
        ranks = arrival_ranks(n_tiles, m_tiles)
        for r in range(m_tiles):
            turns = [bwd.rotate_turn(n, r, n_tiles, m_tiles) for n in range(n_tiles)]
            assert sorted(turns) == list(range(n_tiles)), (n_tiles, m_tiles, r, turns)  # a permutation
            assert turns == [ranks[r][n] for n in range(n_tiles)], (n_tiles, m_tiles, r)


@pytest.mark.parametrize("n_tiles,m_tiles", [(1, 1), (1, 7), (7, 1), (5, 5), (64, 64), (128, 32), (33, 128),
                                             (132, 131), (257, 256)])
def test_rotate_turn_larger_shapes(n_tiles, m_tiles):
    ranks = arrival_ranks(n_tiles, m_tiles)
    for r in range(m_tiles):
        assert [bwd.rotate_turn(n, r, n_tiles, m_tiles) for n in range(n_tiles)] == \
            [ranks[r][n] for n in range(n_tiles)]


def test_rotate_turn_split_matches_the_kernel_call():
    """dq_writer computes rotate_turn_base once per CTA with a = m_rot (rotate_start; 0 when M == 1) and
    rotate_turn_at per Q tile: the split gives rotate_turn."""
    for n_tiles, m_tiles in itertools.product(range(1, 13), range(1, 13)):
        for n in range(n_tiles):
            m_rot = bwd.rotate_start(n, n_tiles, m_tiles) if m_tiles > 1 else 0  # cta_work
            rot = bwd.rotate_turn_base(n, m_rot, n_tiles, m_tiles)
            for r in range(m_tiles):
                assert bwd.rotate_turn_at(r, m_rot, n_tiles, m_tiles, *rot) == bwd.rotate_turn(
                    n, r, n_tiles, m_tiles)


def walk(n: int, m_tiles: int, rotate: bool, n_tiles: int) -> list[int]:
    a = start(n, n_tiles, m_tiles) if rotate else 0
    return [(a + s) % m_tiles for s in range(m_tiles)]


def turn(n: int, r: int, n_tiles: int, m_tiles: int, rotate: bool) -> int:
    return bwd.rotate_turn(n, r, n_tiles, m_tiles) if rotate else n  # naive / non-causal spt: K/V tile order


def simulate(n_tiles: int, m_tiles: int, rotate: bool, slots: int | None = None, heads: int = 1):
    """Rounds until every CTA (head-major launch order, K/V tile fastest, as blockIdx) has added its dQ to each Q tile
    of its walk, one add per CTA and round, an add allowed once the tile's semaphore has reached the CTA's turn (the
    semaphores move at the end of a round). ``slots``: CTAs resident at once (launched in order into free slots).
    Returns the number of rounds, or None on a deadlock (nothing can move)."""
    ctas = [(h, n) for h in range(heads) for n in range(n_tiles)]
    slots = len(ctas) if slots is None else slots
    sem = {(h, r): 0 for h in range(heads) for r in range(m_tiles)}
    step = {c: 0 for c in ctas}
    pending, resident, rounds = list(ctas), [], 0
    while pending or resident:
        while pending and len(resident) < slots:
            resident.append(pending.pop(0))
        moved = []
        for h, n in resident:
            r = walk(n, m_tiles, rotate, n_tiles)[step[(h, n)]]
            if sem[(h, r)] == turn(n, r, n_tiles, m_tiles, rotate):
                moved.append((h, n, r))
        if not moved:
            return None
        for h, n, r in moved:
            sem[(h, r)] += 1
            step[(h, n)] += 1
        resident = [c for c in resident if step[c] < m_tiles]
        rounds += 1
    return rounds


@pytest.mark.parametrize("n_tiles,m_tiles", [(8, 8), (8, 32), (16, 16), (32, 8), (12, 5), (1, 4), (4, 1)])
def test_lockstep_rounds(n_tiles, m_tiles):
    """In lockstep, K/V tile order staggers the CTAs of a head by one add each (M + N - 1 rounds); the rotated walks
    with arrival-order turns take max(M, N) rounds, the bound of this model (a CTA adds to M tiles, a tile takes its N
    adds one at a time): no wait at all when N <= M."""
    assert simulate(n_tiles, m_tiles, rotate=False) == m_tiles + n_tiles - 1
    assert simulate(n_tiles, m_tiles, rotate=True) == max(m_tiles, n_tiles)


def hop_makespan(n_tiles: int, m_tiles: int, hop: float, spread: bool) -> float:
    """Lockstep model with a turn hand-off: one step per Q tile per CTA (time 1), and a CTA's add at a Q tile may start
    only ``hop`` after the previous contributor's (the writer's bulk-reduce completion, fence and release, then the
    next CTA's acquire). Returns the time of the last add, one head, all CTAs resident."""
    a = [start(n, n_tiles, m_tiles) if spread else n % m_tiles for n in range(n_tiles)]
    order = [sorted(range(n_tiles), key=lambda n: ((r - a[n]) % m_tiles, n)) for r in range(m_tiles)]
    done, t = {}, [0.0] * n_tiles
    for s in range(m_tiles):  # a predecessor at a Q tile arrived at an earlier step (N <= M: distinct starts)
        for n in sorted(range(n_tiles), key=lambda n: -a[n]):
            r = (a[n] + s) % m_tiles
            i = order[r].index(n)
            ready = t[n] + 1.0
            if i > 0:
                ready = max(ready, done[(r, order[r][i - 1])] + hop)
            t[n] = done[(r, n)] = ready
    return max(t)


@pytest.mark.parametrize("n_tiles,m_tiles", [(8, 13), (64, 103), (128, 205), (32, 64)])
def test_spread_starts_hide_the_turn_hand_off(n_tiles, m_tiles):
    """hd128 (80-row Q tiles under 128-key tiles: M = 1.6 N) and (192, 128) (M = 2 N): with starts n mod M consecutive
    contributors at a Q tile arrive one step apart, so a hand-off longer than a step accumulates along the walk
    ((N - 1) (hop - 1) extra); spread starts (gaps of floor / ceil(M / N) steps) absorb a hand-off of up to M / N
    steps at the next larger gap: at most ``hop`` extra in all, whatever N."""
    for hop in (1.25, 1.5):  # a hand-off a quarter / half step longer than the step
        assert hop <= m_tiles / n_tiles
        spread = hop_makespan(n_tiles, m_tiles, hop, spread=True)
        assert m_tiles - 1e-9 <= spread <= m_tiles + hop
        assert hop_makespan(n_tiles, m_tiles, hop, spread=False) >= m_tiles + (n_tiles - 1) * (hop - 1) - 1e-9
    for sp in (True, False):  # a hand-off within a step: no wait either way
        assert hop_makespan(n_tiles, m_tiles, 1.0, spread=sp) == pytest.approx(m_tiles)


@pytest.mark.parametrize("n_tiles,m_tiles", [(4, 4), (6, 4), (3, 5), (8, 8), (9, 3)])
def test_residency(n_tiles, m_tiles):
    """K/V tile order never deadlocks whatever the residency; the rotated order does not when a head's CTAs fit the
    slots (backward.py det_schedule_for_call: K/V tiles <= SMs)."""
    for slots in range(1, n_tiles + 3):
        assert simulate(n_tiles, m_tiles, rotate=False, slots=slots, heads=3) is not None
        if slots >= n_tiles:
            assert simulate(n_tiles, m_tiles, rotate=True, slots=slots, heads=3) is not None


@pytest.mark.parametrize("n_tiles,m_tiles,slots", [(4, 4, 3), (8, 8, 7), (16, 16, 8), (16, 32, 12)])
def test_rotate_can_deadlock_past_residency(n_tiles, m_tiles, slots):
    """With fewer slots than K/V tiles the rotated order can deadlock (the resident CTAs all wait for a CTA of their
    head not launched yet), which is why backward.py runs "spt" there; K/V tile order finishes."""
    assert simulate(n_tiles, m_tiles, rotate=True, slots=slots) is None
    assert simulate(n_tiles, m_tiles, rotate=False, slots=slots) is not None


# ---- config and per-call choice ---------------------------------------------------------------------------------
def test_config_accepts_rotate_and_names_it_in_errors():
    assert "rotate" in DET_SCHEDULES
    cfg = AttnConfig(deterministic=True, det_schedule="rotate")
    assert cfg.to_dict()["det_schedule"] == "rotate"
    assert AttnConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.config_hash() != AttnConfig(deterministic=True, det_schedule="spt").config_hash()
    # None: resolve() picks it (DEFAULTS' det pair; else "rotate", H200 2026-12-01: 1.02-1.24x spt's speed, non-causal)
    assert AttnConfig().det_schedule is None
    for hdim, causal, det, want in ((128, False, True, "rotate"), (128, True, True, "rotate"), (64, True, True, "rotate"),
                                    (64, False, False, "rotate"), (64, False, True, "lpt"), (256, False, True, "rotate")):
        assert AttnConfig(deterministic=det).resolve("sm90", hdim, causal).det_schedule == want, (hdim, causal, det)
    for bad in ("rot", "Rotate", "", 1):
        with pytest.raises(ConfigError, match=r"det_schedule=.*'rotate'"):
            AttnConfig(det_schedule=bad)


def _call(hdim=64, hdim_v=None, causal=False, det=True, features=False, varlen=False, two_cta=False, seqlen_k=None,
          sm_count=None, **kw):
    from kernels.sm90.backward import backward_config, det_schedule_for_call

    hdim_v = hdim if hdim_v is None else hdim_v
    cfg = AttnConfig(deterministic=det, det_schedule="rotate", two_cta=two_cta, **kw).resolve("sm90", hdim, causal)
    cfg = backward_config(cfg, varlen=varlen, hdim=hdim, hdim_v=hdim_v, features=features)
    return det_schedule_for_call(cfg, causal, hdim, hdim_v, features, varlen, seqlen_k, sm_count).det_schedule


def test_det_schedule_for_call():
    for hd in ((64, 64), (128, 128), (192, 128)):
        assert _call(*hd) == "rotate"
        assert _call(*hd, causal=True) == "spt"  # causal: SPT
        assert _call(*hd, features=True) == "spt"  # sliding window / softcap
        assert _call(*hd, det=False) == "spt"  # nothing to order: the non-deterministic kernel's key
    assert _call(64, varlen=True) == "spt"
    assert _call(64, two_cta=True) == "spt" and _call(128, two_cta=True) == "spt"
    # hd256: the 2-CTA pairs (its default, two_cta=None -> True; 64-row K/V tiles pinned here) and the one-CTA kernel
    # rotate too; pairs only while a head's CTAs fit half the SMs, one CTA while they fit one per SM
    assert _call(256, two_cta=None) == "rotate" and _call(256, two_cta=True) == "rotate" and _call(256) == "rotate"
    assert _call(256, causal=True, two_cta=None) == "spt" and _call(256, features=True) == "spt"
    assert _call(256, two_cta=True, bwd_two_cta_n80=False, seqlen_k=66 * 64, sm_count=132) == "rotate"
    assert _call(256, two_cta=True, bwd_two_cta_n80=False, seqlen_k=66 * 64 + 1, sm_count=132) == "spt"
    # 80-row K/V tiles (bwd_two_cta_n80, hd256's default, deterministic too): 80 keys per CTA, half the SMs
    assert _call(256, two_cta=True, seqlen_k=66 * 80, sm_count=132) == "rotate"
    assert _call(256, two_cta=True, seqlen_k=66 * 80 + 1, sm_count=132) == "spt"
    assert _call(256, seqlen_k=132 * 64, sm_count=132) == "rotate"
    assert _call(256, seqlen_k=132 * 64 + 1, sm_count=132) == "spt"
    # a head's K/V tiles (128 rows) must fit one per SM: 132 SMs hold 16896 keys
    assert _call(64, seqlen_k=132 * 128, sm_count=132) == "rotate"
    assert _call(64, seqlen_k=132 * 128 + 1, sm_count=132) == "spt"
    assert _call(128, seqlen_k=4096, sm_count=16) == "spt"  # e.g. a MIG slice
    assert _call(64, seqlen_k=10 ** 6) == "rotate"  # no SM count given (compile_backward): the kernel


def test_kernel_flags():
    """The kernel classes: rotate -> det_rotate and m_rotate (the rotated walk) only where det_schedule_for_call keeps
    it; causal rotate is SPT; spt / naive unchanged."""
    import cutlass

    from kernels.sm90.bwd import FlashBwdSm90
    from kernels.sm90.bwd_wide import FlashBwdWideSm90
    from kernels.sm90.bwd_wide192 import FlashBwd192Sm90

    bf = cutlass.BFloat16
    for hdim, tile_m in ((64, 128), (128, 80), (128, 64)):
        k = FlashBwdSm90(bf, hdim, False, deterministic=True, det_schedule="rotate", tile_m=tile_m)
        assert k.det_rotate and k.m_rotate and not k.spt
        spt = FlashBwdSm90(bf, hdim, False, deterministic=True, tile_m=tile_m)
        assert not spt.det_rotate and not spt.m_rotate
        c = FlashBwdSm90(bf, hdim, True, deterministic=True, det_schedule="rotate", tile_m=tile_m)
        assert c.spt and not c.det_rotate and not c.m_rotate
        assert FlashBwdSm90(bf, hdim, True, deterministic=True, det_schedule="naive", tile_m=tile_m).spt is False
    for kw in (dict(two_cta=True), dict(varlen=True), dict(window_left=256)):
        k = FlashBwdSm90(bf, 128, False, deterministic=True, det_schedule="rotate", **kw)
        assert not k.det_rotate and not k.m_rotate, kw
    # hd64 non-deterministic keeps its own rotation (m_rotate), whatever det_schedule says
    for sched in DET_SCHEDULES:
        k = FlashBwdSm90(bf, 64, False, deterministic=False, det_schedule=sched)
        assert k.m_rotate and not k.det_rotate
    k192 = FlashBwd192Sm90(bf, 192, False, deterministic=True, det_schedule="rotate", hdim_v=128)
    assert k192.det_rotate and k192.m_rotate
    assert not FlashBwd192Sm90(bf, 192, False, deterministic=True, hdim_v=128).m_rotate
    assert not FlashBwd192Sm90(bf, 192, True, deterministic=True, det_schedule="rotate", hdim_v=128).m_rotate
    from kernels.sm90.bwd_wide_two_cta import FlashBwdWideTwoCtaSm90

    for cls in (FlashBwdWideSm90, FlashBwdWideTwoCtaSm90):  # hd256, one CTA and pairs
        wide = cls(bf, 256, False, deterministic=True, det_schedule="rotate")
        assert wide.det_rotate and wide.m_rotate and not wide.spt, cls
        for kw in (dict(), dict(det_schedule="rotate", deterministic=False)):
            assert not cls(bf, 256, False, **{"deterministic": True, **kw}).m_rotate, (cls, kw)
        assert not cls(bf, 256, True, deterministic=True, det_schedule="rotate").m_rotate
        rq = cls(bf, 256, False, rotate_q=True)  # AttnConfig.bwd_rotate_q: rotated walks, no determinism
        assert rq.m_rotate and not rq.det_rotate and not cls(bf, 256, True, rotate_q=True).m_rotate
    with pytest.raises(ValueError, match="rotate"):
        FlashBwdSm90(bf, 64, False, deterministic=True, det_schedule="rot")
