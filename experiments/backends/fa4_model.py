"""`fa4_model` backend: the FA4 algorithm modelled tile by tile in plain PyTorch (kernels.reference.attention_model).

Honours every AttnConfig switch it models (rescale threshold tau, exp2 emulation share, tiles); runs on CPU
and GPU; differentiable. The model's counters (rescales done/skipped, exp2 share) of the last forward are
kept in ``last_stats`` (None after a packed batch, whose sequences are modelled one at a time). Takes GQA (K/V
heads repeated) and packed variable-length batches (one sequence at a time); not sliding windows, which the tile
model does not have (a skip row says so).
"""
from __future__ import annotations

from ._features import dense_or_packed
from ._memory import score_matrix_fits
from .base import Backend


class FA4ModelBackend(Backend):
    cpu_capable = True
    config_arch = "sm90"  # kernels.reference.attention_model's default arch
    features = frozenset({"gqa", "varlen"})
    feature_notes = {"window": "kernels.reference.attention_model (the tile model) has no sliding window"}

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

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        from kernels.reference import attention_model

        if window_size is not None and tuple(window_size) != (-1, -1):
            raise NotImplementedError(f"{self.name}: {self.feature_notes['window']}")
        stats = []

        def one(q, k, v):
            out, lse, st = attention_model(q, k, v, causal=causal, softmax_scale=scale, config=cfg, return_lse=True,
                                           return_stats=True)
            stats.append(st)
            return out, lse

        out, lse = dense_or_packed(one, q, k, v, varlen)
        self.last_stats = dict(stats[0]) if varlen is None and stats and stats[0] is not None else None
        return out, lse
