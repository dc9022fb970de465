"""Quick A/B timing of our sm90 backward against flash_attn.cute's (fa4_official), for the issue-4 report.

``python -m kernels.sm90.bwd_bench [out.jsonl]`` on an H100/H200: hdim 64 and 128, seqlen 8k (batch 2,
heads*hdim = 2048), causal both ways; ours (plain, deterministic, two_cta) and fa4_official (plain,
deterministic). CUDA events, warm-up, variants interleaved round-robin, median of the repeats; backward FLOPs
= 2.5 x forward (4*b*h*s^2*d, halved for causal). The sweep harness (experiments/) is the place for the
committed benchmark; this module only gives the numbers one GPU session can afford.
"""
from __future__ import annotations

import json
import math
import statistics
import sys


def _bench(fns: dict, repeats: int = 15, warmup: int = 3) -> dict:
    import torch

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times[k].append(a.elapsed_time(b))
    return {k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}


def main(path: str | None = None) -> list[dict]:
    import torch

    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    from .. import AttnConfig
    from .backward import attention_backward

    rows = []
    seqlen = 8192
    for hdim in (64, 128):
        heads, batch = 2048 // hdim, 16384 // seqlen
        for causal in (False, True):
            q, k, v, do = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(4))
            scale = 1.0 / math.sqrt(hdim)
            out, lse = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)[:2]
            fns = {
                "ours": lambda: attention_backward(q, k, v, out, do, lse, causal, scale, AttnConfig()),
                "ours_det": lambda: attention_backward(q, k, v, out, do, lse, causal, scale,
                                                       AttnConfig(deterministic=True)),
                "ours_2cta": lambda: attention_backward(q, k, v, out, do, lse, causal, scale,
                                                        AttnConfig(two_cta=True)),
                "fa4_official": lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal),
                "fa4_official_det": lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale,
                                                             causal=causal, deterministic=True),
            }
            res = _bench(fns)
            flops = 2.5 * 4 * batch * heads * seqlen * seqlen * hdim * (0.5 if causal else 1.0)
            for name, (med, lo, hi) in res.items():
                row = dict(backend=name, hdim=hdim, seqlen=seqlen, batch=batch, heads=heads, causal=causal,
                           ms_median=med, ms_min=lo, ms_max=hi, tflops=flops / med / 1e9,
                           gpu=torch.cuda.get_device_name())
                rows.append(row)
                print(f"hd{hdim} causal={int(causal)} {name:17s} {med:8.3f} ms  {flops / med / 1e9:7.1f} TFLOP/s"
                      f"  [{lo:.3f}, {hi:.3f}]", flush=True)
            base = res["ours"][0]
            print(f"hd{hdim} causal={int(causal)} ratios: ours/fa4={res['fa4_official'][0] / base:.3f}  "
                  f"det/ours={base / res['ours_det'][0]:.3f}  2cta/ours={base / res['ours_2cta'][0]:.3f}  "
                  f"fa4det/fa4={res['fa4_official'][0] / res['fa4_official_det'][0]:.3f}", flush=True)
            if path:
                with open(path, "a") as f:
                    for row in rows[-len(res):]:
                        f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
