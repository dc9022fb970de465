"""Timing and FLOP accounting (DESIGN.md convention 6).

``time_fn`` times the first call (compile) separately, warms up, then times many repeats with CUDA events,
flushing the L2 cache between repeats by writing a buffer twice the device's L2 size; it reports the
median and spread (p20/p80, IQR, min, max). ``compare_ab`` interleaves two functions (A B B A ...) and
reports the per-pair ratio time_A / time_B with its spread. Without CUDA the same code times with
time.perf_counter so the harness runs on a CPU machine (each result says which timer it used).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from kernels.flops import BWD_FLOP_FACTOR, attention_flops, tflops, visible_pairs  # noqa: F401 -- the one count
from kernels.flops import attended_pairs, pair_flops  # noqa: F401 -- re-exported

from .shapes import Shape


def attn_flops(shape: Shape, mode: str = "fwd") -> float:
    """kernels.flops.pair_flops of a Shape's attended pairs (``Shape.attended_pairs``: kernels.flops.attended_pairs,
    causal / window / per packed sequence): forward 2*h*pairs*(d + d_v), backward 2.5x. K/V heads (GQA) do not change
    the count."""
    return pair_flops(shape.attended_pairs(), shape.heads, shape.hdim, shape.hdim_v, mode)


# ---- L2 flush -----------------------------------------------------------------------------------
class L2Flusher:
    """Writes a buffer of 2x the L2 size between repeats so no input stays cached (CUDA only)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.buf = None
        self.l2_bytes = None
        if self.device.type == "cuda":
            self.l2_bytes = int(torch.cuda.get_device_properties(self.device).L2_cache_size)
            self.buf = torch.empty(max(2 * self.l2_bytes, 1 << 20) // 4, dtype=torch.int32, device=self.device)

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.fill_(0x5A5A5A5A)


# ---- timing -------------------------------------------------------------------------------------
@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    n: int
    first_call_s: float
    timer: str  # cuda_events | perf_counter
    flush_l2: bool
    times_ms: list
    second_call_s: float = float("nan")  # wall seconds of the call after the first: cached compile + launch + run

    def to_dict(self, with_samples: bool = False) -> dict:
        d = asdict(self)
        if not with_samples:
            d.pop("times_ms")
        return d


def quantile(xs, q: float) -> float:
    """Linear-interpolated quantile of a non-empty sequence."""
    s = sorted(xs)
    if len(s) == 1:
        return float(s[0])
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def summarize(times_ms, first_call_s: float, timer: str, flush_l2: bool, second_call_s: float = float("nan")) -> Timing:
    if not times_ms:
        raise ValueError("repeats: need at least one timed repeat")
    return Timing(median_ms=float(statistics.median(times_ms)), p20_ms=quantile(times_ms, 0.2),
                  p80_ms=quantile(times_ms, 0.8), iqr_ms=quantile(times_ms, 0.75) - quantile(times_ms, 0.25),
                  min_ms=float(min(times_ms)), max_ms=float(max(times_ms)), n=len(times_ms),
                  first_call_s=first_call_s, timer=timer, flush_l2=flush_l2, times_ms=list(times_ms),
                  second_call_s=second_call_s)


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()


def _sync(device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


HOLD_CYCLES_PER_US = 2000  # GPU spin cycles per microsecond of ``hold_us`` (about the H200's 1.98 GHz SM clock)


class CallTimer:
    """Times one call: CUDA events on a GPU (the flush happens before the start event), else perf_counter.
    ``run(fn)`` returns the milliseconds on the CPU path (None on CUDA: ``collect()`` syncs and returns them).

    ``hold_us`` > 0 (CUDA): a GPU spin of about that many microseconds is queued after the flush and before the start
    event, so the host has queued the call's kernels before the GPU reaches them: the events then time the device
    work alone. With 0 (the default) a call whose host-side launch path outlasts the flush also counts the host's
    time (on the H200 an identical-kernel pair of 0.26 ms forward calls read 0.94x this way)."""

    def __init__(self, device, flush_l2: bool, hold_us: float = 0.0):
        if hold_us < 0:
            raise ValueError(f"hold_us={hold_us}: must be >= 0")
        self.cuda = _is_cuda(device)
        self.device = device
        self.flush = L2Flusher(device) if (flush_l2 and self.cuda) else None
        self.hold_us = float(hold_us) if self.cuda else 0.0
        self.name = "cuda_events" if self.cuda else "perf_counter"
        self.pending = []

    def run(self, fn: Callable) -> float | None:
        if self.flush is not None:
            self.flush()
        if self.hold_us > 0:
            torch.cuda._sleep(int(self.hold_us * HOLD_CYCLES_PER_US))
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            self.pending.append((start, end))
            return None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def collect(self) -> list[float]:
        _sync(self.device)
        out = [s.elapsed_time(e) for s, e in self.pending]
        self.pending = []
        return out


class StreamTimer:
    """CallTimer's interface for calls back to back, the regime of a training step: ``run(fn)`` times ``calls`` calls
    of ``fn`` in a row between two CUDA events (after the ``hold_us`` spin; no flush between them, so ``flush`` is
    None) and gives the time per call. The harness's own timer starts each call on a GPU that has just idled; where
    the power cap binds, ratios move between the two (README, "Each timed call thus starts ...")."""

    def __init__(self, device, calls: int, hold_us: float = 0.0):
        if not (isinstance(calls, int) and calls >= 1):
            raise ValueError(f"calls={calls}: must be an int >= 1")
        self.inner = CallTimer(device, flush_l2=False, hold_us=hold_us)
        self.calls, self.cuda, self.flush = calls, self.inner.cuda, None
        self.name = self.inner.name + "_stream"

    def run(self, fn: Callable) -> float | None:
        def many():
            for _ in range(self.calls):
                fn()
        r = self.inner.run(many)
        return None if r is None else r / self.calls

    def collect(self) -> list[float]:
        return [t / self.calls for t in self.inner.collect()]


def time_first_call(fn: Callable, device=None) -> float:
    """Wall seconds of one call, synchronised (includes any compilation)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def time_fn(fn: Callable, device=None, warmup: int = 5, repeats: int = 30, flush_l2: bool = True,
            max_time_s: float | None = None, first_call: bool = True, hold_us: float = 0.0) -> Timing:
    """Time ``fn()``: first call (seconds, compile included), the second call (seconds: the cached path), ``warmup``
    untimed calls, then up to ``repeats`` timed calls (fewer if ``max_time_s`` of timed work is exceeded; at least 3)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats}, warmup={warmup}: need repeats >= 1 and warmup >= 0")
    first = time_first_call(fn, device) if first_call else float("nan")
    second = time_first_call(fn, device) if first_call else float("nan")
    for _ in range(warmup):
        fn()
    timer = CallTimer(device, flush_l2, hold_us)
    times: list[float] = []
    t_start = time.perf_counter()
    for i in range(repeats):
        r = timer.run(fn)
        if r is not None:
            times.append(r)
        if max_time_s is not None and i >= 2 and time.perf_counter() - t_start > max_time_s:
            break
    times += timer.collect()
    return summarize(times, first, timer.name, timer.flush is not None, second_call_s=second)


@dataclass
class ABResult:
    a: Timing
    b: Timing
    ratio: float  # median over pairs of time_A / time_B (> 1: B is faster)
    ratio_p20: float
    ratio_p80: float
    ratio_min: float
    ratio_max: float
    n_pairs: int

    def to_dict(self) -> dict:
        return dict(a=self.a.to_dict(), b=self.b.to_dict(), ratio=self.ratio, ratio_p20=self.ratio_p20,
                    ratio_p80=self.ratio_p80, ratio_min=self.ratio_min, ratio_max=self.ratio_max,
                    n_pairs=self.n_pairs)


def compare_ab(fn_a: Callable, fn_b: Callable, device=None, warmup: int = 5, repeats: int = 30,
               flush_l2: bool = True, max_time_s: float | None = None, hold_us: float = 0.0) -> ABResult:
    """Interleave A and B (order A B, B A, A B, ... so neither always runs second) and report the ratio; up to
    ``repeats`` pairs (fewer if ``max_time_s`` of timed work is exceeded; at least 3)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats}, warmup={warmup}: need repeats >= 1 and warmup >= 0")
    first_a = time_first_call(fn_a, device)
    first_b = time_first_call(fn_b, device)
    for _ in range(warmup):
        fn_a()
        fn_b()
    timer = CallTimer(device, flush_l2, hold_us)
    order = []
    ta, tb = [], []
    t_start = time.perf_counter()
    for i in range(repeats):
        for which in (("a", "b") if i % 2 == 0 else ("b", "a")):
            r = timer.run(fn_a if which == "a" else fn_b)
            order.append(which)
            if r is not None:
                (ta if which == "a" else tb).append(r)
        if max_time_s is not None and i >= 2 and time.perf_counter() - t_start > max_time_s:
            break
    if timer.cuda:
        for which, t in zip(order, timer.collect()):
            (ta if which == "a" else tb).append(t)
    ratios = [x / y for x, y in zip(ta, tb) if y > 0]
    sa = summarize(ta, first_a, timer.name, timer.flush is not None)
    sb = summarize(tb, first_b, timer.name, timer.flush is not None)
    return ABResult(a=sa, b=sb, ratio=float(statistics.median(ratios)), ratio_p20=quantile(ratios, 0.2),
                    ratio_p80=quantile(ratios, 0.8), ratio_min=min(ratios), ratio_max=max(ratios),
                    n_pairs=len(ratios))
