"""`sdpa_cudnn`, `sdpa_flash`, `sdpa_efficient`: torch.nn.functional.scaled_dot_product_attention pinned to one
of its CUDA kernels with torch.nn.attention.sdpa_kernel.

SDPA takes (batch, heads, seqlen, head_dim), so inputs are transposed (views, no copy). Its ``is_causal`` is
aligned top-left; for causal with seqlen_q != seqlen_k the mask must be bottom-right as in FlashAttention,
which ``torch.nn.attention.bias.causal_lower_right`` gives on the flash and efficient kernels; the cuDNN path
would have to materialise a dense mask, so that case is reported unsupported. SDPA returns no LSE.
When SDPA finds no kernel of the pinned kind for an input it raises NotImplementedError (a skip row).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Backend, cuda_arch, need_cuda

_KINDS = ("cudnn", "flash", "efficient", "math")


def _sdp_backend(kind: str):
    from torch.nn.attention import SDPBackend

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[kind]


class SdpaBackend(Backend):
    """``kind`` in cudnn / flash / efficient (the registered CUDA peers) or math (CPU-capable, for tests)."""

    def __init__(self, kind: str):
        if kind not in _KINDS:
            raise ValueError(f"kind={kind!r}: supported SDPA kernels are {_KINDS}")
        self.kind = kind
        self.cpu_capable = kind == "math"

    def _available(self):
        if self.kind == "math":
            return True, ""
        ok, why = need_cuda(self.name)
        if not ok:
            return ok, why
        major, minor = cuda_arch()
        if major < 8:
            return False, f"{self.name}: sm{major}{minor} is not supported; SDPA's {self.kind} kernel needs sm80+"
        try:
            _sdp_backend(self.kind)
        except AttributeError:
            return False, f"{self.name}: torch {torch.__version__} has no SDPA {self.kind} backend"
        if self.kind == "cudnn" and not torch.backends.cudnn.is_available():
            return False, f"{self.name}: cuDNN is not available in this torch build"
        return True, ""

    def _supports(self, shape, cfg):
        if self.kind == "cudnn" and shape.causal and shape.seqlen_q != shape.seqlen_k:
            return False, (f"{self.name}: causal with seqlen_q != seqlen_k needs a bottom-right mask, which "
                           "SDPA's cuDNN path only gets as a dense materialised mask (not a fair peer)")
        if shape.causal and shape.seqlen_q > shape.seqlen_k:
            return False, (f"{self.name}: causal with seqlen_q > seqlen_k leaves rows with no visible key, which "
                           "SDPA's lower-right causal bias fills with NaN (FlashAttention writes 0)")
        if self.kind == "flash" and shape.hdim != shape.hdim_v:
            return False, f"{self.name}: SDPA's flash kernel needs hdim == hdim_v, got ({shape.hdim}, {shape.hdim_v})"
        if self.kind == "flash" and shape.hdim > 256:
            return False, f"{self.name}: SDPA's flash kernel supports head_dim <= 256, got {shape.hdim}"
        return True, ""

    def forward(self, q, k, v, causal, scale, cfg=None):
        from torch.nn.attention import sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sq, sk = q.shape[1], k.shape[1]
        try:
            with sdpa_kernel([_sdp_backend(self.kind)]):
                if causal and sq != sk:
                    mask = causal_lower_right(sq, sk)
                    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
                else:
                    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), scale=scale)
        except RuntimeError as e:
            if "no available kernel" in str(e).lower():  # SDPA's own "unsupported input": a skip, not a failure
                raise NotImplementedError(f"{self.name}: SDPA has no {self.kind} kernel for this input "
                                          f"(dtype {q.dtype}, head dims {q.shape[-1]}/{v.shape[-1]})") from e
            raise
        return out.transpose(1, 2), None


def cudnn() -> SdpaBackend:
    return SdpaBackend("cudnn")


def flash() -> SdpaBackend:
    return SdpaBackend("flash")


def efficient() -> SdpaBackend:
    return SdpaBackend("efficient")
