"""Torch boundary of the CuTe DSL kernels: input checks, config resolution, compile cache, autograd."""
from __future__ import annotations

from .config import AttnConfig
from .validate import check_qkv, check_scale


def attention(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False):
    check_qkv(q, k, v, need_cuda=True)
    check_scale(softmax_scale)
    if config is not None and not isinstance(config, AttnConfig):
        raise TypeError(f"config: expected kernels.AttnConfig or None, got {type(config).__name__}")
    raise NotImplementedError("kernels.attention: the sm90 forward kernel is not built yet")
