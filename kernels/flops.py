"""Attention FLOPs: the one count every timing row, roofline bound and benchmark uses (DESIGN.md convention 6).

Forward = 2 matmuls over the attended (query, key) pairs: ``2*b*h*pairs*(d + d_v)``, which is
``4*b*h*s_q*avg_s_k*d`` when d_v = d (causal halves it); backward = 2.5x forward (five matmuls vs two).
"""
from __future__ import annotations

BWD_FLOP_FACTOR = 2.5
MODES = ("fwd", "bwd", "fwd_bwd")


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """(query, key) pairs attended. Causal is bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q."""
    if not causal:
        return seqlen_q * seqlen_k
    lo = max(seqlen_k - seqlen_q, 0)
    # rows see lo+1, ..., seqlen_k keys (earlier rows, when seqlen_q > seqlen_k, see none): T(seqlen_k) - T(lo)
    return (seqlen_k * (seqlen_k + 1) - lo * (lo + 1)) // 2


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int, hdim_v: int | None = None,
                    causal: bool = False, mode: str = "fwd") -> float:
    """Matmul FLOPs of one attention call in ``mode`` ('fwd', 'bwd' = 2.5x fwd, 'fwd_bwd' = 3.5x fwd)."""
    hdim_v = hdim if hdim_v is None else hdim_v
    fwd = 2.0 * batch * heads * visible_pairs(seqlen_q, seqlen_k, causal) * (hdim + hdim_v)
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return BWD_FLOP_FACTOR * fwd
    if mode == "fwd_bwd":
        return (1.0 + BWD_FLOP_FACTOR) * fwd
    raise ValueError(f"mode={mode!r}: supported modes are {', '.join(repr(m) for m in MODES)}")


def tflops(flops: float, ms: float) -> float:
    """TFLOP/s of ``flops`` done in ``ms`` milliseconds (NaN for a non-positive time)."""
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")
