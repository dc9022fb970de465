"""Attention FLOPs: the one count every timing row, roofline bound and benchmark uses (DESIGN.md convention 6).

Forward = 2 matmuls over the attended (query, key) pairs: ``2*b*h*pairs*(d + d_v)``, which is
``4*b*h*s_q*avg_s_k*d`` when d_v = d (causal halves it); backward = 2.5x forward (five matmuls vs two).
The pairs are counted by ``attended_pairs`` (causal, sliding window, s_q != s_k; a packed batch sums it per sequence).
"""
from __future__ import annotations

BWD_FLOP_FACTOR = 2.5
MODES = ("fwd", "bwd", "fwd_bwd")


def _sum_range(a: int, b: int) -> int:
    """a + (a + 1) + ... + b (0 when b < a)."""
    return (a + b) * (b - a + 1) // 2 if b >= a else 0


def attended_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False, window: tuple[int, int] | None = None) -> int:
    """(query, key) pairs one sequence attends, as the kernels and kernels.reference.window_mask mask them (flash-attn
    semantics, bottom-right aligned): query i sees keys max(0, i + s_k - s_q - left) .. min(s_k - 1, i + s_k - s_q +
    right), -1 = unbounded on that side; causal sets right to 0; ``window`` None is (-1, -1). Rows whose range is empty
    (s_q > s_k under causal, or a right bound that ends before key 0) see none. Closed form, integers only."""
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if left < -1 or right < -1:
        raise ValueError(f"window={window!r}: each bound must be >= -1 (-1 = unbounded on that side)")
    if causal:
        right = 0
    unbounded = seqlen_q + seqlen_k  # farther than any key
    lo_off = left if left >= 0 else unbounded
    hi_off = right if right >= 0 else unbounded
    last = seqlen_k - 1
    # row with diagonal d = i + s_k - s_q sees min(last, d + hi_off) - max(0, d - lo_off) + 1 keys; that range is
    # empty only when d + hi_off < 0 (d - lo_off <= last always), so sum over d in [a, last] with a >= -hi_off
    a = max(seqlen_k - seqlen_q, -hi_off)
    if a > last:
        return 0
    m = min(last, last - hi_off)  # d <= m: the range ends at d + hi_off, past it at the last key
    hi_sum = (_sum_range(a, m) + hi_off * (m - a + 1) if m >= a else 0) + last * (last - max(m, a - 1))
    s = max(a, lo_off)  # d >= s: the range starts at d - lo_off, before it at key 0
    lo_sum = _sum_range(s, last) - lo_off * (last - s + 1) if s <= last else 0
    return hi_sum - lo_sum + (last - a + 1)


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """``attended_pairs`` without a window: s_q * s_k, or causal (query i sees keys j <= i + seqlen_k - seqlen_q)."""
    return attended_pairs(seqlen_q, seqlen_k, causal)


def pair_flops(pairs: int, heads: int, hdim: int, hdim_v: int | None = None, mode: str = "fwd") -> float:
    """Matmul FLOPs of ``pairs`` attended (query, key) pairs (summed over the batch) in each of ``heads`` heads, in
    ``mode`` ('fwd', 'bwd' = 2.5x fwd, 'fwd_bwd' = 3.5x fwd). K/V heads (GQA) do not change the count."""
    hdim_v = hdim if hdim_v is None else hdim_v
    fwd = float(2 * heads * pairs * (hdim + hdim_v))
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return BWD_FLOP_FACTOR * fwd
    if mode == "fwd_bwd":
        return (1.0 + BWD_FLOP_FACTOR) * fwd
    raise ValueError(f"mode={mode!r}: supported modes are {', '.join(repr(m) for m in MODES)}")


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int, hdim_v: int | None = None,
                    causal: bool = False, mode: str = "fwd", window: tuple[int, int] | None = None) -> float:
    """Matmul FLOPs of one attention call in ``mode`` ('fwd', 'bwd' = 2.5x fwd, 'fwd_bwd' = 3.5x fwd): ``batch``
    sequences of (seqlen_q, seqlen_k), causal and / or a sliding ``window`` (left, right) as ``attended_pairs``."""
    return pair_flops(batch * attended_pairs(seqlen_q, seqlen_k, causal, window), heads, hdim, hdim_v, mode)


def tflops(flops: float, ms: float) -> float:
    """TFLOP/s of ``flops`` done in ``ms`` milliseconds (NaN for a non-positive time)."""
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")
