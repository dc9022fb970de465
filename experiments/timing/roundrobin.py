"""Round-robin timing: several callables (our variants, the peers) timed on the same inputs in one process,
one call of each per round, so clock drift and power-cap throttling hit all of them alike (DESIGN.md 6).

``round_robin(fns)`` runs ``warmup`` untimed passes, a settle step (``settle``: passes until the SM clock is
steady, at most ``settle_s`` seconds), then rounds: each round calls every function once, the L2 flushed before
each call, in the orders of a Williams design (``balanced_orders``): over a cycle of rounds every function runs first
equally often and follows every other function equally often, so the state a kernel leaves the GPU in (power headroom,
clocks) favours none of them. A plain rotation (A B C, B C A, ...) did not: there each function always follows the same
neighbour, and on the H200 one backward kernel timed twice in a job read 10-15% apart at 32k by its neighbour alone.
The rounds are rounded up to whole cycles (n rounds for n functions, 2n for odd n).
Times are CUDA events on a GPU, perf_counter on a CPU; on a GPU each round is synchronised, so the GPU sampler's
samples (timing/sampler.py) fall into rounds and a round can be flagged throttled. ``RoundRobin.ratio(a, b)``
takes the ratio t_a / t_b per round and summarises it (median, p20/p80, min/max, n; also over unthrottled rounds).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from experiments.bench import CallTimer, _sync, quantile


@dataclass
class RoundRobin:
    names: list
    times_ms: dict  # name -> per-round times (ms), aligned by round
    round_throttled: list  # per round: True / False / None (no GPU sampler)
    timer: str
    flush_l2: bool
    settle: dict = field(default_factory=dict)
    gpu: dict = field(default_factory=dict)  # sampler summary over the settle step and the rounds

    @property
    def rounds(self) -> int:
        return len(self.round_throttled)

    def stats(self, name: str) -> dict:
        """median/p20/p80/iqr/min/max (ms) and n of one function's per-round times."""
        xs = self.times_ms[name]
        return dict(median=float(statistics.median(xs)), p20=quantile(xs, 0.2), p80=quantile(xs, 0.8),
                    iqr=quantile(xs, 0.75) - quantile(xs, 0.25), min=float(min(xs)), max=float(max(xs)), n=len(xs))

    def ratio(self, name: str, baseline: str) -> dict:
        """Per round r = t_name / t_baseline; the median (``value``), p20/p80/min/max, n, and the median over the
        rounds without a throttled sample (``value_unthrottled``, ``n_unthrottled``; None when none or unknown)."""
        rs = [a / b for a, b in zip(self.times_ms[name], self.times_ms[baseline]) if b > 0]
        calm = [a / b for a, b, th in zip(self.times_ms[name], self.times_ms[baseline], self.round_throttled)
                if b > 0 and th is False]
        return dict(value=float(statistics.median(rs)), p20=quantile(rs, 0.2), p80=quantile(rs, 0.8),
                    min=float(min(rs)), max=float(max(rs)), n=len(rs), samples=rs,
                    value_unthrottled=float(statistics.median(calm)) if calm else None, n_unthrottled=len(calm))


def balanced_orders(names: list) -> list[list]:
    """Williams design for ``names``: n orders (2n for odd n) in which every name is first equally often and every
    ordered pair of neighbours (a directly before b) occurs equally often: once for even n, twice for odd n."""
    n = len(names)
    if n <= 1:
        return [list(names)]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[names[(j + i) % n] for j in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def whole_cycles(rounds: int, n: int) -> int:
    """``rounds`` rounded up to a whole number of balanced_orders cycles for n functions."""
    cycle = len(balanced_orders(list(range(n))))
    return -(-int(rounds) // cycle) * cycle


def _pass(fns: dict, sync: Callable[[], None]) -> None:
    for fn in fns.values():
        fn()
    sync()


def settle(fns: dict, seconds: float, sampler=None, sync: Callable[[], None] = lambda: None,
           window_s: float = 0.25, tol: float = 0.02) -> dict:
    """Run passes over ``fns`` until the SM clock of the last ``window_s`` seconds of samples varies by at most
    ``tol`` (at least 3 samples, at least a quarter of ``seconds`` spent), or ``seconds`` have passed. Without a
    sampler it simply runs for ``seconds``. Returns settle_s (spent), settle_passes, settle_steady, settle_sm_clock_mhz."""
    t0 = time.perf_counter()
    passes, steady, clock = 0, None, None
    while time.perf_counter() - t0 < seconds:
        _pass(fns, sync)
        passes += 1
        if sampler is not None and sampler.available:
            now = time.perf_counter()
            clocks = [s["sm_clock_mhz"] for s in sampler.samples
                      if s.get("sm_clock_mhz") is not None and s["t"] >= now - window_s]
            clock = clocks[-1] if clocks else clock
            steady = len(clocks) >= 3 and (max(clocks) - min(clocks)) <= tol * max(clocks)
            if steady and now - t0 >= seconds / 4:
                break
    return dict(settle_s=time.perf_counter() - t0, settle_passes=passes, settle_steady=steady,
                settle_sm_clock_mhz=clock)


def round_robin(fns: dict, device=None, warmup: int = 5, rounds: int = 30, min_rounds: int = 10,
                flush_l2: bool = True, max_time_s: float | None = None, settle_s: float = 0.0, sampler=None,
                timer=None, hold_us: float = 0.0) -> RoundRobin:
    """Time every function of ``fns`` (name -> zero-argument callable) round-robin: ``rounds`` rounds rounded up to
    whole cycles of balanced_orders, fewer (stopping at the end of a cycle) if ``max_time_s`` of rounds has passed
    but never fewer than ``min(min_rounds, rounds)`` rounded up likewise. ``sampler``: a started
    GpuSampler (its samples flag throttled rounds). ``timer``: CallTimer-like (``run``, ``collect``, ``name``,
    ``flush``); default CUDA events / perf_counter for ``device`` (``hold_us``: experiments.bench.CallTimer's)."""
    if not fns:
        raise ValueError("round_robin: no functions to time")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds={rounds}, warmup={warmup}: need rounds >= 1 and warmup >= 0")
    names = list(fns)
    sync = lambda: _sync(device)  # noqa: E731
    for _ in range(warmup):
        _pass(fns, sync)
    st = settle(fns, settle_s, sampler, sync) if settle_s > 0 else dict(settle_s=0.0, settle_passes=0,
                                                                       settle_steady=None, settle_sm_clock_mhz=None)
    timer = timer or CallTimer(device, flush_l2, hold_us)
    times = {n: [] for n in names}
    throttled = []
    orders = balanced_orders(names)
    cycle = len(orders)
    rounds, least = whole_cycles(rounds, len(names)), whole_cycles(min(min_rounds, rounds), len(names))
    t_start = time.perf_counter()
    for i in range(rounds):
        order = orders[i % cycle]
        t0 = time.perf_counter()
        got = [timer.run(fns[n]) for n in order]
        if any(g is None for g in got):  # CUDA events: this round's times after a sync
            got = timer.collect()
        t1 = time.perf_counter()
        for n, t in zip(order, got):
            times[n].append(float(t))
        throttled.append(sampler.throttled(t0, t1) if sampler is not None and sampler.available else None)
        if (max_time_s is not None and i + 1 >= least and (i + 1) % cycle == 0
                and time.perf_counter() - t_start > max_time_s):
            break
    return RoundRobin(names=names, times_ms=times, round_throttled=throttled, timer=timer.name,
                      flush_l2=getattr(timer, "flush", None) is not None, settle=st,
                      gpu=sampler.summary() if sampler is not None else {})
