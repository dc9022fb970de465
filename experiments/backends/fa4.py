"""`fa4` backend: our CuTe DSL kernels through kernels.attention (CUDA, sm_90a).

``forward_into`` writes caller-allocated out / lse buffers (kernels.interface.attention_forward), so the
check can poison them with NaN. Unavailable, with the reason, when there is no CUDA device, the GPU is not
sm90, or the CuTe DSL (nvidia-cutlass-dsl) is not importable. No probe launch: a probe would compile a kernel
before the job times its first call, and first_call_s would no longer include the compile.
"""
from __future__ import annotations

from .base import Backend, cuda_arch, first_line, need_cuda


class FA4Backend(Backend):
    takes_out = True
    config_arch = "sm90"  # kernels.interface resolves every config for sm_90a

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

    def forward(self, q, k, v, causal, scale, cfg=None):
        import kernels

        out, lse = kernels.attention(q, k, v, causal=bool(causal), softmax_scale=scale, config=cfg, return_lse=True)
        return out, lse

    def forward_into(self, q, k, v, causal, scale, cfg, out, lse):
        import math

        from kernels.interface import attention_forward, resolve_config
        from kernels.validate import check_qkv, check_scale

        check_qkv(q, k, v, need_cuda=True)
        check_scale(scale)
        d = q.shape[-1]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
        return attention_forward(q, k, v, bool(causal), scale, resolve_config(cfg, d, bool(causal)), out=out, lse=lse)
