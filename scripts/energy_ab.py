"""Energy per forward call, ours against official FA4 (and cuDNN with --cudnn), round-robin in one process: where a
run sits at the power cap, the clock follows each kernel's power draw, so speed there is set by energy per call.

``python scripts/energy_ab.py [--hdims 256] [--causal 1] [--seqlens 16384 32768] [--rounds 8] [--window-ms 1500]
[--cfg NAME=field:value,...] [--cudnn] [--out rows.jsonl]``

Shapes as scripts/fwd_ab.py (32k total tokens by default here, the paper grid: batch = 32768 / seqlen, heads = 2048 /
hdim, bf16). Per round every variant (order rotated each round) runs back to back for about ``--window-ms``, no L2
flush between calls: the NVML energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ) and the wall time around the
window give J per call, ms per call and mean watts (where the counter does not move, the power NVML reports at the
window's end, its mean over about the last second, times the window: keep --window-ms >= 1000 then); the SM clock and the clock-event reasons are read at the window's
end. Printed per variant: medians, and per round its speed over ours (t_ours / t_variant: below 1, ours is faster)
and its energy per call over ours' (above 1, ours uses less). Clocks are never changed. A session script for kernel work (results/h200/session_ab/).
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


def measure_window(fn, calls: int, nv, h) -> dict:
    """Run ``fn`` ``calls`` times back to back; energy (J), wall (s), SM clock and clock-event reasons at the end."""
    import torch

    torch.cuda.synchronize()
    e0, t0 = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    t1, e1 = time.perf_counter(), nv.nvmlDeviceGetTotalEnergyConsumption(h)
    watts_end = nv.nvmlDeviceGetPowerUsage(h) / 1e3  # the driver's average over about the last second
    # some hosts (the lent H100, session 72) never advance the energy counter: then the last second's mean power
    # times the window, which --window-ms >= 1000 keeps inside one variant's window
    j, src = ((e1 - e0) / 1e3, "energy_counter") if e1 > e0 else (watts_end * (t1 - t0), "power_at_end")
    return dict(j=j, s=t1 - t0, calls=calls, source=src,
                sm_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                reasons=int(nv.nvmlDeviceGetCurrentClocksEventReasons(h)))


def energy_rounds(fns: dict, rounds: int, window_ms: float, nv, h) -> dict[str, list[dict]]:
    """Per variant, one measure_window per round; the order rotates each round; ``calls`` per window from one
    timed warm window."""
    calls = {}
    for name, fn in fns.items():
        w = measure_window(fn, 3, nv, h)
        calls[name] = max(3, round(window_ms / 1e3 / (w["s"] / 3)))
    names = list(fns)
    res = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            res[n].append(measure_window(fns[n], calls[n], nv, h))
    return res


def _stats(xs: list[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    return statistics.median(s), s[len(s) // 5], s[(4 * len(s)) // 5]


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
    a = ap.parse_args()
    if a.rounds < 1 or a.window_ms <= 0:
        raise SystemExit("--rounds >= 1 and --window-ms > 0")
    nv, h = _nvml_handle()
    extra = dict(_parse_cfg(s) for s in a.cfg)
    for s in a.seqlens:
        for hdim in a.hdims:
            for causal in map(bool, a.causal):
                dv = 128 if hdim == 192 else hdim
                heads, batch = 2048 // hdim, max(1, a.tokens // s)
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k = (torch.randn(batch, s, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                        for _ in range(2))
                v = torch.randn(batch, s, heads, dv, device="cuda", dtype=torch.bfloat16, generator=g)
                fns, _ = _variants(q, k, v, causal, 1.0 / math.sqrt(hdim), None, extra, a.cudnn)
                res = energy_rounds(fns, a.rounds, a.window_ms, nv, h)
                flops = attention_flops(batch, heads, s, s, hdim, dv, causal)
                ours = res["ours"]
                for name, ws in res.items():
                    ms = [w["s"] / w["calls"] * 1e3 for w in ws]
                    jc = [w["j"] / w["calls"] for w in ws]
                    speed = _stats([o["s"] / o["calls"] / (w["s"] / w["calls"]) for o, w in zip(ours, ws)])
                    energy = _stats([(w["j"] / w["calls"]) / (o["j"] / o["calls"]) for o, w in zip(ours, ws)])
                    row = dict(backend=name, hdim=hdim, hdim_v=dv, seqlen=s, batch=batch, heads=heads, causal=causal,
                               rounds=a.rounds, window_ms=a.window_ms, ms_median=statistics.median(ms),
                               tflops=flops / statistics.median(ms) / 1e9, j_per_call=statistics.median(jc),
                               tflop_per_j=flops / 1e12 / statistics.median(jc),
                               watts=statistics.median([w["j"] / w["s"] for w in ws]),
                               sm_mhz=statistics.median([w["sm_mhz"] for w in ws]),
                               energy_source=",".join(sorted({w["source"] for w in ws})),
                               capped_share=sum(w["reasons"] & 0x4 != 0 for w in ws) / len(ws),
                               speed_vs_ours=speed[0], speed_p20=speed[1], speed_p80=speed[2],
                               energy_vs_ours=energy[0], energy_p20=energy[1], energy_p80=energy[2],
                               gpu=torch.cuda.get_device_name(), **prov)
                    print(f"hd{hdim} s{s} causal={int(causal)} {name:14s} {row['ms_median']:7.3f} ms "
                          f"{row['tflops']:6.1f} TFLOP/s {row['j_per_call']:7.3f} J/call {row['tflop_per_j']:5.2f} "
                          f"TFLOP/J {row['watts']:5.0f} W sm {row['sm_mhz']:.0f} MHz capped {row['capped_share']:.0%}"
                          f" ({row['energy_source']})"
                          f"  speed/ours {speed[0]:.3f} [{speed[1]:.3f}, {speed[2]:.3f}]"
                          f"  energy/ours {energy[0]:.3f} [{energy[1]:.3f}, {energy[2]:.3f}]", flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
