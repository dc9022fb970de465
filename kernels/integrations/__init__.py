"""Glue between fa4lab's attention and model code written for other libraries.

* ``gqa``  -- grouped-query K/V for ``kernels.attention``: the one place that expands K/V heads until the kernels
  take fewer K/V heads natively (issue 12.1). Plain torch, no extra dependency.
* ``hf``   -- ``register()`` adds ``"fa4lab"`` to transformers' ``AttentionInterface`` (transformers is imported
  only when that module is).
"""
from .gqa import NATIVE_GQA, kv_for_kernel

__all__ = ["NATIVE_GQA", "kv_for_kernel"]
