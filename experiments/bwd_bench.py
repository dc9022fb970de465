"""Quick A/B timing of our sm90 backward against flash_attn.cute's (fa4_official), for the issue-4 report.

``python -m experiments.bwd_bench run --out rows.jsonl [--after f1 f2 ...]`` on an H100/H200: hdim 64 and 128,
seqlen 8k (batch 2, heads*hdim = 2048), causal both ways. Pass 1: ours (plain, deterministic) and
fa4_official (plain, deterministic); pass 2: ours against the shared-memory dQ path and two_cta (each also
deterministic). Ratios are speed ratios (time of the second / time of the first). ``--after`` waits for those files to exist
before timing (compiles first, so a test run on the same GPU can finish meanwhile). ``warm-fa4 --hdim H
--causal C`` compiles flash_attn.cute's kernels into its disk cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1).
Timing: experiments/timing/roundrobin.py (CUDA events, warm-up, L2 flushed, variants round-robin, median of the
rounds); FLOPs: kernels/flops.py. The sweep (bwd_peers, bwd_ablation) is the place for committed numbers; this
module only gives the numbers one GPU session can afford, including the internal dQ-via-smem path.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

from kernels.flops import attention_flops


def _bench(fns: dict, repeats: int = 15, warmup: int = 3) -> dict:
    from experiments.timing.roundrobin import round_robin

    rr = round_robin(fns, device="cuda", warmup=warmup, rounds=repeats)
    return {k: (rr.stats(k)["median"], rr.stats(k)["min"], rr.stats(k)["max"]) for k in fns}


def _inputs(hdim, causal, seqlen=8192):
    import torch

    from flash_attn.cute.interface import _flash_attn_fwd

    heads, batch = 2048 // hdim, 16384 // seqlen
    q, k, v, do = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 1.0 / math.sqrt(hdim)
    out, lse = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)[:2]
    return q, k, v, out, do, lse, scale, batch, heads, seqlen


def _fns(q, k, v, out, do, lse, scale, causal, names):
    from flash_attn.cute.interface import _flash_attn_bwd

    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    def ours(cfg, **kw):
        return lambda: attention_backward(q, k, v, out, do, lse, causal, scale, cfg, **kw)

    table = {
        "ours": ours(AttnConfig()),
        "ours_det": ours(AttnConfig(deterministic=True)),
        "ours_smem": ours(AttnConfig(), _dq_via_smem=True),
        "ours_smem_det": ours(AttnConfig(deterministic=True), _dq_via_smem=True),
        "ours_2cta": ours(AttnConfig(two_cta=True)),
        "ours_2cta_det": ours(AttnConfig(two_cta=True, deterministic=True)),
        "fa4_official": lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal),
        "fa4_official_det": lambda: _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal,
                                                    deterministic=True),
    }
    return {n: table[n] for n in names}


# pass 1: the GPU-verified variants and the peer; pass 2: variants verified only by compile/SASS so far
# (a hang there cannot cost the pass-1 rows, which are written first)
PASS1 = ("ours", "ours_det", "fa4_official", "fa4_official_det")
PASS2 = ("ours", "ours_smem", "ours_smem_det", "ours_2cta", "ours_2cta_det")


def warm_fa4(hdim: int, causal: bool) -> None:
    import torch

    q, k, v, out, do, lse, scale, *_ = _inputs(hdim, causal, seqlen=1024)
    from flash_attn.cute.interface import _flash_attn_bwd

    for det in (False, True):
        _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal, deterministic=det)
    torch.cuda.synchronize()


def _ratio(res, a, b):
    return res[b][0] / res[a][0] if a in res and b in res else float("nan")


def main(path: str | None = None, after: list[str] | None = None) -> list[dict]:
    import torch

    configs = [(h, c) for h in (64, 128) for c in (False, True)]
    for hdim, causal in configs:  # compile the pass-1 kernels first (small inputs; kernels are shape-generic)
        q, k, v, out, do, lse, scale, *_ = _inputs(hdim, causal, seqlen=1024)
        for name, fn in _fns(q, k, v, out, do, lse, scale, causal, ("ours", "ours_det")).items():
            fn()
    torch.cuda.synchronize()
    t0 = time.time()
    while after and not all(os.path.exists(f) for f in after) and time.time() - t0 < 400:
        time.sleep(1.0)
    rows = []
    for names in (PASS1, PASS2):
        for hdim, causal in configs:
            q, k, v, out, do, lse, scale, batch, heads, seqlen = _inputs(hdim, causal)
            res = _bench(_fns(q, k, v, out, do, lse, scale, causal, names))
            flops = attention_flops(batch, heads, seqlen, seqlen, hdim, hdim, causal, "bwd")
            for name, (med, lo, hi) in res.items():
                row = dict(backend=name, hdim=hdim, seqlen=seqlen, batch=batch, heads=heads, causal=causal,
                           ms_median=med, ms_min=lo, ms_max=hi, tflops=flops / med / 1e9,
                           gpu=torch.cuda.get_device_name(), bench_pass=1 if names is PASS1 else 2)
                rows.append(row)
                print(f"hd{hdim} causal={int(causal)} {name:17s} {med:8.3f} ms  {flops / med / 1e9:7.1f} TFLOP/s"
                      f"  [{lo:.3f}, {hi:.3f}]", flush=True)
                if path:
                    with open(path, "a") as f:
                        f.write(json.dumps(row) + "\n")
            print(f"hd{hdim} causal={int(causal)} speed ratios: ours/fa4={_ratio(res, 'ours', 'fa4_official'):.3f} "
                  f"det/ours={_ratio(res, 'ours_det', 'ours'):.3f} fa4det/fa4={_ratio(res, 'fa4_official_det', 'fa4_official'):.3f} "
                  f"smem/ours={_ratio(res, 'ours_smem', 'ours'):.3f} smem_det/smem={_ratio(res, 'ours_smem_det', 'ours_smem'):.3f} "
                  f"2cta/ours={_ratio(res, 'ours_2cta', 'ours'):.3f}", flush=True)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["run", "warm-fa4"])
    ap.add_argument("--out")
    ap.add_argument("--after", nargs="*")
    ap.add_argument("--hdim", type=int)
    ap.add_argument("--causal", type=int)
    a = ap.parse_args()
    if a.cmd == "warm-fa4":
        warm_fa4(a.hdim, bool(a.causal))
    else:
        main(a.out, a.after)
