"""Where a variant's back-to-back calls leave the GPU idle: ``--calls`` forward calls of each variant in a row under
torch.profiler (CUPTI), then per variant the kernels per call, the GPU busy time and span per call, and the gaps
between consecutive kernels (median, p90, their sum per call). scripts/energy_ab.py found official FA4 slower back to
back than in the harness's timed calls (session 72); this says whether its calls leave the GPU gaps.

``python scripts/stream_gaps.py [--hdims 256] [--causal 1] [--seqlens 8192] [--calls 20] [--cudnn] [--out rows.jsonl]``
(shapes as scripts/energy_ab.py: 32k tokens, heads = 2048 / hdim).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from energy_ab import paper_cells  # noqa: E402


def gap_stats(spans: list[tuple[float, float, str]], calls: int) -> dict:
    """Per call figures of (start_us, end_us, name) kernel spans on one stream, sorted by start: kernels, busy, span
    (first start to last end), gaps between a kernel's end and the next one's start (negative overlaps count 0)."""
    spans = sorted(spans)
    gaps = [max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:])]
    busy = sum(e - s for s, e, _ in spans)
    g = sorted(gaps) or [0.0]
    return dict(kernels_per_call=len(spans) / calls, busy_us_per_call=busy / calls,
                span_us_per_call=(spans[-1][1] - spans[0][0]) / calls if spans else 0.0,
                gap_us_median=statistics.median(g), gap_us_p90=g[(9 * len(g)) // 10], gap_us_per_call=sum(gaps) / calls,
                kernel_names=sorted({n[:60] for _, _, n in spans}))


def profile(fn, calls: int) -> list[tuple[float, float, str]]:
    """(start_us, end_us, name) of every CUDA kernel / memset / memcpy that ``calls`` back-to-back calls ran."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with tprof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in p.events():
        if e.device_type.name == "CUDA":
            out.append((e.time_range.start, e.time_range.end, e.name))
    return out


def main():
    import torch

    from experiments.metadata import provenance

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", type=int, nargs="+", default=[256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192])
    ap.add_argument("--causal", type=int, nargs="+", default=[1])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.calls < 2:
        raise SystemExit("--calls >= 2")
    prov = provenance()
    for hdim, _, s, causal, batch, heads, fns in paper_cells(a.hdims, a.seqlens, a.causal, a.tokens, {}, a.cudnn):
        for name, fn in fns.items():
            st = gap_stats(profile(fn, a.calls), a.calls)
            row = dict(backend=name, hdim=hdim, seqlen=s, batch=batch, heads=heads, causal=causal,
                       calls=a.calls, gpu=torch.cuda.get_device_name(), **st, **prov)
            print(f"hd{hdim} s{s} causal={int(causal)} {name:14s} kernels/call {st['kernels_per_call']:.1f} "
                  f"busy {st['busy_us_per_call']:8.1f} us span {st['span_us_per_call']:8.1f} us "
                  f"gaps/call {st['gap_us_per_call']:6.1f} us (median {st['gap_us_median']:.1f}, "
                  f"p90 {st['gap_us_p90']:.1f})  {', '.join(st['kernel_names'])}", flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
