"""Discrete-event model of the deterministic backward's dQ turns when a head has more K/V tiles than resident slots.

``python scripts/det_walk_model.py [N M HEADS SLOTS]`` (default 64 102 4 33: the hd128 32k case, 256 K/V tiles x 410
80-row Q tiles on 132 SMs, scaled by 4). CTAs launch in order (head-major, K/V tile fastest) into free slots. A CTA
computes one Q tile per step (1 +- ``jit``), then adds its dQ once the tile's semaphore reaches its turn, at least
``hop`` after the previous contributor's add; its MMA warps run at most ``B`` steps ahead of their adds (the staging
buffers). Prints each schedule's makespan as a speed ratio against walks with no turns (the non-deterministic kernel):

  kv        K/V tile order: every walk from Q tile 0, turn = K/V tile index (what backward.py runs beyond the SMs)
  grp<G>    rotated walks with arrival-order turns (kernels/sm90/bwd_dq_writer.py rotate_start / rotate_turn) inside
            groups of G K/V tiles, a group's turns after every earlier group's (session 32's proposal)
  rot       one rotated group per head (the default while a head's K/V tiles fit the slots)

A model, not a measurement: it says which schedule can win, the GPU says by how much (docs/DEFAULTS_HISTORY.md,
session 33).
"""
from __future__ import annotations

import heapq
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def plan(n: int, n_tiles: int, m_tiles: int, mode: str, group: int | None) -> list[tuple[int, int | None]]:
    """(Q tile, turn) of each step of K/V tile n's walk (turn None: no ordering)."""
    from kernels.sm90.bwd_dq_writer import rotate_start, rotate_turn

    if mode == "free":
        return [(r, None) for r in range(m_tiles)]
    if mode == "kv":
        return [(r, n) for r in range(m_tiles)]
    g, local = divmod(n, group) if mode == "grp" else (0, n)
    size = min(group, n_tiles - g * group) if mode == "grp" else n_tiles
    a = rotate_start(local, size, m_tiles)
    steps = [(a + s) % m_tiles for s in range(m_tiles)]
    return [(r, g * (group or 0) + rotate_turn(local, r, size, m_tiles)) for r in steps]


def makespan(n_tiles: int, m_tiles: int, heads: int, slots: int, mode: str, group: int | None = None,
             hop: float = 0.5, jit: float = 0.1, bufs: int = 2, seed: int = 0) -> float | None:
    """Time of the last add, or None on a deadlock (a CTA waits for a turn that never comes)."""
    rng = random.Random(seed)
    pending = [(h, n) for h in range(heads) for n in range(n_tiles)]
    pending.reverse()
    sem, last, waiters, state, events = {}, {}, {}, {}, []
    resident, done, end, seq = 0, 0, 0.0, 0

    def compute(c):  # the step's compute ends; then it tries its add
        nonlocal seq
        st = state[c]
        s = st["s"]
        ready = max(st["ce"], st["adds"][s - bufs] if s >= bufs else 0.0)
        st["ce"] = ready + 1.0 + rng.uniform(-jit, jit)
        heapq.heappush(events, (st["ce"], seq, c))
        seq += 1

    def launch(t):
        nonlocal resident
        while pending and resident < slots:
            c = pending.pop()
            resident += 1
            state[c] = dict(plan=plan(c[1], n_tiles, m_tiles, mode, group), s=0, ce=t, adds=[])
            compute(c)

    launch(0.0)
    while events:
        t, _, c = heapq.heappop(events)
        st = state[c]
        r, turn = st["plan"][st["s"]]
        key = (c[0], r)
        if turn is not None and sem.get(key, 0) != turn:
            waiters[(key, turn)] = c
            continue
        t_add = t if turn is None else max(t, last.get(key, -1e9) + hop)
        sem[key] = sem.get(key, 0) + 1
        last[key] = t_add
        st["adds"].append(t_add)
        st["s"] += 1
        w = waiters.pop((key, sem[key]), None)
        if w is not None:
            heapq.heappush(events, (max(t_add, state[w]["ce"]), -1, w))
        if st["s"] == m_tiles:
            resident -= 1
            done += 1
            end = max(end, t_add)
            launch(t_add)
        else:
            compute(c)
    return end if done == n_tiles * heads else None


def main() -> None:
    n_tiles, m_tiles, heads, slots = (int(x) for x in (sys.argv[1:5] or (64, 102, 4, 33)))
    for hop in (0.3, 0.6, 0.9):
        free = makespan(n_tiles, m_tiles, heads, slots, "free", hop=hop)
        out = [f"hop {hop}: kv {free / makespan(n_tiles, m_tiles, heads, slots, 'kv', hop=hop):.3f}"]
        for g in sorted({slots // 2, slots - 4, slots, slots + 1}):
            t = makespan(n_tiles, m_tiles, heads, slots, "grp", group=g, hop=hop)
            out.append(f"grp{g} " + ("deadlock" if t is None else f"{free / t:.3f}"))
        if n_tiles <= slots:
            out.append(f"rot {free / makespan(n_tiles, m_tiles, heads, slots, 'rot', hop=hop):.3f}")
        print("  ".join(out), flush=True)


if __name__ == "__main__":
    main()
