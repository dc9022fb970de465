"""Shared pieces of the calibration microbenchmarks: GPU facts, the SM clock during a run, timing, rows.

Per-clock rates are computed with the SM clock that NVML reports *while the benchmark's kernels run*
(sampled from the host between asynchronous launches), because the H200 clocks down under tensor-core
load and the rate per clock is what the roofline needs. Nothing here sets or locks clocks.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path


def cuda_ok() -> tuple[bool, str]:
    try:
        import torch
    except Exception as e:  # pragma: no cover - torch is a dependency
        return False, f"torch import failed: {e}"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, ""


def gpu_facts() -> dict:
    """Name, SM count and compute capability of the current CUDA device, plus static run metadata."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    facts = dict(gpu_name=p.name, sms=p.multi_processor_count, compute_capability=f"{p.major}.{p.minor}")
    try:
        from experiments.metadata import static_metadata

        md = static_metadata()
        facts.update({k: md.get(k) for k in ("driver", "cuda", "torch", "cutlass_dsl", "git_sha", "max_sm_clock_mhz")})
    except Exception:
        pass
    try:
        import triton

        facts["triton"] = triton.__version__
    except Exception:
        facts["triton"] = None
    return facts


def sm_clock_mhz() -> float | None:
    """Current SM clock of the torch device from NVML, or None."""
    try:
        from experiments.metadata import gpu_state

        return gpu_state().get("sm_clock_mhz")
    except Exception:
        pass
    try:  # fallback without experiments.metadata
        import pynvml
        import torch

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return None


def bench(fn, *, min_time_s: float = 0.15, max_reps: int = 200, warmup: int = 2) -> tuple[float, float | None, int]:
    """Median milliseconds per call of ``fn`` (CUDA events around each call), the SM clock (MHz) sampled
    while the calls run, and the number of timed calls. ``fn`` launches GPU work asynchronously."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # size the run: one timed call to estimate its length
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    one_ms = max(s.elapsed_time(e), 1e-3)
    reps = int(max(5, min(max_reps, min_time_s * 1e3 / one_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    # the GPU is still busy with the queued calls: sample its clock now (several times, keep the median)
    clocks = []
    t_end = time.perf_counter() + min(0.5 * reps * one_ms * 1e-3, 0.1)
    while time.perf_counter() < t_end and len(clocks) < 10:
        c = sm_clock_mhz()
        if c:
            clocks.append(float(c))
        time.sleep(0.005)
    if not clocks:
        c = sm_clock_mhz()
        clocks = [float(c)] if c else []
    torch.cuda.synchronize()
    times = [a.elapsed_time(b) for a, b in zip(starts, ends)]
    return statistics.median(times), (statistics.median(clocks) if clocks else None), reps


def per_clk_per_sm(rate_per_s: float, sms: int, clock_mhz: float | None) -> float | None:
    if not clock_mhz or not sms:
        return None
    return rate_per_s / (sms * clock_mhz * 1e6)


class RowWriter:
    """Append JSON rows to ``path``, one per line, flushed as they come (a crash loses nothing)."""

    def __init__(self, path, common: dict):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.common = dict(common)
        self.rows: list[dict] = []

    def add(self, **row) -> dict:
        r = {**self.common, **row}
        r.setdefault("status", "ok")
        r.setdefault("reason", None)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(r, default=str) + "\n")
            f.flush()
        self.rows.append(r)
        return r
