"""`reference` backend: exact attention math at fp64 (or fp32) via kernels.reference.attention_exact.

Inputs are upcast, the math runs at the reference precision, and the output is rounded once to the input
dtype (the best output that dtype can hold); lse stays fp32. Runs on CPU and GPU. Takes GQA (K/V heads repeated),
sliding windows and packed variable-length batches (one sequence at a time): experiments/backends/_features.py.
"""
from __future__ import annotations

import torch

from ._features import reference_attention
from ._memory import score_matrix_fits
from .base import Backend


class ReferenceBackend(Backend):
    cpu_capable = True
    features = frozenset({"gqa", "window", "varlen"})

    def __init__(self, precision: torch.dtype = torch.float64):
        if precision not in (torch.float32, torch.float64):
            raise ValueError(f"precision={precision}: supported are torch.float32, torch.float64")
        self.precision = precision

    def _available(self):
        try:
            from kernels.reference import attention_exact  # noqa: F401
        except ImportError as e:
            return False, f"{self.name}: kernels.reference.attention_exact is missing: {e}"
        return True, ""

    def _supports(self, shape, cfg):
        return score_matrix_fits(shape, torch.finfo(self.precision).bits // 8, self.default_device())

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        out, lse = reference_attention(q, k, v, causal, scale, dtype=self.precision, window_size=window_size,
                                       varlen=varlen)
        return out.to(q.dtype), lse.float()
