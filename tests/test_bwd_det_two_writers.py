"""AttnConfig.bwd_det_two_writers (deterministic sm90 backward, opt-in; DEFAULTS: on at (192, 128)): its protocol, its
turns, its SASS (CPU), for FlashBwd192Sm90 and FlashBwdSm90 (hd 64 / 128: 128-row / 80-row tiles with one staging
buffer, 64-row tiles with two; varlen, two_cta and windows through the same dq_slot / dq_chunk_gptr as dq_writer).

kernels/sm90/bwd.py dq_writer_pair: writer warp h (warp 1 + h) takes the loop steps h, h + 2, ... of its CTA; per
step it waits for its dQ turn, for the other writer's token (``BWD_DQ_TOKEN`` + 1 - h: that writer has passed the
previous step's dQFull), syncs dQFull of both MMA warpgroups, issues the bulk reduce-adds, waits until they have READ
the staging buffer, arrives on dQEmpty (the next step's buffer) and on its own token, and only then waits for the
reductions to COMPLETE and releases the semaphore. Checked here on a Python model with named-barrier generations (160
threads for dQFull / dQEmpty: one MMA warpgroup + one writer warp; 64 for the tokens) under random interleavings of
every warp of every CTA: each barrier generation pairs the MMA warpgroup with the writer of the right step, a buffer
(one, or two used by alternate steps) is never overwritten before it was read, each dQ tile receives each visiting K/V
tile's contribution exactly once and in turn order (the same fixed sequence of fp32 adds as the one-writer kernel),
and nothing deadlocks (rotate with a head's CTAs resident, spt / naive with any number of slots).
"""
from __future__ import annotations

import glob
import os
import random
import re
import textwrap

import pytest

import dsl_subprocess  # tests/dsl_subprocess.py

from kernels import AttnConfig

bwd = pytest.importorskip("kernels.sm90.bwd")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TM, TN = 64, 128  # FlashBwd192Sm90's tiles (FlashBwdSm90: tile_m 128 at hd64, 80 at hd128, 64 opt-in; tile_n 128)


# ---- the schedule: (192, 128) walks and turns (tile_schedule, m_block_at, dq_turn / rotate_turn) -----------------
def walks_and_turns(seqlen_q, seqlen_k, causal, schedule, tm=TM):
    """{n: [Q tiles in walk order]}, {(n, m): turn}, the grid's launch order of K/V tiles (``tm``-row Q tiles)."""
    TM = tm
    n_tiles, m_tiles = -(-seqlen_k // TN), -(-seqlen_q // TM)
    off = seqlen_k - seqlen_q
    rotate = schedule == "rotate" and not causal
    spt = causal and schedule != "naive"
    walks, turns = {}, {}
    for n in range(n_tiles):
        lo = max(0, n * TN - off) // TM if causal else 0
        cnt = m_tiles - lo
        rot = bwd.rotate_start(n, n_tiles, cnt) if rotate and cnt > 1 else 0  # cta_work
        walks[n] = [lo + (i + rot) % cnt for i in range(cnt)] if cnt > 0 else []
        for r, m in enumerate(walks[n]):
            if rotate:
                turns[(n, m)] = bwd.rotate_turn(n, m - lo, n_tiles, cnt)
            elif spt:
                g_max = min(-(-((m + 1) * TM + off) // TN), n_tiles)
                turns[(n, m)] = g_max - 1 - n
            else:
                turns[(n, m)] = n
    order = list(range(n_tiles))[::-1] if spt else list(range(n_tiles))
    return walks, turns, order


SCHED_SHAPES = [(1024, 1024, False, "rotate"), (1000, 1000, False, "rotate"), (333, 397, False, "rotate"),
                (16384, 16384, False, "rotate"), (1024, 1024, True, "rotate"), (1000, 1337, True, "spt"),
                (4096, 4096, True, "spt"), (300, 1003, True, "spt"), (1024, 1024, True, "naive"),
                (1003, 300, False, "naive")]


@pytest.mark.parametrize("sq,sk,causal,sched", SCHED_SHAPES)
def test_turns_are_a_permutation_per_q_tile(sq, sk, causal, sched):
    """Per dQ tile the visitors' turns are 0 .. k-1 (each visitor once): the two writers split the steps, not the
    turns."""
    walks, turns, _ = walks_and_turns(sq, sk, causal, sched)
    per_tile = {}
    for n, w in walks.items():
        assert len(set(w)) == len(w)
        steps = [i for h in (0, 1) for i in range(h, len(w), 2)]  # writer h's steps h, h + 2, ...: each step once
        assert sorted(steps) == list(range(len(w)))
        for m in w:
            per_tile.setdefault(m, []).append(turns[(n, m)])
    for m, t in per_tile.items():
        assert sorted(t) == list(range(len(t))), (m, t)


# ---- the protocol model ---------------------------------------------------------------------------------------
class Barrier:
    """A named barrier: arrivals of (party, threads) accumulate; the generation completes at ``threads``."""

    def __init__(self, name, threads):
        self.name, self.threads, self.count, self.parties, self.gen = name, threads, 0, [], 0

    def arrive(self, party, n):
        self.count += n
        self.parties.append(party)
        assert self.count <= self.threads, (self.name, self.parties)
        if self.count == self.threads:
            done = self.parties
            self.count, self.parties, self.gen = 0, [], self.gen + 1
            return done
        return None


def cta_actors(cta, walk, turns, sems, adds, bars, log, stages=1):
    """Generators of one CTA's two MMA warpgroups and two writer warps; each yields a predicate it waits for.
    ``stages``: staging buffers (step i in buffer i mod stages, as dq_to_writer / dq_writer_pair)."""
    steps = len(walk)
    buf = {(s, w): None for s in range(stages) for w in (0, 1)}

    def sync(b, party, n):
        g = b.gen
        done = b.arrive(party, n)
        if done is not None:
            log.append((b.name, tuple(done)))
        yield lambda: b.gen > g

    def mma(w):
        for i in range(steps):
            yield from sync(bars[("empty", w)], ("mma", w, i), 128)
            buf[(i % stages, w)] = ("writing", i)
            yield lambda: True
            buf[(i % stages, w)] = (cta, i)
            done = bars[("full", w)].arrive(("mma", w, i), 128)
            if done is not None:
                log.append((("full", w), tuple(done)))
            yield lambda: True

    def writer(h):
        if h == 0 and steps > 0:
            for w in (0, 1):
                bars[("empty", w)].arrive(("writer", h, 0), 32) and log.append(("empty", w))
        for i in range(h, steps, 2):
            m = walk[i]
            yield lambda m=m, t=turns[m]: sems[m] == t
            if i > 0:
                yield from sync(bars[("token", 1 - h)], ("writer", h, i), 32)
            got = {}
            for w in (0, 1):
                b = bars[("full", w)]
                g = b.gen
                done = b.arrive(("writer", h, i), 32)
                if done is not None:
                    assert ("mma", w, i) in done and ("writer", h, i) in done, done
                yield lambda b=b, g=g: b.gen > g
                got[w] = buf[(i % stages, w)]
                assert got[w] == (cta, i), (cta, h, i, w, got[w])  # the stored chunk of this very step
            yield lambda: True  # the bulk reads in flight
            for w in (0, 1):
                assert buf[(i % stages, w)] == got[w], "staging buffer overwritten before its bulk read"
            if i + 1 < steps:
                for w in (0, 1):
                    bars[("empty", w)].arrive(("writer", h, i + 1), 32)
                bars[("token", h)].arrive(("writer", h, i), 32)
            yield lambda: True  # completion
            adds[m].append(cta)
            sems[m] += 1

    return [mma(0), mma(1), writer(0), writer(1)]


def run_model(sq, sk, causal, sched, slots, seed, tm=TM, stages=1):
    walks, turns, order = walks_and_turns(sq, sk, causal, sched, tm)
    m_tiles = -(-sq // tm)
    sems = {m: 0 for m in range(m_tiles)}
    adds = {m: [] for m in range(m_tiles)}
    rng = random.Random(seed)
    pending, running = list(order), []  # running: [cta, actors, waiting predicate per actor]

    def launch():
        while pending and len(running) < slots:
            n = pending.pop(0)
            bars = {(k, w): Barrier((k, w), 160 if k != "token" else 64) for k in ("empty", "full") for w in (0, 1)}
            bars.update({("token", h): Barrier(("token", h), 64) for h in (0, 1)})
            acts = cta_actors(n, walks[n], {m: turns[(n, m)] for m in walks[n]}, sems, adds, bars, [], stages)
            running.append([n, {i: [a, lambda: True] for i, a in enumerate(acts)}])

    launch()
    while running:
        ready = [(c, i) for c, (n, acts) in enumerate(running) for i, (a, p) in acts.items() if p()]
        assert ready, f"deadlock: CTAs {[r[0] for r in running]} blocked"
        c, i = rng.choice(ready)
        acts = running[c][1]
        try:
            acts[i][1] = next(acts[i][0])
        except StopIteration:
            del acts[i]
        if not acts:
            running.pop(c)
            launch()
    return walks, turns, adds


MODEL_CASES = [(1024, 1024, False, "rotate", None), (333, 397, False, "rotate", None),
               (1000, 1000, False, "rotate", None), (1024, 1024, True, "spt", 3), (1000, 1337, True, "spt", 2),
               (700, 700, True, "naive", 1),
               (1024, 1024, False, "naive", 2), (65, 65, False, "rotate", None), (64, 64, True, "spt", 1)]


@pytest.mark.parametrize("sq,sk,causal,sched,slots", MODEL_CASES)
def test_protocol_model(sq, sk, causal, sched, slots):
    """Random interleavings (6 seeds): barrier generations pair the right parties, the buffer is read before it is
    rewritten, each dQ tile gets each visitor once in turn order, no deadlock (rotate: every CTA resident)."""
    for seed in range(6):
        n_tiles = -(-sk // TN)
        walks, turns, adds = run_model(sq, sk, causal, sched, slots or n_tiles, seed)
        for m, got in adds.items():
            want = sorted((n for n in walks if m in walks[n]), key=lambda n: turns[(n, m)])
            assert got == want, (m, got, want)


# FlashBwdSm90 (hd 64 / 128): (tile_m, staging buffers) of 128-row (hd64 default) and 80-row (hd128 default) tiles, one
# buffer, and of 64-row tiles (bwd_tile_m=64), two -- step i in buffer i mod 2, so writer h always uses buffer h
SM90_MODEL_CASES = [(1024, 1024, False, "rotate", None, 128, 1), (1000, 1337, True, "spt", 2, 128, 1),
                    (1024, 1024, True, "spt", 3, 80, 1), (333, 397, False, "rotate", None, 80, 1),
                    (1000, 1000, True, "naive", 2, 80, 1), (1024, 1024, False, "rotate", None, 64, 2),
                    (1000, 1337, True, "spt", 2, 64, 2), (65, 65, False, "naive", 1, 64, 2)]


@pytest.mark.parametrize("sq,sk,causal,sched,slots,tm,stages", SM90_MODEL_CASES)
def test_protocol_model_sm90(sq, sk, causal, sched, slots, tm, stages):
    """FlashBwdSm90's tiles and staging buffers: the same guarantees as test_protocol_model (6 seeds)."""
    for seed in range(6):
        n_tiles = -(-sk // TN)
        walks, turns, adds = run_model(sq, sk, causal, sched, slots or n_tiles, seed, tm, stages)
        for m, got in adds.items():
            want = sorted((n for n in walks if m in walks[n]), key=lambda n: turns[(n, m)])
            assert got == want, (m, got, want)


def test_field_reaches_the_kernel_and_is_ignored_elsewhere():
    from kernels.sm90 import backward as B
    from kernels.sm90.bwd_wide192 import FlashBwd192Sm90
    from cutlass import BFloat16

    for causal in (False, True):
        on = AttnConfig(deterministic=True, bwd_det_two_writers=True).resolve("sm90", 192, causal)
        k = B._main_kernel(BFloat16, on, 192, 128, causal)
        assert type(k) is FlashBwd192Sm90 and k.det_two_writers
        off = AttnConfig(bwd_det_two_writers=True).resolve("sm90", 192, causal)  # not deterministic: ignored
        assert not B._main_kernel(BFloat16, off, 192, 128, causal).det_two_writers
        assert B._main_kernel(BFloat16, AttnConfig(deterministic=True).resolve("sm90", 192, causal), 192, 128,
                              causal).det_two_writers  # DEFAULTS: on at (192, 128)
        assert not B._main_kernel(BFloat16, AttnConfig(deterministic=True, bwd_det_two_writers=False).resolve(
            "sm90", 192, causal), 192, 128, causal).det_two_writers
        assert AttnConfig().resolve("sm90", 192, causal).bwd_det_two_writers is None  # not deterministic: hash kept
        for hd in (64, 128):  # FlashBwdSm90 (hd 64 / 128): deterministic only; the default at hd128
            k = B._main_kernel(BFloat16, AttnConfig(deterministic=True, bwd_det_two_writers=True).resolve(
                "sm90", hd, causal), hd, hd, causal)
            # (hd64 non-causal: DEFAULTS' deterministic default there has two staging buffers)
            assert type(k) is bwd.FlashBwdSm90 and k.det_two_writers and k.dq_stages == 1 + (hd == 64 and not causal)
            assert not B._main_kernel(BFloat16, AttnConfig(bwd_det_two_writers=True).resolve("sm90", hd, causal), hd,
                                      hd, causal).det_two_writers
            default = B._main_kernel(BFloat16, AttnConfig(deterministic=True).resolve("sm90", hd, causal), hd, hd,
                                     causal)
            assert default.det_two_writers == (hd == 128)  # DEFAULTS' pair
            assert not B._main_kernel(BFloat16, AttnConfig(deterministic=True, bwd_det_two_writers=False).resolve(
                "sm90", hd, causal), hd, hd, causal).det_two_writers
            k64 = B._main_kernel(BFloat16, AttnConfig(deterministic=True, bwd_det_two_writers=True, bwd_tile_m=64)
                                 .resolve("sm90", hd, causal), hd, hd, causal)
            assert k64.det_two_writers and k64.dq_stages == 2
    assert "bwd_det_two_writers" not in AttnConfig().to_dict()  # default configs / hashes / keys unchanged
    assert AttnConfig(bwd_det_two_writers=True).to_dict()["bwd_det_two_writers"] is True


# ---- SASS ---------------------------------------------------------------------------------------------------------
def _sass(tmp_path, name, cfg, causal, hd=192, call=None):
    """The main kernel's SASS for AttnConfig(cfg) at head dim ``hd`` ((192, 128) at 192); ``call``: another compile
    call (its source), e.g. compile_backward_varlen with dump_dir=D."""
    from kernels.sm90.sass import disassemble, find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    dump = tmp_path / name
    dump.mkdir()
    hdim_v = ", hdim_v=128" if hd == 192 else ""
    call = call or f'compile_backward(AttnConfig({cfg}), "bfloat16", {hd}, {causal}{hdim_v})'
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward, compile_backward_varlen
        D = {str(dump)!r}
    """) + call + "\n"
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)  # a fork of a warm worker: tests/dsl_subprocess.py
    kind = "FlashBwd192Sm90" if hd == 192 else "bwdFlashBwdSm90"
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if kind in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


def _writer_order(two, one):
    """The two-writer SASS ``two``: BAR 13 / 14 of 64 threads four times (two syncs, two arrives), two bulk reductions,
    then the wait for their READ (DEPBAR.LE SB0), dQEmpty (BAR.ARV 9 / 10 of 160) and the token arrive BEFORE the
    fence's MEMBAR.ALL.GPU and the semaphore release (REDG...STRONG.GPU); the one-writer ``one``: no token barrier, no
    dQEmpty arrive between its reductions and its MEMBAR.ALL.GPU (it arrives at the next step's top)."""
    from kernels.sm90.sass import count, opcode_counts

    o2 = opcode_counts(two)
    assert count(o2, "UBLKRED") == 2 and count(o2, "REDG.E.ADD.S32.STRONG.GPU") == 1
    tok = re.compile(r"BAR\.(SYNC\S*|ARV) 0x(d|e), 0x40")
    assert len(tok.findall(two)) == 4 and not tok.search(one)
    lines = two.splitlines()
    idx = lambda pat, start=0: next(i for i in range(start, len(lines)) if re.search(pat, lines[i]))
    red2 = idx(r"UBLKRED", idx(r"UBLKRED") + 1)  # the second chunk's reduction
    read = idx(r"DEPBAR\.LE SB0, 0x0", red2)
    empty = idx(r"BAR\.ARV 0x9, 0xa0", read)
    token = idx(r"BAR\.ARV 0x(d|e), 0x40", empty)
    membar = idx(r"MEMBAR\.ALL\.GPU", red2)
    release = idx(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", membar)
    assert read < empty < token < membar < release
    l1 = one.splitlines()
    r1 = next(i for i, l in enumerate(l1) if "UBLKRED" in l)
    m1 = next(i for i in range(r1, len(l1)) if "MEMBAR.ALL.GPU" in l1[i])
    assert not any(re.search(r"BAR\.ARV 0x(9|a), 0xa0", l1[i]) for i in range(r1, m1))


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_sass(tmp_path, causal):
    """0 LDL / STL; the MMA warps' code as the one-writer kernel's (HGMMA shapes, 4 WARPGROUP.DEPBAR); the writers'
    tokens and order (_writer_order: dQEmpty after the bulk READ, before the completion's MEMBAR.ALL.GPU and the
    release; the one-writer det kernel has no token barrier and arrives on dQEmpty only after its release)."""
    from kernels.sm90.sass import count, opcode_counts

    two = _sass(tmp_path, "two", "deterministic=True, bwd_det_two_writers=True", causal)
    one = _sass(tmp_path, "one", "deterministic=True, bwd_det_two_writers=False", causal)
    for s in (two, one):
        assert not re.search(r"\b(LDL|STL)\b", s)
    o2, o1 = opcode_counts(two), opcode_counts(one)
    hgmma = lambda o: {k: v for k, v in o.items() if k.startswith("HGMMA")}
    assert hgmma(o2) == hgmma(o1)
    assert count(o2, "WARPGROUP.DEPBAR") <= 4
    _writer_order(two, one)


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("hd", [64, 128])
def test_sass_sm90(tmp_path, hd, causal):
    """FlashBwdSm90 (hd 64: 128-row tiles, hd 128: 80-row tiles, one staging buffer each): 0 LDL / STL; the MMA warps'
    code as the one-writer deterministic kernel's (HGMMA shapes and counts, WARPGROUP.DEPBAR count); the writers'
    order of _writer_order (dQEmpty after the bulk READ, before the completion's MEMBAR.ALL.GPU and the release)."""
    from kernels.sm90.sass import count, opcode_counts

    det = "deterministic=True, det_schedule='rotate'"  # (hd64 non-causal's default, lpt, has two staging buffers)
    two = _sass(tmp_path, "two", f"{det}, bwd_det_two_writers=True", causal, hd)
    one = _sass(tmp_path, "one", f"{det}, bwd_det_two_writers=False", causal, hd)
    for s in (two, one):
        assert not re.search(r"\b(LDL|STL)\b", s)
    o2, o1 = opcode_counts(two), opcode_counts(one)
    hgmma = lambda o: {k: v for k, v in o.items() if k.startswith("HGMMA")}
    assert hgmma(o2) == hgmma(o1)
    assert count(o2, "WARPGROUP.DEPBAR") == count(o1, "WARPGROUP.DEPBAR")
    _writer_order(two, one)


# the variants FlashBwdSm90 also compiles with the two writers: 64-row tiles (two staging buffers, writer h in buffer
# h), two_cta (the pair's slot / semaphore, one buffer), varlen (the sequence's padded tiles), a sliding window (turns
# over the window's visitors)
VARIANTS = {
    "tm64_hd128_causal": 'compile_backward(AttnConfig(deterministic=True, bwd_det_two_writers=True, bwd_tile_m=64), '
                         '"bfloat16", 128, True)',
    "two_cta_hd128_causal": 'compile_backward(AttnConfig(deterministic=True, bwd_det_two_writers=True, two_cta=True), '
                            '"bfloat16", 128, True)',
    "varlen_hd128_causal": 'compile_backward_varlen(AttnConfig(deterministic=True, bwd_det_two_writers=True), '
                           '"bfloat16", 128, True, dump_dir=D)',
    "window_hd64": 'compile_backward(AttnConfig(deterministic=True, bwd_det_two_writers=True), "bfloat16", 64, True, '
                   'window_left=200)',
}


@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_sass_sm90_variants(tmp_path, name):
    """0 LDL / STL, the two writers' tokens and order (_writer_order against the one-writer kernel of the same call)."""
    two = _sass(tmp_path, "two", None, None, 0, VARIANTS[name])
    one = _sass(tmp_path, "one", None, None, 0, VARIANTS[name].replace("bwd_det_two_writers=True", "bwd_det_two_writers=False"))
    for s in (two, one):
        assert not re.search(r"\b(LDL|STL)\b", s)
    _writer_order(two, one)
