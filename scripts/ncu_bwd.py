"""One backward call each of ours and official FA4 (when importable), for Nsight Compute.

``ncu -k 'regex:(FlashBwdSm90|BackwardSm90)_object' --set full -o rep python scripts/ncu_bwd.py --hdim 128 --seqlen 8192``
profiles the two main backward kernels of one shape (16k total tokens, hidden 2048, bf16); always pass
``--clock-control none`` to ncu (its default locks the clocks to base, which we never do). ``--kernels N`` instead
runs each backward N times under torch.profiler and prints every kernel's mean device time (pre, main, post,
memsets), for the fixed per-call costs at short sequences. ``--t64`` adds our backward with 64-row Q tiles (official's
tile at hd128 causal), ``--det`` our deterministic backward (its main kernel is a second FlashBwdSm90 launch in the
report), ``--naive`` / ``--rotq`` the deterministic K/V-order walk / the non-deterministic rotated walk after it,
``--cfg NAME=field=value,...`` (repeatable) any other AttnConfig, last; ``--official-det`` official FA4's
deterministic backward after its default one; ``--seqlen-k`` / ``--batch`` another key length / batch (e.g. 128 keys:
one K/V tile a head, so the deterministic kernel's dQ turns never wait, scripts/det_cost_probe.py's shape).
A session script for kernel work; the committed benchmarks are the
experiments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    import torch

    import kernels
    from bwd_ab import bwd_inputs
    from kernels.sm90.backward import attention_backward

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--seqlen-k", type=int, default=None,
                    help="keys per sequence (default: --seqlen), e.g. 128 for one K/V tile a head: no dQ turn waits")
    ap.add_argument("--batch", type=int, default=None, help="batch (default: 16k tokens / --seqlen)")
    ap.add_argument("--kernels", type=int, default=0, help="N calls each under torch.profiler: per-kernel times")
    ap.add_argument("--det", action="store_true", help="also our deterministic backward (ours_det), after ours")
    ap.add_argument("--naive", action="store_true", help="also the deterministic K/V-order walk (ours_det_naive)")
    ap.add_argument("--t64", action="store_true", help="also our backward with 64-row Q tiles (ours_t64), after ours")
    ap.add_argument("--rotq", action="store_true",
                    help="also the non-deterministic rotated Q-tile walk (ours_rotq, AttnConfig.bwd_rotate_q), last")
    ap.add_argument("--official-det", action="store_true",
                    help="also official FA4's deterministic backward (fa4_official_det), after fa4_official")
    ap.add_argument("--cfg", action="append", default=[], metavar="NAME=FIELD=VALUE,...",
                    help="also our backward with these AttnConfig fields (values as Python literals), e.g. "
                         "--cfg 'det_lpt16=deterministic=True,det_schedule=\"lpt\",bwd_lpt_heads=16'; repeatable, "
                         "after the others in the given order")
    a = ap.parse_args()
    s, d, causal = a.seqlen, a.hdim, bool(a.causal)
    b, h = a.batch or max(1, 16384 // s), 2048 // d
    q, k, v, do, out, lse, scale = bwd_inputs(b, s, a.seqlen_k or s, h, d, causal=causal)
    calls = {"ours": lambda: attention_backward(q, k, v, out, do, lse, causal, scale, None)}
    if a.t64:
        t64 = kernels.AttnConfig(bwd_tile_m=64)
        calls["ours_t64"] = lambda: attention_backward(q, k, v, out, do, lse, causal, scale, t64)
    if a.det:
        det = kernels.AttnConfig(deterministic=True)
        calls["ours_det"] = lambda: attention_backward(q, k, v, out, do, lse, causal, scale, det)
    if a.naive:
        naive = kernels.AttnConfig(deterministic=True, det_schedule="naive")
        calls["ours_det_naive"] = lambda: attention_backward(q, k, v, out, do, lse, causal, scale, naive)
    if a.rotq:
        rotq = kernels.AttnConfig(bwd_rotate_q=True)
        calls["ours_rotq"] = lambda: attention_backward(q, k, v, out, do, lse, causal, scale, rotq)
    for spec in a.cfg:
        name, cfg = parse_cfg(spec)
        calls[name] = lambda cfg=cfg: attention_backward(q, k, v, out, do, lse, causal, scale, cfg)
    try:
        from flash_attn.cute.interface import _flash_attn_bwd

        calls["fa4_official"] = lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal)
        if a.official_det:
            calls["fa4_official_det"] = lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale,
                                                                causal=causal, deterministic=True)
    except ImportError:
        print("flash_attn.cute not importable: ours only")
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    if a.kernels:
        per_kernel(calls, a.kernels)


def parse_cfg(spec: str):
    """``NAME=field=value,field=value``: (NAME, AttnConfig(field=value, ...)); values are Python literals."""
    import ast

    import kernels

    name, _, fields = spec.partition("=")
    kw = {}
    for item in filter(None, fields.split(",")):
        field, _, value = item.partition("=")
        kw[field.strip()] = ast.literal_eval(value.strip())
    if not name or not kw:
        raise SystemExit(f"--cfg {spec!r}: expected NAME=field=value[,field=value...]")
    return name, kernels.AttnConfig(**kw)


def per_kernel(calls: dict, n: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for name, fn in calls.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        evs = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.device_time_total for e in evs) / n
        print(f"== {name}: {total:8.1f} us of kernels per call")
        for e in sorted(evs, key=lambda e: -e.device_time_total):
            print(f"   {e.device_time_total / n:8.1f} us  x{e.count / n:.0f}  {e.key[:110]}")


if __name__ == "__main__":
    main()
