"""Grouped-query attention (GQA / MQA) in front of ``kernels.attention``: the single switch to native GQA.

``kernels.attention`` does not take fewer K/V heads than Q heads yet (issue 12.1), so ``kv_for_kernel`` repeats each
K/V head ``heads_q // heads_kv`` times along the head axis (``repeat_interleave``: K/V head j serves Q heads
j*g .. j*g+g-1, the FlashAttention and transformers ``repeat_kv`` convention). That costs a copy of K and V per call
and their gradients are reduced by autograd over the group. When the kernels take grouped K/V natively, set
``NATIVE_GQA = True``: every caller (the transformers glue in ``hf.py``, the ``e2e_llama`` experiment) then passes
K/V through unexpanded.
"""
from __future__ import annotations

import torch

from ..validate import InputError

NATIVE_GQA = False  # flip when kernels.attention accepts k/v with heads_kv dividing heads_q (issue 12.1)


def kv_for_kernel(k: torch.Tensor, v: torch.Tensor, heads_q: int, native: bool | None = None):
    """(k, v) laid out (batch, seqlen, heads_kv, head_dim) as ``kernels.attention`` takes them for ``heads_q`` query
    heads: unchanged when ``heads_kv == heads_q`` or with native GQA, else each K/V head repeated ``heads_q //
    heads_kv`` times. ``native`` overrides ``NATIVE_GQA`` (None: the module switch)."""
    hk = k.shape[2]
    if v.shape[2] != hk:
        raise InputError(f"heads: k and v must share the number of heads, got {hk} and {v.shape[2]}")
    if hk < 1 or heads_q % hk:
        raise InputError(f"heads: the K/V heads ({hk}) must divide the Q heads ({heads_q}) for grouped-query attention")
    group = heads_q // hk
    if group == 1 or (NATIVE_GQA if native is None else native):
        return k, v
    return k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
