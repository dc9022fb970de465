"""GQA A/B on one GPU, one process, round-robin with an L2 flush: grouped K/V passed natively vs K/V repeated.

``python scripts/gqa_ab.py [--hdims 64 128] [--seqlen 4096] [--groups 4 8] [--repeats 10]``: forward + backward of
``kernels.attention`` at 16k total tokens, 2048 / hdim Q heads, causal, bf16; ``native``
passes K/V with h_q / group heads, ``repeat`` expands them with repeat_interleave first (what a caller without GQA
support does; the expand and its backward are in the timed region). Prints per-round speed of native over repeat.
A session script (issue 12.1's "not slower than the same call with K/V repeated").
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bwd_ab import round_robin  # noqa: E402


def main():
    import torch

    import kernels

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    s = a.seqlen
    for hd in a.hdims:
        for g in a.groups:
            b, h = max(1, 16384 // s), 2048 // hd
            q = torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(b, s, h // g, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2))
            do = torch.randn(b, s, h, hd, device="cuda", dtype=torch.bfloat16)

            def native():
                kernels.attention(q, k, v, causal=True).backward(do)

            def repeat():
                kernels.attention(q, k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2),
                                  causal=True).backward(do)

            fns = {"native": native, "repeat": repeat}
            native()
            gq = q.grad.clone()
            q.grad = None
            times = round_robin(fns, a.repeats)
            ratios = sorted(x / y for x, y in zip(times["repeat"], times["native"]))
            print(f"hd{hd} s{s} group {g}: native {statistics.median(times['native']):.3f} ms, repeat "
                  f"{statistics.median(times['repeat']):.3f} ms, speed native/repeat {statistics.median(ratios):.3f} "
                  f"[{ratios[len(ratios) // 5]:.3f}, {ratios[(4 * len(ratios)) // 5]:.3f}] (dq finite: "
                  f"{bool(torch.isfinite(gq).all())})", flush=True)


if __name__ == "__main__":
    main()
