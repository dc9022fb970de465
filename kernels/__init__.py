"""fa4lab kernels: FlashAttention-4-style attention in the CuTe DSL, every FA4 idea behind an AttnConfig switch.

Public API: ``attention(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False)``
with q, k, v laid out (batch, seqlen, heads, head_dim) as flash_attn_func takes them.
"""
from .config import DEFAULTS, AttnConfig, ConfigError
from .validate import InputError


def attention(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False):
    """Attention through our CuTe DSL kernels (CUDA, sm_90a): the torch.library op ``fa4lab::fwd`` (kernels/ops.py),
    differentiable (its backward is ``fa4lab::bwd``) and traceable by ``torch.compile(fullgraph=True)``."""
    from .ops import attention as _attention

    return _attention(q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, return_lse=return_lse)


__all__ = ["attention", "AttnConfig", "ConfigError", "InputError", "DEFAULTS"]
