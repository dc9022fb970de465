"""`flex` backend: torch.compile'd FlexAttention with a bottom-right causal block mask (CUDA only).

Compiled functions and block masks are cached per shape signature; dynamo's recompile limit is raised so
a sweep over many shapes keeps compiling instead of silently falling back to eager after 8 shapes.
"""
from __future__ import annotations

import torch

from .base import Backend, need_cuda

RECOMPILE_LIMIT = 512  # distinct (shape, dtype, mode) specialisations before dynamo gives up


def _raise_recompile_limit(n: int = RECOMPILE_LIMIT) -> None:
    import torch._dynamo.config as dc

    for name in ("recompile_limit", "cache_size_limit"):  # renamed across torch versions
        if hasattr(dc, name) and getattr(dc, name) < n:
            setattr(dc, name, n)
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dc, name) and getattr(dc, name) < 4 * n:
            setattr(dc, name, 4 * n)


def bottom_right_causal(offset: int):
    """mask_mod: query i sees key j when j <= i + offset, offset = seqlen_k - seqlen_q."""

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return mask_mod


class FlexBackend(Backend):
    """``compile=False`` runs FlexAttention eagerly (slow reference path; what the CPU tests use)."""

    def __init__(self, compile: bool = True):
        self.compile = compile
        self._fns: dict = {}
        self._masks: dict = {}

    def _available(self):
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError:
            return False, f"{self.name}: torch {torch.__version__} has no FlexAttention"
        if not self.compile:
            return True, ""
        return need_cuda(self.name)

    def _supports(self, shape, cfg):
        if shape.hdim < 16 or shape.hdim_v < 16:
            return False, f"{self.name}: FlexAttention needs head dims >= 16, got ({shape.hdim}, {shape.hdim_v})"
        return True, ""

    def _block_mask(self, sq: int, sk: int, device):
        key = (sq, sk, str(device))
        if key not in self._masks:
            from torch.nn.attention.flex_attention import create_block_mask

            self._masks[key] = create_block_mask(bottom_right_causal(sk - sq), B=None, H=None, Q_LEN=sq,
                                                 KV_LEN=sk, device=device)
        return self._masks[key]

    def _fn(self, sig):
        if sig not in self._fns:
            from torch.nn.attention.flex_attention import flex_attention

            if self.compile:
                _raise_recompile_limit()
                self._fns[sig] = torch.compile(flex_attention, dynamic=False)
            else:
                self._fns[sig] = flex_attention
        return self._fns[sig]

    def forward(self, q, k, v, causal, scale, cfg=None):
        sq, sk = q.shape[1], k.shape[1]
        sig = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, bool(causal), str(q.device))
        mask = self._block_mask(sq, sk, q.device) if causal else None
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        try:
            from torch.nn.attention.flex_attention import AuxRequest
        except ImportError:  # older torch: return_lse=True
            out, lse = self._fn(sig)(qt, kt, vt, block_mask=mask, scale=scale, return_lse=True)
        else:
            out, aux = self._fn(sig)(qt, kt, vt, block_mask=mask, scale=scale, return_aux=AuxRequest(lse=True))
            lse = aux.lse
        return out.transpose(1, 2), lse.float()
