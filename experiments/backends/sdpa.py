"""`sdpa_cudnn`, `sdpa_flash`, `sdpa_efficient`: torch.nn.functional.scaled_dot_product_attention pinned to one
of its CUDA kernels with torch.nn.attention.sdpa_kernel.

SDPA takes (batch, heads, seqlen, head_dim), so inputs are transposed (views, no copy). Its ``is_causal`` is
aligned top-left; for causal with seqlen_q != seqlen_k the mask must be bottom-right as in FlashAttention,
which ``torch.nn.attention.bias.causal_lower_right`` gives on the flash and efficient kernels; the cuDNN path
would have to materialise a dense mask, so that case is reported unsupported. SDPA returns no LSE.
When SDPA finds no kernel of the pinned kind for an input it raises NotImplementedError (a skip row).

GQA: ``enable_gqa=True`` (torch >= 2.5) when K/V have fewer heads; SDPA then decides whether the pinned kernel takes
it (the flash kernel does; where the kernel does not, "no available kernel" is a skip row). Sliding windows are
skipped: SDPA takes them only as a dense (s_q, s_k) attn_mask, which the fused kernels read in full without skipping
the blocks outside the window (and the flash kernel takes no mask at all), so it would not be the same work.
Packed variable-length batches run as nested jagged tensors (``torch.nested.nested_tensor_from_jagged`` views of the
packed q / k / v over one offsets tensor, min / max sequence lengths given so nothing syncs), the fused kernels'
own variable-length path; ``is_causal`` is per sequence there (top-left = bottom-right, s_q = s_k). Not with GQA
(the jagged path does not broadcast K/V heads): a skip. The math kernel (CPU) takes no causal jagged input: a skip.
The cuDNN kernel is skipped for varlen: on the H200 (results/h200/fwd_reach, bwd_reach, committed in d936955) its
jagged backward left NaN in dQ / dK and it ran 66-150x our time, so it is neither right nor a fused varlen path.
The flash kernel's time includes the nested tensors' host-side dispatch (Python ``__torch_function__``): what a user
of SDPA's varlen API pays, not the kernel alone (on the H200 11x ours forward, 4x backward at 8 documents / 16k).
No per-sequence loop: that would time many small launches, not a kernel.
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

    features = frozenset({"gqa", "varlen"})
    feature_notes = {
        "window": "SDPA takes a window only as a dense (s_q, s_k) attn_mask, which its fused kernels read in full "
                  "without skipping the masked blocks (the flash kernel takes no mask): not the same work",
    }

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
        if shape.heads_kv is not None and shape.varlen is not None:
            return False, (f"{self.name}: GQA with varlen: SDPA's nested jagged path does not broadcast K/V heads "
                           "(enable_gqa is for dense inputs)")
        if self.kind == "cudnn" and shape.varlen is not None:
            return False, (f"{self.name}: varlen through nested jagged tensors: on the H200 cuDNN's jagged backward "
                           "left NaN in dQ / dK and ran 66-150x our time (results/h200/*_reach): not a correct fused "
                           "varlen path")
        if shape.heads_kv is not None and not _has_enable_gqa():
            return False, f"{self.name}: torch {torch.__version__} has no SDPA enable_gqa (GQA needs torch >= 2.5)"
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

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        from torch.nn.attention import sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        if window_size is not None and tuple(window_size) != (-1, -1):
            raise NotImplementedError(f"{self.name}: {self.feature_notes['window']}")
        if varlen is not None:
            return self._forward_jagged(q, k, v, causal, scale, varlen), None
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sq, sk = q.shape[1], k.shape[1]
        gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}  # plain calls pass what they did
        try:
            with sdpa_kernel([_sdp_backend(self.kind)]):
                if causal and sq != sk:
                    mask = causal_lower_right(sq, sk)
                    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, **gqa)
                else:
                    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), scale=scale, **gqa)
        except RuntimeError as e:
            if "no available kernel" in str(e).lower():  # SDPA's own "unsupported input": a skip, not a failure
                heads = f", GQA heads {q.shape[2]}/{k.shape[2]}" if gqa else ""
                raise NotImplementedError(f"{self.name}: SDPA has no {self.kind} kernel for this input "
                                          f"(dtype {q.dtype}, head dims {q.shape[-1]}/{v.shape[-1]}{heads})") from e
            raise
        return out.transpose(1, 2), None

    def _forward_jagged(self, q, k, v, causal, scale, varlen):
        """Packed (total, h, d) q, k, v as nested jagged (batch, h, j, d) views over one offsets tensor; out packed."""
        from torch.nn.attention import sdpa_kernel

        if k.shape[1] != q.shape[1]:
            raise NotImplementedError(f"{self.name}: GQA with varlen: SDPA's nested jagged path does not broadcast "
                                      "K/V heads")
        offsets = varlen.cu_seqlens.to(device=q.device, dtype=torch.int64)
        lo, hi = min(varlen.seqlens), max(varlen.seqlens)

        def jagged(t):
            nt = torch.nested.nested_tensor_from_jagged(t, offsets=offsets, min_seqlen=lo, max_seqlen=hi)
            return nt.transpose(1, 2)

        try:
            with sdpa_kernel([_sdp_backend(self.kind)]):
                out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), is_causal=bool(causal),
                                                     scale=scale)
        except RuntimeError as e:
            msg = str(e).lower()
            if "no available kernel" in msg or "no viable backend" in msg:
                raise NotImplementedError(f"{self.name}: SDPA has no {self.kind} kernel for this nested jagged "
                                          f"(varlen) input (dtype {q.dtype}, head dims {q.shape[-1]}/{v.shape[-1]}"
                                          f"{', causal' if causal else ''})") from e
            raise
        return out.transpose(1, 2).values()


def _has_enable_gqa() -> bool:
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


def cudnn() -> SdpaBackend:
    return SdpaBackend("cudnn")


def flash() -> SdpaBackend:
    return SdpaBackend("flash")


def efficient() -> SdpaBackend:
    return SdpaBackend("efficient")
