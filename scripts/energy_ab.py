"""Forward calls back to back, ours against official FA4 (and cuDNN with --cudnn), round-robin in one process: the
regime of a training step, beside the harness's timer (one call after a flush, a spin and a synchronize), and the
energy per call (where a run sits at the power cap, the clock follows each kernel's power draw).

``python scripts/energy_ab.py [--hdims 256] [--causal 1] [--seqlens 16384 32768] [--rounds 8] [--window-ms 1500]
[--cfg NAME=field:value,...] [--cudnn] [--flush] [--out rows.jsonl]``

Shapes as scripts/fwd_ab.py (32k total tokens by default here, the paper grid: batch = 32768 / seqlen, heads = 2048 /
hdim, bf16). Per round every variant runs back to back for about ``--window-ms``, no L2 flush between calls; the
rounds follow the harness's balanced orders (session 72's rows, `energy_ab_h100_s72.*`, were taken with a plain
rotation, A B C / B C A / ..., which lets a variant always follow the same neighbour). A GpuSampler thread reads the
board's instant power (NVML field POWER_INSTANT) and SM clock every 5 ms; their means over a window times its wall
time give J per call, ms per call, watts and MHz (the NVML energy counter's step is kept beside it: on the lent H100
it moves in coarse steps, and the instant power was too coarse there to compare J per call, session 72). ``host`` is
the share of a window the host took to enqueue its calls (near 100%: the variant is host-bound back to back). Printed
per variant: medians, and per round its speed over ours (t_ours / t_variant: below 1, ours is faster) and its energy
per call over ours' (above 1, ours uses less). ``--flush`` zeroes 256 MiB before every call as the harness's timer
does (the flush's own time, timed as a variant of its own, is taken off). Clocks are never changed. A session script
for kernel work (results/h200/session_ab/energy_ab_h100_s72.*; README, "Each timed call thus starts ...").
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fwd_ab import _parse_cfg, _variants  # noqa: E402
from kernels.flops import attention_flops  # noqa: E402


def _nvml_handle():
    import pynvml
    import torch

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def instant_watts(nv, h) -> tuple[float, str]:
    """Board power now: the NVML field POWER_INSTANT, or the driver's 1 s average where the field is missing."""
    try:
        f = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
        if f.nvmlReturn == 0:
            return f.value.uiVal / 1e3, "instant"
    except nv.NVMLError:
        pass
    return nv.nvmlDeviceGetPowerUsage(h) / 1e3, "average_1s"


def power_sampler(nv, h, interval_s: float = 0.005):
    """experiments.timing.sampler.GpuSampler reading instant_watts and the SM clock every ``interval_s``."""
    from experiments.timing.sampler import GpuSampler

    def read() -> dict:
        w, src = instant_watts(nv, h)
        return dict(power_w=w, power_source=src, sm_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
    return GpuSampler(interval_s=interval_s, read=read)


def window_power(sampler, t0: float, t1: float) -> dict:
    """Mean watts and median SM clock of the sampler's samples in [t0, t1] (GpuSampler.window), their sources."""
    got = [x for x in sampler.window(t0, t1) if "power_w" in x] if sampler else []
    if not got:
        return dict(watts=float("nan"), sm_mhz=float("nan"), samples=0, source="none")
    return dict(watts=statistics.mean(x["power_w"] for x in got),
                sm_mhz=statistics.median(x["sm_clock_mhz"] for x in got), samples=len(got),
                source=",".join(sorted({x["power_source"] for x in got})))


def measure_window(fn, calls: int, nv, h, sampler=None) -> dict:
    """Run ``fn`` ``calls`` times back to back: wall (s), host time to enqueue them (s), energy (J: the sampler's mean
    power times the wall time; the NVML energy counter's step beside it), SM clock, clock-event reasons at the end."""
    import torch

    torch.cuda.synchronize()
    e0, t0 = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
    for _ in range(calls):
        fn()
    th = time.perf_counter()
    torch.cuda.synchronize()
    t1, e1 = time.perf_counter(), nv.nvmlDeviceGetTotalEnergyConsumption(h)
    p = window_power(sampler, t0, t1)
    return dict(j=p["watts"] * (t1 - t0), j_counter=(e1 - e0) / 1e3, s=t1 - t0, host_s=th - t0, calls=calls,
                sm_mhz=p["sm_mhz"], samples=p["samples"], source=p["source"],
                reasons=int(nv.nvmlDeviceGetCurrentClocksEventReasons(h)))


def with_flush(fns: dict) -> dict:
    """``--flush``: every variant zeroes a 256 MiB buffer (the L2 flush of scripts/bwd_ab.round_robin) before each
    call, plus ``flush_only``, the flush alone, whose time per call main subtracts round by round."""
    import torch

    buf = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    out = {n: (lambda f=f: (buf.zero_(), f())) for n, f in fns.items()}
    out["flush_only"] = buf.zero_
    return out


def subtract_flush(res: dict) -> None:
    """In place: drop ``flush_only`` from ``res`` and take its time per call, from the same round, off every other
    window's time (``s``; the untouched time stays as ``s_raw``, which the watts use: energy keeps the flush's
    share)."""
    fl = res.pop("flush_only", None)
    for ws in res.values() if fl else ():
        for w, f in zip(ws, fl):
            w["s_raw"] = w["s"]
            w["s"] -= f["s"] / f["calls"] * w["calls"]


def energy_rounds(fns: dict, rounds: int, window_ms: float, nv, h) -> dict[str, list[dict]]:
    """Per variant, one measure_window per round, the rounds in the harness's balanced orders
    (experiments.timing.roundrobin: every variant follows every other equally often; rounds rounded up to whole
    cycles); ``calls`` per window from one timed warm window."""
    from experiments.timing.roundrobin import balanced_orders, whole_cycles

    calls = {}
    for name, fn in fns.items():
        w = measure_window(fn, 3, nv, h)
        calls[name] = max(3, round(window_ms / 1e3 / (w["s"] / 3)))
    names = list(fns)
    orders = balanced_orders(names)
    res = {n: [] for n in names}
    with power_sampler(nv, h) as sampler:
        for r in range(whole_cycles(rounds, len(names))):
            for n in orders[r % len(orders)]:
                res[n].append(measure_window(fns[n], calls[n], nv, h, sampler))
    return res


def _stats(xs: list[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    return statistics.median(s), s[len(s) // 5], s[(4 * len(s)) // 5]


def paper_cells(hdims, seqlens, causals, tokens: int, extra: dict, cudnn: bool):
    """(hdim, dv, seqlen, causal, batch, heads, fns) per cell: bf16 inputs at ``tokens`` total tokens and hidden 2048
    (batch = tokens // seqlen, heads = 2048 // hdim), and fwd_ab's variants over them."""
    import torch

    for s in seqlens:
        for hdim in hdims:
            for causal in map(bool, causals):
                dv = 128 if hdim == 192 else hdim
                heads, batch = 2048 // hdim, max(1, tokens // s)
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k = (torch.randn(batch, s, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                        for _ in range(2))
                v = torch.randn(batch, s, heads, dv, device="cuda", dtype=torch.bfloat16, generator=g)
                fns, _ = _variants(q, k, v, causal, 1.0 / math.sqrt(hdim), None, extra, cudnn)
                yield hdim, dv, s, causal, batch, heads, fns


def main():
    import torch

    from experiments.metadata import provenance

    prov = provenance()
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--hdims", type=int, nargs="+", default=[256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--causal", type=int, nargs="+", default=[1])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--window-ms", type=float, default=1500.0)
    ap.add_argument("--tokens", type=int, default=32768, help="batch = tokens // seqlen")
    ap.add_argument("--cfg", nargs="*", default=[], help="NAME=field:value,... extra variants of this tree")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--flush", action="store_true", help="the L2 flushed before every call (its own time subtracted)")
    a = ap.parse_args()
    if a.rounds < 1 or a.window_ms <= 0:
        raise SystemExit("--rounds >= 1 and --window-ms > 0")
    nv, h = _nvml_handle()
    extra = dict(_parse_cfg(s) for s in a.cfg)
    for hdim, dv, s, causal, batch, heads, fns in paper_cells(a.hdims, a.seqlens, a.causal, a.tokens, extra, a.cudnn):
        res = energy_rounds(with_flush(fns) if a.flush else fns, a.rounds, a.window_ms, nv, h)
        subtract_flush(res)
        flops = attention_flops(batch, heads, s, s, hdim, dv, causal)
        ours = res["ours"]
        for name, ws in res.items():
            ms = [w["s"] / w["calls"] * 1e3 for w in ws]
            jc = [w["j"] / w["calls"] for w in ws]
            speed = _stats([o["s"] / o["calls"] / (w["s"] / w["calls"]) for o, w in zip(ours, ws)])
            energy = _stats([(w["j"] / w["calls"]) / (o["j"] / o["calls"]) for o, w in zip(ours, ws)])
            row = dict(backend=name, hdim=hdim, hdim_v=dv, seqlen=s, batch=batch, heads=heads, causal=causal,
                       rounds=a.rounds, window_ms=a.window_ms, flush=a.flush, ms_median=statistics.median(ms),
                       tflops=flops / statistics.median(ms) / 1e9, j_per_call=statistics.median(jc),
                       tflop_per_j=flops / 1e12 / statistics.median(jc),
                       watts=statistics.median([w["j"] / w.get("s_raw", w["s"]) for w in ws]),
                       sm_mhz=statistics.median([w["sm_mhz"] for w in ws]),
                       energy_source=",".join(sorted({w["source"] for w in ws})),
                       j_counter_per_call=statistics.median([w["j_counter"] / w["calls"] for w in ws]),
                       host_share=statistics.median([w["host_s"] / w["s"] for w in ws]),
                       capped_share=sum(w["reasons"] & 0x4 != 0 for w in ws) / len(ws),
                       speed_vs_ours=speed[0], speed_p20=speed[1], speed_p80=speed[2],
                       energy_vs_ours=energy[0], energy_p20=energy[1], energy_p80=energy[2],
                       gpu=torch.cuda.get_device_name(), **prov)
            print(f"hd{hdim} s{s} causal={int(causal)} {name:14s} {row['ms_median']:7.3f} ms "
                  f"{row['tflops']:6.1f} TFLOP/s {row['j_per_call']:7.3f} J/call {row['tflop_per_j']:5.2f} "
                  f"TFLOP/J {row['watts']:5.0f} W sm {row['sm_mhz']:.0f} MHz capped {row['capped_share']:.0%}"
                  f" ({row['energy_source']}) host {row['host_share']:.0%}"
                  f"  speed/ours {speed[0]:.3f} [{speed[1]:.3f}, {speed[2]:.3f}]"
                  f"  energy/ours {energy[0]:.3f} [{energy[1]:.3f}, {energy[2]:.3f}]", flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
