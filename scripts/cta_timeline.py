"""When each CTA of the persistent forward starts and ends: %globaltimer per CTA (FlashFwdSm90 ``trace_ctas``), for
configs timed round-robin at one shape, to see how much of a call is the last CTAs' tail.

``python scripts/cta_timeline.py [--hdim 128] [--seqlen 4096] [--batch 8] [--causal] [--reps 10]
[--cfg pers=persistent:true split=persistent:true,split_tail:true] [--force-split] [--out rows.jsonl] [--plot f.png]``

Session 54 profiled the split tail at hd128 4k (scripts/split_profile.py): the main kernel took 1399 us with the last
partial round cut over every SM against 1404 us without, about 5 us saved of the roughly 44 us one round of tiles
takes there. One guess is that the CTAs already end far apart, so the last round is not what sets the kernel's end;
this measures it. Per call: the span (first start to last end), the spread of the CTAs' ends (last minus first, and
the 10th-90th percentile), the spread of their starts, and the idle share at the end (the SM time between each CTA's
end and the last end, over grid x span). Each row is the median over the reps. ``--force-split`` patches
kernels.interface.split_tail_pays to True (as split_profile.py does) so the split runs at any shape.
Paper-grid heads (hidden 2048). A session script; what it prints is a measurement of this GPU, not a committed
result. Configs that do not run persistent have no trace: they are left out with a note.
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

from fwd_ab import _parse_cfg  # noqa: E402  ("name=field:value,..." -> (name, {field: value}))


def call_stats(trace, grid: int) -> dict:
    """Stats of one traced call: ``trace`` int64 rows [start, end wg0, end wg1, sm] (ns) of the first ``grid`` CTAs."""
    rows = [list(map(int, r)) for r in trace[:grid]]
    starts = [r[0] for r in rows]
    ends = [max(r[1], r[2]) for r in rows]
    t0, t1 = min(starts), max(ends)
    span = t1 - t0
    offs = sorted(e - t0 for e in ends)
    pct = lambda p: offs[min(len(offs) - 1, int(p * (len(offs) - 1) + 0.5))]  # noqa: E731
    return dict(span_us=span / 1e3, end_spread_us=(offs[-1] - offs[0]) / 1e3,
                end_p10_p90_us=(pct(0.9) - pct(0.1)) / 1e3, start_spread_us=(max(starts) - t0) / 1e3,
                tail_idle_share=sum(t1 - e for e in ends) / (grid * span) if span else 0.0,
                end_offsets_us=[o / 1e3 for o in offs])


def traced_kernels():
    """A replacement for kernels.interface.get_fwd_kernel that compiles persistent kernels with trace_ctas and passes
    the current trace buffer (``state['trace']``) as their last argument; returns (getter, state)."""
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel

    cache, state = {}, {"trace": None}

    def get(cfg, dtype, hdim, hdim_v, causal, tvm_ffi=None, qhead_per_kvhead=1, window_left=-1, window_right=-1,
            softcap=0.0):
        key = (cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left, window_right, softcap)
        if key not in cache:
            kern = make_fwd_kernel(cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left, window_right,
                                   softcap, trace_ctas=bool(cfg.persistent))
            cache[key] = (kern, compile_fwd(kern))
        kern, fn = cache[key]
        if not kern.trace_ctas:
            state["traced"] = False
            return kern, fn
        state["traced"] = True
        return kern, lambda *args: fn(*args, state["trace"])

    return get, state


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 128, 192, 256))
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=None, help="default: 32k tokens / seqlen (the paper grid)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cfg", nargs="+", default=["pers=persistent:true,split_tail:false",
                                                 "split=persistent:true,split_tail:true"])
    ap.add_argument("--force-split", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    if a.reps < 1 or a.seqlen < 1:
        ap.error("--reps and --seqlen must be positive")
    import torch

    if not torch.cuda.is_available():
        print("cta_timeline: no CUDA device (the trace is read from the GPU's %globaltimer)", file=sys.stderr)
        return 2
    import kernels.interface as itf
    from kernels import AttnConfig

    if a.force_split:
        itf.split_tail_pays = lambda sms, tail, n_blocks: True
        itf.split_tail_launch.cache_clear()
    get, state = traced_kernels()
    itf.get_fwd_kernel = get
    d = a.hdim
    dv = 128 if d == 192 else d
    h = 2048 // d
    b = a.batch or max(1, 32768 // a.seqlen)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, a.seqlen, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, a.seqlen, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, a.seqlen, h, dv, device="cuda", dtype=torch.bfloat16, generator=g)
    sms = itf._sm_count(torch.cuda.current_device())
    variants = [_parse_cfg(s) for s in a.cfg]
    cfgs = {name: itf.resolve_config(AttnConfig(**kw), d, a.causal) for name, kw in variants}
    per = {name: [] for name in cfgs}
    for rep in range(a.reps + 1):  # round robin; rep 0 compiles and warms up
        for name, cfg in cfgs.items():
            state["trace"] = torch.zeros(sms, 4, dtype=torch.int64, device="cuda")
            itf.attention_forward(q, k, v, a.causal, d ** -0.5, cfg)
            torch.cuda.synchronize()
            if not state["traced"]:
                per[name] = None
                continue
            tr = state["trace"].cpu()
            grid = int((tr[:, 0] != 0).sum())
            if rep and per[name] is not None:
                per[name].append(call_stats(tr.tolist(), grid) | {"grid": grid})
    rows = []
    for name, calls in per.items():
        if not calls:
            print(f"{name:8s} not persistent at this shape: no trace")
            continue
        keys = ("span_us", "end_spread_us", "end_p10_p90_us", "start_spread_us", "tail_idle_share")
        row = dict(variant=name, config=dict(variants)[name], hdim=d, hdim_v=dv, seqlen=a.seqlen, batch=b, heads=h,
                   causal=a.causal, grid=calls[-1]["grid"], reps=len(calls), gpu=torch.cuda.get_device_name(),
                   **{k_: statistics.median(c[k_] for c in calls) for k_ in keys},
                   end_offsets_us=calls[-1]["end_offsets_us"])
        rows.append(row)
        print(f"{name:8s} grid {row['grid']:4d}  span {row['span_us']:9.1f} us  ends spread {row['end_spread_us']:7.1f} us"
              f" (p10-p90 {row['end_p10_p90_us']:6.1f})  starts spread {row['start_spread_us']:6.1f} us  tail idle "
              f"{100 * row['tail_idle_share']:5.2f}%")
    if a.out and rows:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    if a.plot and rows:
        plot(rows, a.plot)
    return 0


def plot(rows: list, path: str) -> None:
    """Each variant's CTA ends (us after the first start), sorted: a flat line is a balanced grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in rows:
        ax.plot(range(len(r["end_offsets_us"])), r["end_offsets_us"], label=r["variant"])
    r0 = rows[0]
    ax.set(xlabel="CTA (sorted by end)", ylabel="end (us after the first start)",
           title=f"hd{r0['hdim']} s{r0['seqlen']} b{r0['batch']} {'causal' if r0['causal'] else 'non-causal'}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
