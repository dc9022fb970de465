"""GPU state sampled on a background thread during a timing: SM/memory clocks, power, temperature and NVML
clock-event (throttle) reasons. Read-only: clocks are never locked or changed.

``GpuSampler`` is a context manager; ``summary()`` gives the row fields (``gpu_samples``, clock/power/temp
statistics, ``throttled_share`` = share of samples with any clock-event reason other than idle, the reasons seen),
and ``throttled(t0, t1)`` says whether a time window (e.g. one round) held a throttled sample. Without NVML (a CPU
machine) nothing is sampled and ``summary()`` records ``gpu_sampler: 'unavailable: <why>'``.
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Callable

# NVML clocks-event reason bits (nvml.h, nvmlClocksEventReason*)
REASON_BITS = {0x1: "idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
               0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clock"}
IDLE = 0x1
SUMMARY_KEYS = ("gpu_sampler", "gpu_samples", "sample_interval_s", "sm_clock_mhz_min", "sm_clock_mhz_median",
                "sm_clock_mhz_max", "mem_clock_mhz_median", "power_w_median", "power_w_max", "temp_c_max",
                "throttled_share", "throttle_reasons")


def is_throttled(reasons) -> bool | None:
    """True when the bitmask holds any reason but idle; None when unknown."""
    return None if reasons is None else bool(int(reasons) & ~IDLE)


def reason_names(mask: int) -> str:
    """'sw_power_cap,hw_slowdown' for a bitmask ('' for none; unknown bits as hex)."""
    names = [n for b, n in REASON_BITS.items() if mask & b]
    rest = mask & ~sum(REASON_BITS)
    return ",".join(names + ([hex(rest)] if rest else []))


def _nvml_reader() -> tuple[Callable[[], dict] | None, str | None]:
    from experiments.metadata import gpu_state, nvml_unavailable

    why = nvml_unavailable()
    return (None, why) if why else (gpu_state, None)


class GpuSampler:
    """Sample ``read()`` (default: NVML state of the current CUDA device) every ``interval_s`` on a thread."""

    def __init__(self, interval_s: float = 0.02, read: Callable[[], dict] | None = None):
        self.interval_s = float(interval_s)
        self.read, self.why = (read, None) if read is not None else _nvml_reader()
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.read is not None

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                break

    def sample(self) -> None:
        """Take one sample now (the thread calls this; callers may too, e.g. at a round boundary)."""
        try:
            s = dict(self.read())
        except Exception as e:  # noqa: BLE001 -- a failed read is recorded, never raised into the timing
            s = {"error": f"{type(e).__name__}: {e}"[:120]}
        s["t"] = time.perf_counter()
        self.samples.append(s)

    def start(self) -> "GpuSampler":
        if self.available and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()  # the state at the end, after the last timed call

    def __enter__(self) -> "GpuSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what the rows get ---------------------------------------------------------------------
    def window(self, t0: float, t1: float) -> list[dict]:
        """Samples taken in [t0, t1]; if none, the last one taken before t1 (the state the window ran in)."""
        inside = [s for s in self.samples if t0 <= s["t"] <= t1]
        if inside:
            return inside
        before = [s for s in self.samples if s["t"] <= t1]
        return before[-1:]

    def throttled(self, t0: float, t1: float) -> bool | None:
        """Whether any sample of the window was throttled (None: no sample with a reason)."""
        flags = [is_throttled(s.get("clocks_event_reasons")) for s in self.window(t0, t1)]
        flags = [f for f in flags if f is not None]
        return any(flags) if flags else None

    def summary(self) -> dict:
        out = dict.fromkeys(SUMMARY_KEYS)
        if not self.available:
            out["gpu_sampler"] = f"unavailable: {self.why}"
            return out
        out.update(gpu_sampler="nvml", gpu_samples=len(self.samples), sample_interval_s=self.interval_s)

        def vals(k):
            return [float(s[k]) for s in self.samples if s.get(k) is not None]

        sm, mem, pw, tc = vals("sm_clock_mhz"), vals("mem_clock_mhz"), vals("power_w"), vals("temp_c")
        if sm:
            out.update(sm_clock_mhz_min=min(sm), sm_clock_mhz_median=statistics.median(sm), sm_clock_mhz_max=max(sm))
        if mem:
            out["mem_clock_mhz_median"] = statistics.median(mem)
        if pw:
            out.update(power_w_median=statistics.median(pw), power_w_max=max(pw))
        if tc:
            out["temp_c_max"] = max(tc)
        reasons = [int(s["clocks_event_reasons"]) for s in self.samples if s.get("clocks_event_reasons") is not None]
        if reasons:
            out["throttled_share"] = sum(is_throttled(r) for r in reasons) / len(reasons)
            union = 0
            for r in reasons:
                union |= r
            out["throttle_reasons"] = reason_names(union & ~IDLE)
        return out
