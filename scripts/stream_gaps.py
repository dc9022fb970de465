"""Where a variant's back-to-back calls leave the GPU idle: ``--calls`` forward calls of each variant in a row under
torch.profiler (CUPTI), then per variant the kernels per call, the GPU busy time and span per call, and the gaps
between consecutive kernels (median, p90, their sum per call). scripts/energy_ab.py found official FA4 slower back to
back than in the harness's timed calls (session 72); this says whether its calls leave the GPU gaps.

``--harness``: the harness's regime instead (experiments.bench.CallTimer: L2 flush, ``--hold-us`` spin, CUDA events
around one call), the variants in its balanced round-robin orders, ``--calls`` rounds under the profiler; per variant
the event time, the call's kernel time (its kernels between the spin and the next flush) and the idle time from the
spin's end to the call's first kernel, as medians. It says whether a call's time in the committed rows is its
kernels' or the GPU waiting. Rows and lines carry the GPU's clocks and throttled share over the profiled calls
(bwd_ab.sampled; since session 74, after its first GPU run).

``python scripts/stream_gaps.py [--hdims 256] [--causal 1] [--seqlens 8192] [--calls 20] [--cudnn] [--harness
[--hold-us 500]] [--out rows.jsonl]`` (shapes as scripts/energy_ab.py: 32k tokens, heads = 2048 / hdim).
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

from bwd_ab import gpu_note, sampled  # noqa: E402  (the rows carry the GPU's clocks and throttled share)
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


def harness_segments(spans: list[tuple[float, float, str]], spin: str, flush: str) -> list[dict]:
    """Per timed call of a harness-regime profile, in order: its kernel time (the spans after a ``spin`` kernel and
    before the next ``flush`` kernel or the end) and the idle time from the spin's end to its first kernel."""
    out, cur, spin_end = [], None, None
    for s, e, n in sorted(spans) + [(float("inf"), float("inf"), flush)]:
        if spin in n or flush in n:
            if cur:
                out.append(dict(kernel_us=sum(b - a for a, b in cur), lead_us=max(0.0, cur[0][0] - spin_end),
                                kernels=len(cur)))
            cur, spin_end = ([], e) if spin in n else (None, None)
        elif cur is not None:
            cur.append((s, e))
    return out


def harness_profile(fns: dict, rounds: int, hold_us: float) -> dict[str, dict]:
    """The harness's timer (flush, spin, events around one call), variants in its balanced orders, under the
    profiler: per variant the medians of the event time, the call's kernel time and the spin-to-first-kernel idle."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    from experiments.bench import CallTimer
    from experiments.timing.roundrobin import balanced_orders, whole_cycles

    def names(fn):  # the kernel names one lone call of fn runs
        with tprof(activities=[ProfilerActivity.CUDA]) as p:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in p.events() if e.device_type.name == "CUDA"]

    timer = CallTimer("cuda", flush_l2=True, hold_us=hold_us)
    flush = names(timer.flush)[0]
    spin = names(lambda: torch.cuda._sleep(1000))[0]
    order = balanced_orders(list(fns))
    for fn in fns.values():
        for _ in range(3):
            fn()
    res = {n: dict(event_ms=[], segs=[]) for n in fns}
    for r in range(whole_cycles(rounds, len(fns))):
        seq = order[r % len(order)]
        with tprof(activities=[ProfilerActivity.CUDA]) as p:
            for n in seq:
                timer.run(fns[n])
            ev = timer.collect()
        segs = harness_segments([(e.time_range.start, e.time_range.end, e.name) for e in p.events()
                                 if e.device_type.name == "CUDA"], spin, flush)
        if len(segs) != len(seq):
            raise RuntimeError(f"round {r}: {len(segs)} call segments for {len(seq)} calls")
        for n, t, g in zip(seq, ev, segs):
            res[n]["event_ms"].append(t)
            res[n]["segs"].append(g)
    med = statistics.median
    return {n: dict(rounds=len(v["event_ms"]), event_us=med(v["event_ms"]) * 1e3,
                    kernel_us=med(g["kernel_us"] for g in v["segs"]), lead_us=med(g["lead_us"] for g in v["segs"]),
                    kernels_per_call=med(g["kernels"] for g in v["segs"])) for n, v in res.items()}


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
    ap.add_argument("--harness", action="store_true", help="the harness's per-call regime (flush, spin, events)")
    ap.add_argument("--hold-us", type=float, default=500.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.calls < 2:
        raise SystemExit("--calls >= 2")
    prov = provenance()
    for hdim, _, s, causal, batch, heads, fns in paper_cells(a.hdims, a.seqlens, a.causal, a.tokens, {}, a.cudnn):
        cell = dict(hdim=hdim, seqlen=s, batch=batch, heads=heads, causal=causal, gpu=torch.cuda.get_device_name())
        head = f"hd{hdim} s{s} causal={int(causal)}"

        def emit(name, st, extra, line, gpu):
            print(f"{head} {name:14s} {line}{gpu_note(gpu) or '  GPU not sampled'}", flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(dict(backend=name, **cell, **extra, **st, **gpu, **prov)) + "\n")

        if a.harness:
            stats, gpu = sampled(lambda: harness_profile(fns, a.calls, a.hold_us))  # one sample set for the rounds
            for name, st in stats.items():
                emit(name, st, dict(regime="harness", hold_us=a.hold_us),
                     f"rounds {st['rounds']} event {st['event_us']:8.1f} us kernels {st['kernel_us']:8.1f} us "
                     f"({st['kernels_per_call']:.0f}/call) spin-to-first-kernel {st['lead_us']:6.1f} us", gpu)
            continue
        for name, fn in fns.items():
            spans, gpu = sampled(lambda: profile(fn, a.calls))  # runs at once, on this fn
            st = gap_stats(spans, a.calls)
            emit(name, st, dict(calls=a.calls),
                 f"kernels/call {st['kernels_per_call']:.1f} busy {st['busy_us_per_call']:8.1f} us span "
                 f"{st['span_us_per_call']:8.1f} us gaps/call {st['gap_us_per_call']:6.1f} us (median "
                 f"{st['gap_us_median']:.1f}, p90 {st['gap_us_p90']:.1f})  {', '.join(st['kernel_names'])}", gpu)


if __name__ == "__main__":
    main()
