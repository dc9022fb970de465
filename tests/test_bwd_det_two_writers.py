"""AttnConfig.bwd_det_two_writers (deterministic (192, 128) backward, opt-in): its protocol, its turns, its SASS (CPU).

FlashBwd192Sm90.dq_writer_pair: writer warp h (warp 1 + h) takes the loop steps h, h + 2, ... of its CTA; per step it
waits for its dQ turn, for the other writer's token (``BWD_DQ_TOKEN`` + 1 - h: that writer has passed the previous
step's dQFull), syncs dQFull of both MMA warpgroups, issues the bulk reduce-adds, waits until they have READ the one
staging buffer, arrives on dQEmpty (the next step's buffer) and on its own token, and only then waits for the reductions
to COMPLETE and releases the semaphore. Checked here on a Python model with named-barrier generations (160 threads for
dQFull / dQEmpty: one MMA warpgroup + one writer warp; 64 for the tokens) under random interleavings of every warp of
every CTA: each barrier generation pairs the MMA warpgroup with the writer of the right step, the buffer is never
overwritten before it was read, each dQ tile receives each visiting K/V tile's contribution exactly once and in turn
order (the same fixed sequence of fp32 adds as the one-writer kernel), and nothing deadlocks (rotate with a head's CTAs
resident, spt / naive with any number of slots).
"""
from __future__ import annotations

import glob
import os
import random
import re
import subprocess
import sys
import textwrap

import pytest

from kernels import AttnConfig

bwd = pytest.importorskip("kernels.sm90.bwd")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TM, TN = 64, 128  # FlashBwd192Sm90's tiles


# ---- the schedule: (192, 128) walks and turns (tile_schedule, m_block_at, dq_turn / rotate_turn) -----------------
def walks_and_turns(seqlen_q, seqlen_k, causal, schedule):
    """{n: [Q tiles in walk order]}, {(n, m): turn}, the grid's launch order of K/V tiles."""
    n_tiles, m_tiles = -(-seqlen_k // TN), -(-seqlen_q // TM)
    off = seqlen_k - seqlen_q
    rotate = schedule == "rotate" and not causal
    spt = causal and schedule != "naive"
    walks, turns = {}, {}
    for n in range(n_tiles):
        lo = max(0, n * TN - off) // TM if causal else 0
        cnt = m_tiles - lo
        rot = n % cnt if rotate and cnt > 1 else 0
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


def cta_actors(cta, walk, turns, sems, adds, bars, log):
    """Generators of one CTA's two MMA warpgroups and two writer warps; each yields a predicate it waits for."""
    steps = len(walk)
    buf = {0: None, 1: None}

    def sync(b, party, n):
        g = b.gen
        done = b.arrive(party, n)
        if done is not None:
            log.append((b.name, tuple(done)))
        yield lambda: b.gen > g

    def mma(w):
        for i in range(steps):
            yield from sync(bars[("empty", w)], ("mma", w, i), 128)
            buf[w] = ("writing", i)
            yield lambda: True
            buf[w] = (cta, i)
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
                got[w] = buf[w]
                assert got[w] == (cta, i), (cta, h, i, w, got[w])  # the stored chunk of this very step
            yield lambda: True  # the bulk reads in flight
            for w in (0, 1):
                assert buf[w] == got[w], "staging buffer overwritten before its bulk read"
            if i + 1 < steps:
                for w in (0, 1):
                    bars[("empty", w)].arrive(("writer", h, i + 1), 32)
                bars[("token", h)].arrive(("writer", h, i), 32)
            yield lambda: True  # completion
            adds[m].append(cta)
            sems[m] += 1

    return [mma(0), mma(1), writer(0), writer(1)]


def run_model(sq, sk, causal, sched, slots, seed):
    walks, turns, order = walks_and_turns(sq, sk, causal, sched)
    m_tiles = -(-sq // TM)
    sems = {m: 0 for m in range(m_tiles)}
    adds = {m: [] for m in range(m_tiles)}
    rng = random.Random(seed)
    pending, running = list(order), []  # running: [cta, actors, waiting predicate per actor]

    def launch():
        while pending and len(running) < slots:
            n = pending.pop(0)
            bars = {(k, w): Barrier((k, w), 160 if k != "token" else 64) for k in ("empty", "full") for w in (0, 1)}
            bars.update({("token", h): Barrier(("token", h), 64) for h in (0, 1)})
            acts = cta_actors(n, walks[n], {m: turns[(n, m)] for m in walks[n]}, sems, adds, bars, [])
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
        assert not B._main_kernel(BFloat16, AttnConfig(deterministic=True).resolve("sm90", 192, causal), 192, 128,
                                  causal).det_two_writers
        k128 = B._main_kernel(BFloat16, AttnConfig(deterministic=True, bwd_det_two_writers=True).resolve(
            "sm90", 128, causal), 128, 128, causal)
        assert not k128.det_two_writers  # FlashBwdSm90: no effect
    assert "bwd_det_two_writers" not in AttnConfig().to_dict()  # default configs / hashes / keys unchanged
    assert AttnConfig(bwd_det_two_writers=True).to_dict()["bwd_det_two_writers"] is True


# ---- SASS ---------------------------------------------------------------------------------------------------------
def _sass(tmp_path, name, cfg, causal):
    from kernels.sm90.sass import disassemble, find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    dump = tmp_path / name
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig({cfg}), "bfloat16", 192, {causal}, hdim_v=128)
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if "FlashBwd192Sm90" in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_sass(tmp_path, causal):
    """0 LDL / STL; the MMA warps' code as the one-writer kernel's (HGMMA shapes, 4 WARPGROUP.DEPBAR); the writer: the
    tokens (BAR 13 / 14 of 64 threads, sync and arrive), the two bulk reductions, then the wait for their READ
    (DEPBAR.LE SB0), dQEmpty (BAR.ARV 9 / 10 of 160) and the token arrive BEFORE the fence's MEMBAR.ALL.GPU (the
    wait for the completion) and the semaphore release (REDG...STRONG.GPU); the one-writer det kernel has no token
    barrier and arrives on dQEmpty only after its MEMBAR.ALL.GPU + release."""
    from kernels.sm90.sass import count, opcode_counts

    two = _sass(tmp_path, "two", "deterministic=True, bwd_det_two_writers=True", causal)
    one = _sass(tmp_path, "one", "deterministic=True", causal)
    for s in (two, one):
        assert not re.search(r"\b(LDL|STL)\b", s)
    o2, o1 = opcode_counts(two), opcode_counts(one)
    hgmma = lambda o: {k: v for k, v in o.items() if k.startswith("HGMMA")}
    assert hgmma(o2) == hgmma(o1)
    assert count(o2, "WARPGROUP.DEPBAR") <= 4
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
    # one writer: its dQEmpty arrives come after a release (the loop's next step) or at the start, never between the
    # reductions and the MEMBAR
    l1 = one.splitlines()
    r1 = next(i for i, l in enumerate(l1) if "UBLKRED" in l)
    m1 = next(i for i in range(r1, len(l1)) if "MEMBAR.ALL.GPU" in l1[i])
    assert not any(re.search(r"BAR\.ARV 0x(9|a), 0xa0", l1[i]) for i in range(r1, m1))
