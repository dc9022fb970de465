"""Where the varlen forward and the padded forward differ on equal lengths (tests/test_varlen_gpu.py's failing
comparison): per differing value its (batch, row, head, col), both outputs, the difference in bf16 ulps and each
kernel's error against an fp64 reference. Usage on the GPU host: python scripts/varlen_vs_padded.py [--persistent 0]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    import kernels
    from kernels import AttnConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seqlen", type=int, default=513)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=0)
    args = ap.parse_args()
    b, s, h, d = args.batch, args.seqlen, 2, args.hdim
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(b * s, h, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)
    for name, cfg in (("default", None), ("rescale_always", AttnConfig(rescale_threshold=0.0))):
        out = kernels.attention_varlen(q, k, v, cu, cu, s, s, causal=bool(args.causal), config=cfg)
        ref = kernels.attention(q.view(b, s, h, d), k.view(b, s, h, d), v.view(b, s, h, d), causal=bool(args.causal),
                                config=cfg)
        qf, kf, vf = (t.view(b, s, h, d).double().transpose(1, 2) for t in (q, k, v))
        exact = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=bool(args.causal)).transpose(1, 2)
        o, r = out.view(b, s, h, d).float(), ref.float()
        ulp = torch.exp2(torch.floor(torch.log2(r.abs().clamp_min(2.0**-126))) - 7)
        n_ulp = (o - r).abs() / ulp
        bad = (n_ulp > 1).nonzero()
        print(f"[{name}] values > 1 ulp apart: {len(bad)}; max ulps {n_ulp.max().item():.1f}; "
              f"max |varlen - fp64| {(o.double() - exact).abs().max().item():.3e}, "
              f"max |padded - fp64| {(r.double() - exact).abs().max().item():.3e}")
        rows = sorted({(int(x[0]), int(x[1])) for x in bad})
        print(f"  (batch, row) with a difference: {rows[:40]}{' ...' if len(rows) > 40 else ''}")
        for x in bad[:12].tolist():
            bi, si, hi, di = x
            e = exact[bi, si, hi, di].item()
            print(f"  b{bi} row{si} h{hi} col{di}: varlen {o[bi, si, hi, di].item():+.6f} padded {r[bi, si, hi, di].item():+.6f} "
                  f"fp64 {e:+.6f} ulps {n_ulp[bi, si, hi, di].item():.1f}")


if __name__ == "__main__":
    main()
