"""Plain-PyTorch attention for the GPU tests: the fp64 reference and x_pt of the DESIGN.md rule (the same math at the
inputs' dtype), (b, s, h, d) layout, bottom-right causal; K/V with fewer heads (GQA) are repeated to q's heads."""
from __future__ import annotations

import torch


def attention_at_dtype(q, k, v, causal, scale):
    """(out, lse): softmax(q k^T * scale) v at the inputs' dtype; lse (b, h, s_q) natural log, fp32 unless fp64."""
    k, v = (t.repeat_interleave(q.shape[2] // t.shape[2], dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, dim=-1)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def grads_at_dtype(q, k, v, do, causal, scale, dtype):
    """(out, dq, dk, dv) by autograd at ``dtype``; dk / dv have K/V's shape (autograd sums repeated heads)."""
    qq, kk, vv = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    out, _ = attention_at_dtype(qq, kk, vv, causal, scale)
    out.backward(do.to(dtype))
    return out.detach(), qq.grad, kk.grad, vv.grad
