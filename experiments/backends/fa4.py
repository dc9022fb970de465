"""`fa4` backend: our CuTe DSL kernels through kernels.attention (CUDA, sm_90a).

``forward_into`` writes caller-allocated out / lse buffers (kernels.interface.attention_forward), so the
check can poison them with NaN. Unavailable, with the reason, when there is no CUDA device, the GPU is not
sm90, or the CuTe DSL (nvidia-cutlass-dsl) is not importable. No probe launch: a probe would compile a kernel
before the job times its first call, and first_call_s would no longer include the compile.

Takes GQA (K/V with fewer heads, no repeat), sliding windows (``window_size``) and packed variable-length batches
(kernels.attention_varlen, cu_seqlens trusted: ``check_seqlens=False``, no host sync in the timed call). Backward
combinations the kernels refuse (two_cta=True with a window or varlen; the varlen backward beyond head dims 64 / 128)
raise NotImplementedError from ``backward_fn`` with the kernels' reason: a skip row for the bwd mode.
"""
from __future__ import annotations

from .base import Backend, cuda_arch, first_line, need_cuda


def _window(window_size) -> tuple[int, int]:
    return tuple(window_size) if window_size is not None else (-1, -1)


class FA4Backend(Backend):
    takes_out = True
    config_arch = "sm90"  # kernels.interface resolves every config for sm_90a
    features = frozenset({"gqa", "window", "varlen"})

    def _available(self):
        ok, why = need_cuda(self.name)
        if not ok:
            return ok, why
        major, minor = cuda_arch()
        if major != 9:
            return False, f"{self.name}: sm{major}{minor} is not supported; our kernels run on sm90 (Hopper)"
        try:
            import cutlass  # noqa: F401
        except ImportError as e:
            return False, f"{self.name}: nvidia-cutlass-dsl is not importable ({first_line(e)}); pip install nvidia-cutlass-dsl"
        return True, ""

    def _supports(self, shape, cfg):
        from kernels.validate import SUPPORTED_HDIM_PAIRS

        if (shape.hdim, shape.hdim_v) not in SUPPORTED_HDIM_PAIRS:
            return False, (f"{self.name}: (hdim, hdim_v) = ({shape.hdim}, {shape.hdim_v}) is not supported; "
                           f"supported: {list(SUPPORTED_HDIM_PAIRS)}")
        return True, ""

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        import kernels

        ws = _window(window_size)
        if varlen is not None:
            return kernels.attention_varlen(q, k, v, varlen.cu_seqlens, varlen.cu_seqlens, varlen.max_seqlen,
                                            varlen.max_seqlen, causal=bool(causal), softmax_scale=scale, config=cfg,
                                            return_lse=True, window_size=ws, check_seqlens=False)
        return kernels.attention(q, k, v, causal=bool(causal), softmax_scale=scale, config=cfg, return_lse=True,
                                 window_size=ws)

    def forward_into(self, q, k, v, causal, scale, cfg, out, lse, window_size=None, varlen=None):
        import math

        from kernels.interface import attention_forward, resolve_config
        from kernels.validate import (canonical_window, check_cluster, check_devices, check_persistent_varlen,
                                      check_qkv, check_scale)

        check_scale(scale)
        causal, left, right = canonical_window(bool(causal), _window(window_size))
        if varlen is not None:
            from kernels.interface import _check_arch
            from kernels.varlen import check_varlen_qkv, varlen_forward

            check_varlen_qkv(q, k, v)
            check_persistent_varlen(cfg)
            check_cluster(cfg, causal, left, right, varlen=True)
            check_devices(q, k, v, need_cuda=True)
            _check_arch(q.device)
            d = q.shape[-1]
            scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
            cu = varlen.cu_seqlens.to(q.device)
            return varlen_forward(q, k, v, cu, cu, varlen.max_seqlen, causal, scale, resolve_config(cfg, d, causal),
                                  out=out, lse=lse, window_left=left, window_right=right)
        check_qkv(q, k, v, need_cuda=True, gqa=True)
        d = q.shape[-1]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
        return attention_forward(q, k, v, causal, scale, resolve_config(cfg, d, causal), out=out, lse=lse,
                                 window_left=left, window_right=right)

    def backward_fn(self, q, k, v, causal, scale, cfg=None, **features):
        self._check_backward(q, v, causal, cfg, **features)
        return super().backward_fn(q, k, v, causal, scale, cfg, **features)

    def _check_backward(self, q, v, causal, cfg, window_size=None, varlen=None):
        """NotImplementedError (a skip row) for a backward the kernels refuse before launching anything."""
        from kernels import ConfigError

        windowed = _window(window_size) != (-1, -1)
        if cfg is not None and cfg.two_cta is True and (windowed or varlen is not None):
            what = "a sliding window" if windowed else "varlen"
            raise NotImplementedError(f"{self.name}: two_cta=True with {what}: the sm90 backward's 2-CTA mode does not "
                                      "take it (kernels/sm90/backward.py)")
        if varlen is not None:
            from kernels.interface import resolve_config
            from kernels.varlen import check_varlen_backward

            d, dv = q.shape[-1], v.shape[-1]
            try:
                check_varlen_backward(resolve_config(cfg, d, bool(causal)), d, dv)
            except ConfigError as e:
                raise NotImplementedError(f"{self.name}: {first_line(e)}") from e
