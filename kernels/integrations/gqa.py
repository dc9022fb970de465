"""Grouped-query attention (GQA / MQA) in front of ``kernels.attention``: the single switch to native GQA.

``kernels.attention`` takes K/V with fewer heads than Q natively (issue 12.1: Q head i reads K/V head i // g, dK / dV
summed over each group in the backward), so with ``NATIVE_GQA = True`` (the default) ``kv_for_kernel`` passes K/V
through unexpanded for every caller (the transformers glue in ``hf.py``, the ``e2e_llama`` experiment). With
``NATIVE_GQA = False`` (or ``native=False``, e.g. for a callee without GQA such as the plain-PyTorch reference model)
it repeats each K/V head ``heads_q // heads_kv`` times along the head axis (``repeat_interleave``: K/V head j serves Q
heads j*g .. j*g+g-1, the FlashAttention and transformers ``repeat_kv`` convention), which costs a copy of K and V per
call; autograd then reduces their gradients over the group.
"""
from __future__ import annotations

import torch

from ..validate import InputError

NATIVE_GQA = True  # kernels.attention accepts k/v with heads_kv dividing heads_q (issue 12.1); False: repeat K/V


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
