"""fa4lab kernels: FlashAttention-4-style attention in the CuTe DSL, every FA4 idea behind an AttnConfig switch.

Public API: ``attention(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False, window_size=(-1, -1),
softcap=0.0)`` with q, k, v laid out (batch, seqlen, heads, head_dim) as flash_attn_func takes them.
``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``: packed variable-length batches.
"""
from .config import DEFAULTS, AttnConfig, ConfigError
from .ops import attention as _attention
from .validate import InputError
from .varlen import attention_varlen


def attention(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False, window_size=(-1, -1),
              softcap=0.0):
    """Attention through our CuTe DSL kernels (CUDA, sm_90a): the torch.library op ``fa4lab::fwd`` (kernels/ops.py),
    differentiable (its backward is ``fa4lab::bwd``) and traceable by ``torch.compile(fullgraph=True)``.

    ``window_size=(left, right)`` (sliding window, -1 = unbounded, FlashAttention semantics, bottom-right aligned;
    causal sets right to 0) and ``softcap`` (scores -> softcap * tanh(scores / softcap)) are differentiable: the backward
    kernels take them too (issue 12.3; GPU tests passed on the H200)."""
    if window_size == (-1, -1) and softcap == 0.0:
        return _attention(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, return_lse=return_lse)
    return _attention(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, return_lse=return_lse,
                      window_size=window_size, softcap=softcap)


__all__ = ["attention", "attention_varlen", "AttnConfig", "ConfigError", "InputError", "DEFAULTS"]
