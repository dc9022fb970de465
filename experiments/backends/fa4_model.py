"""`fa4_model` backend: the FA4 algorithm modelled tile by tile in plain PyTorch (kernels.reference.attention_model).

Honours every AttnConfig switch it models (rescale threshold tau, exp2 emulation share, tiles); runs on CPU
and GPU; differentiable. The model's counters (rescales done/skipped, exp2 share) of the last forward are
kept in ``last_stats``.
"""
from __future__ import annotations

from ._memory import score_matrix_fits
from .base import Backend


class FA4ModelBackend(Backend):
    cpu_capable = True
    config_arch = "sm90"  # kernels.reference.attention_model's default arch

    def __init__(self):
        self.last_stats: dict | None = None

    def _available(self):
        try:
            from kernels.reference import attention_model  # noqa: F401
        except ImportError as e:
            return False, f"{self.name}: kernels.reference.attention_model is missing: {e}"
        return True, ""

    def _supports(self, shape, cfg):
        return score_matrix_fits(shape, 4, self.default_device())

    def forward(self, q, k, v, causal, scale, cfg=None):
        from kernels.reference import attention_model

        out, lse, stats = attention_model(q, k, v, causal=causal, softmax_scale=scale, config=cfg,
                                          return_lse=True, return_stats=True)
        self.last_stats = dict(stats) if stats is not None else None
        return out, lse
