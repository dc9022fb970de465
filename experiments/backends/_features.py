"""GQA, sliding window and packed variable-length batches for the plain-math backends (the exact reference, the FA4
model) and the correctness check: K/V heads repeated for their Q heads (autograd sums the gradients back), packed
batches computed one sequence at a time (each a batch of one), the window passed on to kernels.reference.
"""
from __future__ import annotations

import torch


def expand_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """k, v with each K/V head repeated for its group of Q heads (Q head i reads K/V head i // group); heads are
    dim -2 in both the (b, s, h, d) and the packed (total, h, d) layouts. Unchanged without GQA."""
    hq, hk = q.shape[-2], k.shape[-2]
    if hq == hk:
        return k, v
    if hk < 1 or hq % hk or v.shape[-2] != hk:
        raise ValueError(f"heads: K/V heads ({hk}, {v.shape[-2]}) must be one count dividing the Q heads ({hq})")
    g = hq // hk
    return k.repeat_interleave(g, dim=-2), v.repeat_interleave(g, dim=-2)


def dense_or_packed(fn, q, k, v, varlen=None):
    """``fn(q, k, v) -> (out, lse | None)`` on (b, s, h, d) tensors with as many K/V as Q heads, applied to the whole
    batch, or, with ``varlen`` (experiments.shapes.Varlen), to each packed sequence as a batch of one: out
    (total, h, d_v), lse (h, total)."""
    k, v = expand_kv(q, k, v)
    if varlen is None:
        return fn(q, k, v)
    outs, lses = [], []
    for a, b in varlen.bounds():
        o, lse = fn(q[None, a:b], k[None, a:b], v[None, a:b])
        outs.append(o[0])
        lses.append(None if lse is None else lse[0])
    lse = None if any(x is None for x in lses) else torch.cat(lses, dim=-1)
    return torch.cat(outs, dim=0), lse


def reference_attention(q, k, v, causal, scale, dtype=torch.float64, window_size=None, varlen=None, naive=False):
    """kernels.reference.attention_exact at ``dtype`` (or attention_naive at the input dtype with ``naive``) with GQA,
    the sliding window and a packed batch honoured; returns (out, lse) as the exact / naive functions do (out at
    ``dtype`` / the input dtype), packed as flash_attn_varlen_func for varlen."""
    from kernels.reference import attention_exact, attention_naive

    ws = tuple(window_size) if window_size is not None else (-1, -1)

    def one(q, k, v):
        if naive:
            return attention_naive(q, k, v, causal, scale, return_lse=True, window_size=ws)
        return attention_exact(q, k, v, causal, scale, dtype=dtype, return_lse=True, window_size=ws)

    return dense_or_packed(one, q, k, v, varlen)
