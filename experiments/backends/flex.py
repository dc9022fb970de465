"""`flex` backend: torch.compile'd FlexAttention with a bottom-right causal block mask (CUDA only).

Compiled functions and block masks are cached per shape signature; dynamo's recompile limit is raised so
a sweep over many shapes keeps compiling instead of silently falling back to eager after 8 shapes.

GQA: ``enable_gqa=True`` (K/V with fewer heads). A sliding window is a mask_mod (block mask: blocks outside the
window are skipped). A packed variable-length batch runs as one sequence of all the tokens (batch 1) under a document
mask: query and key in the same sequence, causal / window within it; out (total, h, d_v), lse (h, total).
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


def window_mask_mod(offset: int, causal: bool, window_size):
    """mask_mod of flash-attn's sliding window, bottom-right aligned: query i sees keys i + offset - left ..
    i + offset + right (-1 = unbounded; causal: right 0); None when nothing is masked."""
    left, right = (tuple(window_size) if window_size is not None else (-1, -1))
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        diag = q_idx + offset
        if left >= 0 and right >= 0:
            return (kv_idx >= diag - left) & (kv_idx <= diag + right)
        if left >= 0:
            return kv_idx >= diag - left
        return kv_idx <= diag + right

    return mask_mod


def document_mask_mod(seqlens, causal: bool, window_size, device):
    """mask_mod over packed sequences: same sequence, then causal / window on the positions within it."""
    lens = torch.tensor(list(seqlens), device=device, dtype=torch.int64)
    doc = torch.repeat_interleave(torch.arange(len(seqlens), device=device), lens)
    start = torch.cumsum(lens, 0) - lens
    pos = torch.arange(int(lens.sum()), device=device) - start[doc]
    inner = window_mask_mod(0, causal, window_size)

    def mask_mod(b, h, q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return same if inner is None else same & inner(b, h, pos[q_idx], pos[kv_idx])

    return mask_mod


class FlexBackend(Backend):
    """``compile=False`` runs FlexAttention eagerly (slow reference path; what the CPU tests use)."""

    features = frozenset({"gqa", "window", "varlen"})

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

    def _block_mask(self, sq: int, sk: int, device, causal: bool = True, window_size=None, seqlens=None):
        ws = tuple(window_size) if window_size is not None else (-1, -1)
        key = (sq, sk, str(device)) if (causal and ws == (-1, -1) and seqlens is None) else \
            (sq, sk, str(device), bool(causal), ws, seqlens)  # the plain causal key is the one it always was
        if key not in self._masks:
            from torch.nn.attention.flex_attention import create_block_mask

            if seqlens is not None:
                mod = document_mask_mod(seqlens, causal, ws, device)
            elif ws != (-1, -1):
                mod = window_mask_mod(sk - sq, causal, ws)
            else:
                mod = bottom_right_causal(sk - sq)
            self._masks[key] = create_block_mask(mod, B=None, H=None, Q_LEN=sq, KV_LEN=sk, device=device)
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

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        ws = tuple(window_size) if window_size is not None else (-1, -1)
        packed = varlen is not None
        if packed:  # (total, h, d) -> one sequence of all the tokens, batch 1
            q, k, v = (t.unsqueeze(0) for t in (q, k, v))
        sq, sk = q.shape[1], k.shape[1]
        gqa = k.shape[2] != q.shape[2]
        sig = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, bool(causal), str(q.device))
        if ws != (-1, -1) or packed:  # plain shapes keep the signature they always had
            sig += (ws, varlen.seqlens if packed else None)
        if packed:
            mask = self._block_mask(sq, sk, q.device, bool(causal), ws, varlen.seqlens)
        elif ws != (-1, -1):
            mask = self._block_mask(sq, sk, q.device, bool(causal), ws)
        else:
            mask = self._block_mask(sq, sk, q.device) if causal else None
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        extra = {"enable_gqa": True} if gqa else {}
        try:
            from torch.nn.attention.flex_attention import AuxRequest
        except ImportError:  # older torch: return_lse=True
            out, lse = self._fn(sig)(qt, kt, vt, block_mask=mask, scale=scale, return_lse=True, **extra)
        else:
            out, aux = self._fn(sig)(qt, kt, vt, block_mask=mask, scale=scale, return_aux=AuxRequest(lse=True),
                                     **extra)
            lse = aux.lse
        out, lse = out.transpose(1, 2), lse.float()
        if packed:
            return out[0], lse[0]
        return out, lse
