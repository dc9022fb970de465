"""One backward call each of ours and official FA4 (when importable), for Nsight Compute.

``ncu -k 'regex:(FlashBwdSm90|BackwardSm90)_object' --set full -o rep python scripts/ncu_bwd.py --hdim 128 --seqlen 8192``
profiles the two main backward kernels of one shape (16k total tokens, hidden 2048, bf16). A session script for
kernel work; the committed benchmarks are the experiments.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    import torch

    import kernels
    from kernels.sm90.backward import attention_backward

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", type=int, default=0)
    a = ap.parse_args()
    s, d, causal = a.seqlen, a.hdim, bool(a.causal)
    b, h = max(1, 16384 // s), 2048 // d
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    attention_backward(q, k, v, out, do, lse, causal, scale, None)
    try:
        from flash_attn.cute.interface import _flash_attn_bwd

        _flash_attn_bwd(q, k, v, out, do, lse, softmax_scale=scale, causal=causal)
    except ImportError:
        print("flash_attn.cute not importable: ours only")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
