"""How much of a backward main kernel is per-CTA cost (launch, K/V load, pipeline fill, dK/dV epilogue, teardown) and
how much is per Q-tile step, for ours and official FA4: the question a persistent backward would answer.

``python scripts/bwd_cta_overhead.py [--hdim 128] [--seqlen-k 1024] [--steps 1 2 4 8 16] [--ctas 1024] [--calls 20]``

Non-causal shapes whose K/V CTAs all walk the same number of Q tiles: seqlen_q = steps x tile_m (our tile_m for the
head dim), seqlen_k fixed, batch x heads chosen so that the grid has about ``--ctas`` CTAs (seqlen_k / tile_n per head).
The main kernel's device time (torch.profiler, CUDA activity; pre / post kernels left out by name) is fit by least
squares to t = waves x (c + s x steps), waves = CTAs / SMs: ``c`` is the per-CTA cost and ``s`` the per-step time,
both in microseconds of one SM. Official FA4 runs the same shapes (its own tiles, so its ``steps`` axis is ours' rows;
its fit is reported in the same units of rows). Nothing is changed on the GPU; clocks as they are. A session script:
its output is a decision aid, not a committed benchmark.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_SIDE_KERNELS = ("Pre", "Post", "pre", "post", "elementwise", "fill", "memset", "Memset", "reduce")


def main_kernel_us(fn, calls: int) -> float:
    """Mean device time per call of the kernels of ``fn`` that are not pre / post / memset / elementwise ones."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.key_averages() if e.device_time_total > 0 and not any(k in e.key for k in _SIDE_KERNELS)]
    return sum(e.device_time_total for e in evs) / calls


def fit(points):
    """Least squares of t / waves = c + s x steps over (steps, waves, t) points: (c, s)."""
    xs = [p[0] for p in points]
    ys = [p[2] / p[1] for p in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    s = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - s * mx, s


def main():
    import torch

    import kernels
    from kernels.sm90.backward import attention_backward
    from kernels.tiles import bwd_tile

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen-k", type=int, default=1024)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--ctas", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    d, sk = a.hdim, a.seqlen_k
    tm, tn = bwd_tile("sm90", d, False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_head = -(-sk // tn)
    h = 16
    b = max(1, a.ctas // (per_head * h))
    ctas = b * h * per_head
    waves = ctas / sms
    scale = 1.0 / math.sqrt(d)
    try:
        from flash_attn.cute.interface import _flash_attn_bwd
    except ImportError:
        _flash_attn_bwd = None
    rows = {"ours": [], "fa4_official": []}
    print(f"hdim {d}, seqlen_k {sk}, our tiles {tm} x {tn}, batch {b} x heads {h}: {ctas} CTAs, {waves:.2f} waves "
          f"on {sms} SMs", flush=True)
    for steps in a.steps:
        sq = steps * tm
        q, do = (torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out, lse = kernels.attention(q, k, v, causal=False, return_lse=True)
        t_ours = main_kernel_us(lambda: attention_backward(q, k, v, out, do, lse, False, scale, None), a.calls)
        rows["ours"].append((steps, waves, t_ours))
        line = f"steps {steps:3d} (seqlen_q {sq:5d}): ours main {t_ours:8.1f} us"
        if _flash_attn_bwd is not None:
            t_off = main_kernel_us(lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=False),
                                   a.calls)
            rows["fa4_official"].append((steps, waves, t_off))
            line += f", official main {t_off:8.1f} us"
        print(line, flush=True)
    for name, pts in rows.items():
        if len(pts) >= 2:
            c, s = fit(pts)
            print(f"{name}: per-CTA cost {c:6.2f} us, per {tm}-row step {s:6.2f} us (SM time; "
                  f"a 1-step CTA is {c / (c + s):.0%} overhead, an 8-step one {c / (c + 8 * s):.0%})", flush=True)


if __name__ == "__main__":
    main()
