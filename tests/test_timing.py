"""The GPU sampler thread and the round-robin timer, on the CPU (fake NVML reads, a fake drifting backend)."""
import itertools
import statistics
import time
from collections import Counter

import pytest

from experiments.timing.roundrobin import balanced_orders, round_robin, settle, whole_cycles
from experiments.timing.sampler import GpuSampler, is_throttled, reason_names


class VirtualClock:
    """Simulated time (ms): a backend's call takes base_ms times a slowdown that grows with time (drift)."""

    def __init__(self, drift_per_ms: float):
        self.now, self.drift = 0.0, drift_per_ms

    def backend(self, base_ms: float):
        def fn():
            self.now += base_ms * (1.0 + self.drift * self.now)
        return fn


class VirtualTimer:
    name, flush = "virtual", None

    def __init__(self, clock):
        self.clock = clock

    def run(self, fn):
        t0 = self.clock.now
        fn()
        return self.clock.now - t0

    def collect(self):
        return []


def test_round_robin_ratio_survives_drift_that_skews_separate_timing():
    """The GPU slows down 2x over the run: per-round ratios still give B/A = 1.5; timed one after the other they don't."""
    rounds = 42  # whole cycles of the balanced orders of 3 functions (6)
    clock = VirtualClock(drift_per_ms=1.0 / 200)
    fns = {"A": clock.backend(2.0), "B": clock.backend(3.0), "C": clock.backend(2.0)}
    rr = round_robin(fns, warmup=0, rounds=rounds, timer=VirtualTimer(clock))
    assert rr.rounds == rounds and rr.timer == "virtual" and rr.flush_l2 is False
    assert all(len(rr.times_ms[n]) == rounds for n in fns)
    assert rr.times_ms["A"][-1] > 1.5 * rr.times_ms["A"][0]  # the drift is real
    r = rr.ratio("B", "A")
    assert r["value"] == pytest.approx(1.5, rel=0.02) and r["n"] == rounds
    assert r["p20"] <= r["value"] <= r["p80"] and r["value_unthrottled"] is None  # no sampler: throttling unknown
    assert rr.ratio("C", "A")["value"] == pytest.approx(1.0, rel=0.02)

    seq = VirtualClock(drift_per_ms=1.0 / 200)  # the same backends timed as separate jobs: A's rounds, then B's
    t = VirtualTimer(seq)
    a = sorted(t.run(seq.backend(2.0)) for _ in range(rounds))[rounds // 2]
    b = sorted(t.run(seq.backend(3.0)) for _ in range(rounds))[rounds // 2]
    assert b / a > 1.5 * 1.2


def test_round_robin_balances_neighbours_and_honours_max_time():
    calls = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "ABC"}
    rr = round_robin(fns, device="cpu", warmup=1, rounds=3, flush_l2=False)
    assert calls[:3] == list("ABC")  # warm-up pass
    rounds = [calls[3 + 3 * i: 6 + 3 * i] for i in range(rr.rounds)]
    assert rr.rounds == 6 and rounds == balanced_orders(list("ABC"))  # 3 rounds -> one whole cycle (2n, n odd)
    slow = {"A": lambda: time.sleep(0.002), "B": lambda: time.sleep(0.002)}
    rr = round_robin(slow, device="cpu", warmup=0, rounds=1000, min_rounds=10, max_time_s=0.0)
    assert rr.rounds == 10 and rr.timer == "perf_counter"
    rr = round_robin({n: (lambda: None) for n in "ABCD"}, device="cpu", warmup=0, rounds=1000, min_rounds=10,
                     max_time_s=0.0)
    assert rr.rounds == 12  # stops at the end of a cycle (4 orders)
    with pytest.raises(ValueError, match="no functions"):
        round_robin({})


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9])
def test_balanced_orders_are_a_williams_design(n):
    names = [f"x{i}" for i in range(n)]
    rows = balanced_orders(names)
    assert len(rows) == (n if n % 2 == 0 or n == 1 else 2 * n) and whole_cycles(10, n) % len(rows) == 0
    assert all(sorted(r) == sorted(names) for r in rows)
    firsts = Counter(r[0] for r in rows)
    pairs = Counter((a, b) for r in rows for a, b in zip(r, r[1:]))
    assert len(set(firsts.values())) == 1 and set(firsts) == set(names)  # each first equally often
    if n > 1:  # every ordered pair of neighbours equally often
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1


def test_a_neighbour_effect_cancels_in_balanced_orders_but_not_in_a_rotation():
    """A stand-in GPU: a call after 'hot' (a power-hungry kernel) runs 15% slower. Two entries that are the same
    kernel must read the same median under the balanced orders; under the old rotation the one behind 'hot' loses."""
    def run(orders, rounds):
        t = {n: [] for n in ("hot", "same1", "same2", "cool")}
        for i in range(rounds):
            prev = None
            for n in orders[i % len(orders)]:
                t[n].append((1.15 if prev == "hot" else 1.0) * (3.0 if n == "hot" else 1.0))
                prev = n
        return t
    names = ["hot", "same1", "same2", "cool"]
    bal = run(balanced_orders(names), whole_cycles(10, 4))
    rot = run([names[k:] + names[:k] for k in range(4)], 12)
    assert statistics.mean(bal["same1"]) == pytest.approx(statistics.mean(bal["same2"]))
    assert statistics.mean(rot["same1"]) > 1.1 * statistics.mean(rot["same2"])


def fake_reads(states):
    """read() returning the given states in turn, then the last one forever."""
    it = itertools.chain(states, itertools.repeat(states[-1]))
    return lambda: dict(next(it))


def state(sm, reasons, power=500.0):
    return dict(sm_clock_mhz=sm, mem_clock_mhz=3201, temp_c=50, power_w=power, clocks_event_reasons=reasons)


def test_sampler_summary_counts_throttled_samples():
    s = GpuSampler(interval_s=0.001, read=fake_reads([state(1980, 0x0), state(1980, 0x1), state(1700, 0x4),
                                                      state(1650, 0x4 | 0x8)]))
    for _ in range(4):
        s.sample()
    out = s.summary()
    assert out["gpu_sampler"] == "nvml" and out["gpu_samples"] == 4
    assert out["throttled_share"] == pytest.approx(0.5)  # idle (0x1) and none (0x0) are not throttling
    assert out["throttle_reasons"] == "sw_power_cap,hw_slowdown"
    assert (out["sm_clock_mhz_min"], out["sm_clock_mhz_max"]) == (1650, 1980)
    assert is_throttled(0x1) is False and is_throttled(0x2) is True and is_throttled(None) is None
    assert reason_names(0x4 | 0x1000) == "sw_power_cap,0x1000"


def test_sampler_thread_samples_during_the_timing_and_flags_rounds():
    throttle = {"on": False}
    s = GpuSampler(interval_s=0.002, read=lambda: state(1700 if throttle["on"] else 1980, 0x4 if throttle["on"] else 0))

    def a():
        time.sleep(0.004)

    def b():
        time.sleep(0.004)
        throttle["on"] = rr_round["n"] >= 6  # the power cap kicks in half way

    rr_round = {"n": 0}

    def count():
        rr_round["n"] += 1

    with s:
        rr = round_robin({"A": a, "B": b, "count": count}, device="cpu", warmup=0, rounds=12, sampler=s)
    assert s._thread is None and len(s.samples) >= 12  # the thread ran during the rounds and was joined
    assert rr.round_throttled[:3] == [False] * 3 and all(rr.round_throttled[-3:])
    r = rr.ratio("B", "A")
    assert r["n_unthrottled"] >= 3 and r["value_unthrottled"] == pytest.approx(1.0, rel=0.5)
    assert 0.0 < rr.gpu["throttled_share"] < 1.0


def test_sampler_unavailable_without_nvml_is_recorded_not_raised():
    s = GpuSampler()
    if s.available:
        pytest.skip("NVML works here")
    with s:
        pass
    out = s.summary()
    assert out["gpu_sampler"].startswith("unavailable: ") and out["throttled_share"] is None and not s.samples


def test_settle_stops_once_the_clock_is_steady():
    clocks = iter([1500, 1600, 1700, 1800, 1900] + [1980] * 10000)
    s = GpuSampler(interval_s=0.002, read=lambda: state(next(clocks), 0))
    with s:
        st = settle({"A": lambda: time.sleep(0.002)}, seconds=5.0, sampler=s, window_s=0.02)
    assert st["settle_steady"] is True and st["settle_sm_clock_mhz"] == 1980 and st["settle_s"] < 4.0
    st = settle({"A": lambda: None}, seconds=0.01)
    assert st["settle_steady"] is None and st["settle_passes"] >= 1
