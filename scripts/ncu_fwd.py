"""One forward call each of ours and official FA4 (when importable), for Nsight Compute.

``ncu --clock-control none -k 'regex:(FlashFwdSm90|ForwardSm90)' -c 2 --set full -o rep python scripts/ncu_fwd.py
--hdim 128 --seqlen 8192`` profiles the two forward kernels of one shape (``--cfg NAME=field:value,...``: more of
ours, profiled after ours in the order given; pass ``-c`` = their count + 2) (16k total tokens, hidden 2048, bf16; hd 192
runs (192, 128)); always pass ``--clock-control none`` (ncu's default locks the clocks, which we never do). A session
script for kernel work, like scripts/ncu_bwd.py; the committed benchmarks are the experiments.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fwd_ab import _parse_cfg  # noqa: E402


def main():
    import torch

    import kernels

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--exp2", type=float, default=None, help="ours: exp2_emu_fraction (default: the table's)")
    ap.add_argument("--ours-only", action="store_true", help="skip official FA4")
    ap.add_argument("--cfg", nargs="*", default=[], help="NAME=field:value,... more of ours (scripts/fwd_ab.py's form)")
    a = ap.parse_args()
    s, d, causal = a.seqlen, a.hdim, bool(a.causal)
    dv = 128 if d == 192 else d
    b, h = max(1, 16384 // s), 2048 // d
    q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(d)
    cfg = kernels.AttnConfig(exp2_emu_fraction=a.exp2) if a.exp2 is not None else None
    calls = {"ours": lambda: kernels.attention(q, k, v, causal=causal, softmax_scale=scale, config=cfg)}
    for spec in a.cfg:
        name, kw = _parse_cfg(spec)
        c = kernels.AttnConfig(**kw)
        calls[name] = lambda c=c: kernels.attention(q, k, v, causal=causal, softmax_scale=scale, config=c)
    try:
        if a.ours_only:
            raise ImportError("--ours-only")
        from flash_attn.cute.interface import flash_attn_func

        # return_lse=True: official's kernel with the LSE store, as ours always has (scripts/fwd_ab.py; until
        # 2026-12-03 this script profiled official's kernel without it)
        calls["fa4_official"] = lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    except ImportError as e:
        print(f"ours only ({e})")
    for name, fn in calls.items():
        fn()
        print(f"{name}: ran")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
