"""A dense matmul timed in the same round-robin rounds as a compare job's attention entries (``gemm_ref: true`` in
the job, e.g. conf/experiment/fwd_gemm.yaml), so "ours at X% of the matmul throughput" is a ratio measured in one
process under the same clocks (issue 11: hd128 non-causal 16k forward at >= 90% of the bf16 matmul).

The GEMM is square, n x n x n at the shape's dtype with n the multiple of 128 whose 2 n^3 FLOPs come closest to the
attention's (so both run for about as long), between 128 and 16384. Its ratio row is normalised to the attention's
FLOPs: per round r = (t_gemm * F_attn / F_gemm) / t_ours, the time the matmul would take for the attention's FLOPs
over ours, so median r is (ours TFLOP/s) / (matmul TFLOP/s), read like any peer's ratio (> 1: ours ahead).
"""
from __future__ import annotations

import torch

LABEL = "matmul_ref"  # the entry's backend name in the rows
QUANTUM, LOWEST, HIGHEST = 128, 128, 16384


def gemm_size(flops: float) -> int:
    """n (a multiple of 128 in [128, 16384]) whose 2 n^3 is nearest ``flops``."""
    if not flops or flops <= 0:
        raise ValueError(f"flops={flops!r}: the attention's FLOPs must be positive")
    n = round((flops / 2) ** (1 / 3) / QUANTUM) * QUANTUM
    return int(min(HIGHEST, max(LOWEST, n)))


def gemm_flops(n: int) -> float:
    return 2.0 * n ** 3


def gemm_fn(n: int, dtype: torch.dtype, device, seed: int = 0):
    """A zero-argument callable computing A @ B (n x n, ``dtype``) into a preallocated output; inputs made here, once."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype, device=device)

    def run():
        return torch.matmul(a, b, out=out)

    return run


def scaled_ratio(ratio: dict, factor: float) -> dict:
    """A round-robin ratio dict (experiments/timing/roundrobin.py ``ratio``) with every per-round ratio times
    ``factor`` (F_attn / F_gemm); counts stay."""
    out = dict(ratio)
    for k in ("value", "p20", "p80", "min", "max", "value_unthrottled"):
        if out.get(k) is not None:
            out[k] = float(out[k]) * factor
    out["samples"] = [float(s) * factor for s in ratio.get("samples") or []]
    return out
