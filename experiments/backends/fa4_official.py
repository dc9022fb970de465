"""`fa4_official` backend: the official FlashAttention-4 (pip package flash-attn-4, module flash_attn.cute).

``flash_attn_func(q, k, v, softmax_scale=, causal=, deterministic=, return_lse=True)`` returns (out, lse) and
is differentiable; its causal mask is bottom-right aligned. It runs on Hopper (sm90) and Blackwell
(sm100/sm103). Its deterministic backward is selected by AttnConfig.deterministic when a config is given,
or by the ``fa4_official_det`` registration.

GQA: K/V with fewer heads, natively. A sliding window is passed as ``window_size=(left, right)`` with None for an
unbounded side (flash_attn.cute's convention; the harness's -1 maps to None); with it, causal=True makes the right
bound 0 there too. Packed variable-length batches go through ``flash_attn_varlen_func(q, k, v, cu_seqlens_q=,
cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=, ...)`` (out (total, h, d_v), lse (h, total)). Signatures as in
flash_attn/cute/interface.py of flash-attn-4 (keywords only, so positional changes between betas do not matter).
"""
from __future__ import annotations

from .base import Backend, cuda_arch, first_line, need_cuda

SUPPORTED_MAJORS = {9: "sm90", 10: "sm100"}


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("flash-attn-4", "flash_attn_4"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def _head_dims_ok(major: int, d: int, dv: int) -> bool:
    """What flash-attn-4 4.0.0b36 accepts (interface._validate_head_dims), alignment 8."""
    if d % 8 or dv % 8:
        return False
    if major == 9:
        return 8 <= d <= 256 and 8 <= dv <= 256
    return (d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))


class FA4OfficialBackend(Backend):
    """``deterministic=True`` (registered as fa4_official_det) always uses the deterministic backward."""

    features = frozenset({"gqa", "window", "varlen"})

    def __init__(self, deterministic: bool = False):
        self._func = None
        self._varlen_func = None
        self.deterministic = deterministic

    def _import(self):
        if self._func is None:
            from flash_attn.cute import flash_attn_func

            self._func = flash_attn_func
        return self._func

    def _available(self):
        ok, why = need_cuda(self.name)
        if not ok:
            return ok, why
        try:
            self._import()
        except ImportError as e:
            return False, f"{self.name}: flash-attn-4 is not installed (pip install flash-attn-4): {first_line(e)}"
        major, minor = cuda_arch()
        if major not in SUPPORTED_MAJORS:
            return False, f"{self.name}: sm{major}{minor} is not supported; flash-attn-4 runs on sm90 and sm100"
        return True, ""

    def _supports(self, shape, cfg):
        arch = cuda_arch()
        major = arch[0] if arch else 9
        if not _head_dims_ok(major, shape.hdim, shape.hdim_v):
            return False, (f"{self.name}: (hdim, hdim_v) = ({shape.hdim}, {shape.hdim_v}) is not supported on "
                           f"{SUPPORTED_MAJORS.get(major, major)}")
        return True, ""

    def _import_varlen(self):
        if self._varlen_func is None:
            from flash_attn.cute import flash_attn_varlen_func

            self._varlen_func = flash_attn_varlen_func
        return self._varlen_func

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        deterministic = self.deterministic or bool(getattr(cfg, "deterministic", False))
        kw = dict(softmax_scale=scale, causal=bool(causal), deterministic=deterministic, return_lse=True)
        if window_size is not None and tuple(window_size) != (-1, -1):  # plain calls pass exactly what they did
            kw["window_size"] = official_window(window_size)
        if varlen is not None:
            res = self._import_varlen()(q, k, v, cu_seqlens_q=varlen.cu_seqlens, cu_seqlens_k=varlen.cu_seqlens,
                                        max_seqlen_q=varlen.max_seqlen, max_seqlen_k=varlen.max_seqlen, **kw)
        else:
            res = self._import()(q, k, v, **kw)
        if isinstance(res, tuple):
            out, lse = res[0], res[1]
        else:
            out, lse = res, None
        return out, (lse.float() if lse is not None else None)


def official_window(window_size) -> tuple[int | None, int | None]:
    """The harness's (left, right) window, -1 = unbounded, as flash_attn.cute takes it: None = unbounded."""
    return tuple(None if int(w) < 0 else int(w) for w in window_size)


def deterministic() -> FA4OfficialBackend:
    return FA4OfficialBackend(deterministic=True)
