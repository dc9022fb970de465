"""Backward A/B on one GPU, one process, round-robin with an L2 flush: our variants vs official FA4 and cuDNN.

``python scripts/bwd_ab.py [--out rows.jsonl] [--hdims 64 128] [--seqlens 8192] [--repeats 20] [--base DIR]``: per
(hdim, causal, seqlen) at 16k total tokens (``--tokens``) and hidden 2048, times each backend's backward (dq, dk, dv from out, dout,
lse), prints TFLOP/s and per-round speed ratios against `ours`, and the host wall time of forward+backward on a tiny
problem. ``--base DIR``: also `ours_base`, the default backward of the kernels/ tree in DIR (e.g. ``git archive`` of an
older commit), imported as a separate package so both run in this process.
A session script for kernel work; the committed benchmark is `python run.py sweep experiment=bwd_peers`.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _variants(q, k, v, out, do, lse, scale, causal, base=None):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    def ours(**kw):
        cfg = AttnConfig(**kw)
        return lambda: attention_backward(q, k, v, out, do, lse, causal, scale, cfg)

    fns = {"ours": ours(), "ours_det": ours(deterministic=True)}
    if base is not None:  # the backward of another kernels/ tree (fa4lab_base.sm90.backward), its own defaults
        fns["ours_base"] = lambda: base.attention_backward(q, k, v, out, do, lse, causal, scale, None)
        base_cfg = importlib.import_module(base.__name__.split(".")[0] + ".config").AttnConfig
        fns["ours_base_det"] = lambda: base.attention_backward(q, k, v, out, do, lse, causal, scale,
                                                               base_cfg(deterministic=True))
        if (q.shape[-1], v.shape[-1]) in ((64, 64), (128, 128), (192, 128)):  # the base tree's two dQ writers
            fns["ours_base_det_2w"] = lambda: base.attention_backward(
                q, k, v, out, do, lse, causal, scale, base_cfg(deterministic=True, bwd_det_two_writers=True))
        if (q.shape[-1], v.shape[-1]) == (128, 128):  # the base tree's 64-row Q tiles
            fns["ours_base_t64"] = lambda: base.attention_backward(q, k, v, out, do, lse, causal, scale,
                                                                   base_cfg(bwd_tile_m=64))
        if (q.shape[-1], v.shape[-1]) == (256, 256):  # the base tree's deterministic 80-row K/V tile pairs
            fns["ours_base_n80_det"] = lambda: base.attention_backward(
                q, k, v, out, do, lse, causal, scale, base_cfg(two_cta=True, bwd_two_cta_n80=True, deterministic=True))
    if q.shape[-1] <= 128:  # two_cta off by default at hd 64 / 128
        fns["ours_2cta"] = ours(two_cta=True)  # the dS hand-back without MEMBAR.GPU (bwd_two_cta_cta_release, default)
        # docs/BWD_TWO_CTA.md: the cluster-scope (fenced) hand-back, and the opt-in dV before the exchange
        fns["ours_2cta_fence"] = ours(two_cta=True, bwd_two_cta_cta_release=False)
        fns["ours_2cta_fast"] = ours(two_cta=True, bwd_two_cta_dv_first=True)
    if (q.shape[-1], v.shape[-1]) == (256, 256):  # hd256: two_cta is the default, so time the one-CTA kernel
        fns["ours_1cta"] = ours(two_cta=False)
        if not causal:  # the pairs' rotated Q-tile walks without determinism (AttnConfig.bwd_rotate_q)
            fns["ours_rotq"] = ours(bwd_rotate_q=True)
        # 80-row K/V tiles (bwd_wide_two_cta80.py; the non-deterministic default) against the 64-row pair kernel
        fns["ours_n64"] = ours(two_cta=True, bwd_two_cta_n80=False)
        fns["ours_n80_det"] = ours(two_cta=True, bwd_two_cta_n80=True, deterministic=True)
        fns["ours_n80_det_spt"] = ours(two_cta=True, bwd_two_cta_n80=True, deterministic=True, det_schedule="spt")
        fns["ours_n64_det"] = ours(two_cta=True, bwd_two_cta_n80=False, deterministic=True)
    if q.shape[-1] == 64:
        fns["ours_t128"] = ours(bwd_tile_m=128)
        fns["ours_t64"] = ours(bwd_tile_m=64)
        fns["ours_t128_det"] = ours(bwd_tile_m=128, deterministic=True)
        # 64-row Q tiles: M = 2N, so the spread rotate starts (docs/wip) put a Q tile's turns 2 steps apart (in time
        # still one 128-row step: the hand-off's slack does not grow, only its granularity)
        fns["ours_t64_det"] = ours(bwd_tile_m=64, deterministic=True)
    if q.shape[-1] == 128 and v.shape[-1] == 128:  # hd128: 80-row Q tiles (the default; dQ^T) against 64 rows
        fns["ours_t80"] = ours(bwd_tile_m=80)  # the default's kernel again: a same-kernel pair shows the noise
        fns["ours_t64"] = ours(bwd_tile_m=64)
        fns["ours_t64_det"] = ours(bwd_tile_m=64, deterministic=True)
    if q.shape[-1] in (64, 128) and q.shape[-1] == v.shape[-1]:  # opt-in schedule candidates (AttnConfig fields)
        if causal:  # grid longest first (official's order), g heads interleaved
            fns["ours_lpt1"] = ours(bwd_lpt_heads=1)
            fns["ours_lpt4"] = ours(bwd_lpt_heads=4)
            if q.shape[-1] == 128:  # 80-row Q tiles walked from each K/V tile's diagonal row (AttnConfig.bwd_diag_align)
                fns["ours_diag"] = ours(bwd_diag_align=True)
                # the same walk in the deterministic kernel, 8-row dQ semaphores (AttnConfig.bwd_det_diag_align)
                fns["ours_det_diag"] = ours(deterministic=True, bwd_det_diag_align=True)
                fns["ours_diag_pdl"] = ours(bwd_diag_align=True, bwd_pdl=True)
                # each walk's last Q tile over its 16-row blocks below seqlen_q only (AttnConfig.bwd_q_tail)
                fns["ours_qtail"] = ours(bwd_q_tail=True)
        elif q.shape[-1] == 128:  # rotated Q-tile walks (hd64's default)
            fns["ours_rotq"] = ours(bwd_rotate_q=True)
        # programmatic dependent launch pre -> main -> post (AttnConfig.bwd_pdl; the defaults otherwise)
        fns["ours_pdl"] = ours(bwd_pdl=True)
        # the postprocess converts each dQ tile once its reductions are counted complete (AttnConfig.bwd_stream_post)
        fns["ours_stream"] = ours(bwd_pdl=True, bwd_stream_post=True)
        # the first dQ writer per unit stores, the preprocess zeroes no dQaccum (AttnConfig.bwd_dq_claim; hd128
        # non-causal only on rotated walks: ours_claim_rotq, against ours_rotq)
        fns["ours_claim"] = ours(bwd_dq_claim=True)
        if not causal and q.shape[-1] == 128:
            fns["ours_claim_rotq"] = ours(bwd_dq_claim=True, bwd_rotate_q=True)
        fns["ours_nostream"] = ours(bwd_stream_post=False)
        if q.shape[-1] == 64:  # two dQ staging buffers (AttnConfig.bwd_dq_stages; hd64's 128-row tiles: exactly 227 KB)
            fns["ours_dq2"] = ours(bwd_dq_stages=2)
            fns["ours_det_dq2"] = ours(deterministic=True, bwd_dq_stages=2)
            fns["ours_det_2w_dq2"] = ours(deterministic=True, bwd_det_two_writers=True, bwd_dq_stages=2)
            fns["ours_det_lpt16_dq2"] = ours(deterministic=True, det_schedule="lpt", bwd_lpt_heads=16, bwd_dq_stages=2)
        # deterministic: the postprocess streams on the dQ semaphores (the default at hd 64 / 128 since 2026-12-04)
        fns["ours_det_stream"] = ours(deterministic=True, bwd_pdl=True, bwd_stream_post=True)
        fns["ours_det_nostream"] = ours(deterministic=True, bwd_stream_post=False)
        # persistent main kernel: grid min(SM count, K/V tiles), each CTA walks K/V tiles (AttnConfig.bwd_persistent)
        fns["ours_pers"] = ours(bwd_persistent=True)
        # the dQ writer frees each warpgroup's staging chunk after its own bulk read (AttnConfig.bwd_dq_chunk_release)
        fns["ours_dqrel"] = ours(bwd_dq_chunk_release=True)
    # K/V tile order turns (non-causal: every walk from Q tile 0; causal: the diagonal-most K/V tile first)
    fns["ours_det_naive"] = ours(deterministic=True, det_schedule="naive")
    if q.shape[-1] in (64, 128) and q.shape[-1] == v.shape[-1]:
        # det_schedule="lpt" (issue 9, opt-in): longest K/V tile first (bwd_lpt_heads heads interleaved), causal
        # Q-tile walks descending, dQ turns in K/V tile order (g = max(bwd_lpt_heads, 8) heads per group;
        # ours_det_lpt16 / 32: 16 / 32)
        fns["ours_det_lpt"] = ours(deterministic=True, det_schedule="lpt")
        fns["ours_det_lpt16"] = ours(deterministic=True, det_schedule="lpt", bwd_lpt_heads=16)
        fns["ours_det_lpt32"] = ours(deterministic=True, det_schedule="lpt", bwd_lpt_heads=32)
        fns["ours_det_lpt16_2w"] = ours(deterministic=True, det_schedule="lpt", bwd_lpt_heads=16,
                                        bwd_det_two_writers=True)
    if not causal and (q.shape[-1], v.shape[-1]) in ((64, 64), (128, 128), (192, 128)):
        # det_schedule="rotate" (issue 9): rotated Q-tile walks, arrival-order dQ turns (non-causal; causal runs spt)
        fns["ours_det_rot"] = ours(deterministic=True, det_schedule="rotate")
    if ((q.shape[-1], v.shape[-1]) in ((64, 64), (128, 128), (192, 128))
            and "bwd_det_two_writers" in AttnConfig.__dataclass_fields__):
        # AttnConfig.bwd_det_two_writers (issue 9; opt-in at hd 64 / 128): two dQ writer warps, the staging buffer freed
        # after the bulk read, the completion waited only before the semaphore release (kernels/sm90/bwd.py
        # dq_writer_pair; causal spt / non-causal rotate turns unchanged)
        fns["ours_det_2w"] = ours(deterministic=True, bwd_det_two_writers=True)
    fns.update(official_bwd(q, k, v, out, do, lse, scale, causal))
    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_(True) for t in (q, k, v))
    dot = do.transpose(1, 2)
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)
        fns["sdpa_cudnn"] = lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)
    except RuntimeError as e:  # e.g. no cuDNN backward at this head dim
        print(f"sdpa_cudnn skipped: {str(e).splitlines()[0][:120]}")
    return fns


def bwd_inputs(batch: int, seqlen_q: int, seqlen_k: int, heads: int, hdim: int, hdim_v: int | None = None,
               causal: bool = False, seed: int = 0, dtype: str = "bfloat16"):
    """(q, k, v, do, out, lse, scale) of a backward: random q / k / v / do ((batch, seqlen, heads, dim), seeded on the
    GPU), our forward's out and lse (natural log) and the softmax scale 1 / sqrt(hdim)."""
    import torch

    import kernels

    dv = hdim_v or hdim
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(batch, s, heads, d, device="cuda", dtype=getattr(torch, dtype), generator=g)
                   for s, d in ((seqlen_q, hdim), (seqlen_k, hdim), (seqlen_k, dv), (seqlen_q, dv)))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    return q, k, v, do, out, lse, 1.0 / math.sqrt(hdim)


def official_bwd(q, k, v, out, do, lse, scale, causal) -> dict:
    """{"fa4_official": ..., "fa4_official_det": ...}: official FA4's backward calls (default, deterministic mode) on
    these tensors, or {} where flash_attn.cute is not importable."""
    try:
        from flash_attn.cute.interface import _flash_attn_bwd
    except ImportError:
        return {}
    return {"fa4_official": lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal),
            "fa4_official_det": lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal,
                                                        deterministic=True)}


def speed_vs(times: dict, base: str = "ours") -> dict:
    """{variant: (median ms, per-round speed ratios t_base / t_variant, p20, median, p80)} of round_robin's times."""
    out = {}
    for n, t in times.items():
        r = [b / x for b, x in zip(times[base], t)]
        s = sorted(r)
        out[n] = (statistics.median(t), r, s[len(s) // 5], statistics.median(s), s[4 * len(s) // 5])
    return out


def round_robin(fns: dict, repeats: int, warmup: int = 3, hold_us: float = 0.0) -> dict:
    """Per-variant CUDA-event times over ``repeats`` rounds (rounded up to whole cycles) in the balanced orders of
    experiments.timing.roundrobin.balanced_orders (every variant follows every other equally often), the L2 flushed
    before each call; ``hold_us`` > 0 queues a GPU spin after the flush so the host's launch time is not timed
    (experiments.bench.CallTimer)."""
    import torch

    from experiments.timing.roundrobin import balanced_orders, whole_cycles

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    orders = balanced_orders(list(fns))
    for r in range(whole_cycles(repeats, len(fns))):
        for name in orders[r % len(orders)]:
            flush.zero_()
            if hold_us > 0:
                torch.cuda._sleep(int(hold_us * 2000))  # ~2000 cycles per us at the H200's clock
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fns[name]()
            b.record()
            torch.cuda.synchronize()
            times[name].append(a.elapsed_time(b))
    return times


GPU_FIELDS = ("gpu_samples", "sm_clock_mhz_min", "sm_clock_mhz_median", "power_w_median", "temp_c_max", "throttled_share",
              "throttle_reasons")


def sampled(run):
    """``run()`` under experiments.timing.sampler.GpuSampler (NVML read on a thread, clocks never changed): its result
    and the GPU fields every row it times carries (throttled_share = the share of samples with a clock-event reason
    other than idle; None fields without NVML)."""
    from experiments.timing.sampler import GpuSampler

    with GpuSampler() as sampler:
        out = run()
    summary = sampler.summary()
    return out, {k: summary.get(k) for k in GPU_FIELDS}


def sampled_round_robin(fns: dict, repeats: int, hold_us: float = 0.0) -> tuple[dict, dict]:
    """``round_robin`` under the GPU sampler (``sampled``): the per-variant times and the rounds' GPU fields."""
    return sampled(lambda: round_robin(fns, repeats, hold_us=hold_us))


def gpu_note(gpu: dict) -> str:
    """' throttled 12% (sw_power_cap) sm 1755-1980 MHz' for a printed line ('' without samples)."""
    if gpu.get("throttled_share") is None:
        return ""
    return (f"  throttled {gpu['throttled_share']:.0%}" + (f" ({gpu['throttle_reasons']})" if gpu["throttle_reasons"] else "")
            + f" sm {gpu['sm_clock_mhz_min']:.0f}/{gpu['sm_clock_mhz_median']:.0f} MHz")


def host_overhead(n: int = 200, profile: bool = False) -> dict:
    """Wall time per forward+backward call (and forward alone) on 1x128x16x128 causal bf16."""
    import torch

    import kernels

    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16)
    res = {}
    calls = {"ours": lambda: kernels.attention(q, k, v, causal=True),
             "ours_pdl": lambda: kernels.attention(q, k, v, causal=True, config=kernels.AttnConfig(bwd_pdl=True))}
    try:
        from flash_attn.cute import flash_attn_func

        calls["fa4_official"] = lambda: flash_attn_func(q, k, v, causal=True)
    except ImportError:
        pass
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    calls["sdpa_cudnn"] = cudnn
    for name, f in calls.items():
        for _ in range(10):
            o = f()
            o = o[0] if isinstance(o, tuple) else o
            o.backward(do)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            o = f()
            o = o[0] if isinstance(o, tuple) else o
        torch.cuda.synchronize()
        fwd = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(n):
            o = f()
            o = o[0] if isinstance(o, tuple) else o
            o.backward(do)
        torch.cuda.synchronize()
        res[name] = dict(fwd_us=fwd, fwd_bwd_us=(time.perf_counter() - t0) / n * 1e6)
        print(f"host {name:14s} fwd {fwd:7.1f} us  fwd+bwd {res[name]['fwd_bwd_us']:7.1f} us", flush=True)
    if profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n):
            calls["ours"]().backward(do)
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    return res


def kernel_split(fns: dict, n: int = 10) -> dict:
    """Device time per call of each kernel a backend launches (torch.profiler's CUDA activity over ``n`` calls after a
    warm-up; the L2 is not flushed): {backend: [(kernel name, us per call, launches per call), ...]}, longest first.
    Shows whether a backend's time is in its main kernel or in the pre / post passes (dPsum, dQ zeroing / convert)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        acc = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                t, c = acc.get(e.name, (0.0, 0))
                acc[e.name] = (t + e.device_time_total, c + 1)  # device_time_total: us
        out[name] = sorted(((k[:90], t / n, c / n) for k, (t, c) in acc.items()), key=lambda r: -r[1])
    return out


def main():
    import torch

    from experiments.metadata import provenance

    prov = provenance()  # git_sha (or $FA4LAB_GIT_SHA on a copy without .git), git_dirty, kernels_hash: on every row
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--hdim-v", type=int, help="V head dim for every --hdims entry (default: equal; 128 for 192)")
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=16384, help="total tokens per shape (batch = tokens / seqlen)")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also print each backend's device time per kernel "
                    "(torch.profiler; kernel_split) and add it to the rows as `kernels`")
    ap.add_argument("--profile", action="store_true", help="with --host: cProfile of our forward+backward calls")
    ap.add_argument("--base", help="a folder holding an older kernels/ tree: adds the variant ours_base")
    ap.add_argument("--hold-us", type=float, default=500.0,
                    help="GPU spin before each timed call, so only device time is timed (the sweeps' bench.hold_us)")
    a = ap.parse_args()
    base = None
    if a.base:
        from fwd_ab import _import_base

        _import_base(Path(a.base).resolve())
        import importlib

        base = importlib.import_module("fa4lab_base.sm90.backward")
    rows = []
    for s in a.seqlens:
        for hdim in a.hdims:
            for causal in map(bool, a.causal):
                heads, batch = 2048 // hdim, max(1, a.tokens // s)
                hdim_v = a.hdim_v or (128 if hdim == 192 else hdim)
                from kernels.flops import attention_flops

                q, k, v, do, out, lse, scale = bwd_inputs(batch, s, s, heads, hdim, hdim_v, causal)
                fns = _variants(q, k, v, out, do, lse, scale, causal, base)
                if a.only:
                    fns = {n: f for n, f in fns.items() if n in a.only or n == "ours"}
                times, gpu = sampled_round_robin(fns, a.repeats, hold_us=a.hold_us)
                print(f"hd{hdim} s{s} causal={int(causal)} GPU during the rounds:{gpu_note(gpu) or ' not sampled'}")
                flops = attention_flops(batch, heads, s, s, hdim, hdim_v, causal, "bwd")
                t_ours = times["ours"]
                split = kernel_split(fns) if a.kernels else {}
                for name, ks in split.items():
                    print(f"hd{hdim} s{s} causal={int(causal)} {name:17s} kernels: " + "; ".join(
                        f"{k} {t:.1f} us x{c:g}" for k, t, c in ks), flush=True)
                for name, t in times.items():
                    med = statistics.median(t)
                    ratios = sorted(b / x for b, x in zip(t_ours, t))  # speed of `name` relative to ours, per round
                    row = dict(backend=name, hdim=hdim, hdim_v=hdim_v, seqlen=s, batch=batch, heads=heads, causal=causal,
                               tokens=batch * s,
                               ms_median=med, tflops=flops / med / 1e9, speed_vs_ours=statistics.median(ratios),
                               p20=ratios[len(ratios) // 5], p80=ratios[(4 * len(ratios)) // 5], n=len(t),
                               gpu=torch.cuda.get_device_name(), hold_us=a.hold_us, **gpu, **prov)
                    if name in split:
                        row["kernels"] = [dict(name=k, us=t, launches=c) for k, t, c in split[name]]
                    rows.append(row)
                    print(f"hd{hdim} s{s} causal={int(causal)} {name:17s} {med:7.3f} ms {row['tflops']:6.1f} TFLOP/s"
                          f"  speed/ours {row['speed_vs_ours']:.3f} [{row['p20']:.3f}, {row['p80']:.3f}]", flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
    if a.host:
        host_overhead(profile=a.profile)


if __name__ == "__main__":
    main()
