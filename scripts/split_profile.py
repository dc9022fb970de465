"""Where the split tail's fixed cost goes: per-kernel GPU times (torch.profiler) of the persistent forward with and
without ``split_tail`` at one shape, and the wall time of each call between CUDA events.

``python scripts/split_profile.py [--hdim 128] [--seqlen 4096] [--seqlen-k S] [--batch 8] [--reps 20]
[--out rows.jsonl]``

The session-49 A/Bs read the split's cost as about 50-75 us per call whatever the shape (kernels/interface.py
SPLIT_TAIL_MIN_SAVED_BLOCKS); this splits it into the main kernel's change, the merge kernel (TailCombine) and the gap
between them. The split is forced (split_tail_pays patched to True) so that any shape can be profiled. Paper-grid
heads (hidden 2048). A session script; it prints measurements of this GPU, nothing it prints is a committed result.
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


def wall_us(fn, reps: int) -> float:
    """Median time between CUDA events around one call (us)."""
    import torch

    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--seqlen-k", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import torch

    import kernels.interface as itf
    from kernels import AttnConfig
    from bwd_ab import kernel_split  # torch.profiler's device time per kernel and call
    from kernels.interface import attention_forward, resolve_config

    itf.split_tail_pays = lambda sms, tail, n_blocks: True
    itf.split_tail_launch.cache_clear()
    d = a.hdim
    dv = 128 if d == 192 else d
    h = 2048 // d  # the paper grid's heads (scripts/fwd_ab.py's rule)
    sk = a.seqlen_k or a.seqlen
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(a.batch, a.seqlen, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(a.batch, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(a.batch, sk, h, dv, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = d ** -0.5
    rows = []
    for name, kw in (("pers", dict(persistent=True, split_tail=False)), ("split", dict(persistent=True, split_tail=True))):
        cfg = resolve_config(AttnConfig(**kw), d, False)

        def call(cfg=cfg):
            attention_forward(q, k, v, False, scale, cfg)

        kt = kernel_split({name: call}, a.reps)[name]  # [(kernel, us per call, launches per call)], longest first
        row = dict(variant=name, hdim=d, seqlen=a.seqlen, seqlen_k=sk, batch=a.batch, heads=h,
                   wall_us=wall_us(call, a.reps), kernels=kt, gpu_us=sum(us for _, us, _ in kt))
        rows.append(row)
        print(f"{name:6s} wall {row['wall_us']:9.1f} us  kernels {row['gpu_us']:9.1f} us")
        for kname, us, n in kt:
            print(f"    {us:9.1f} us  x{n:g}  {kname}")
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
