"""`fa4` backend: our CuTe DSL kernels through kernels.attention (CUDA, sm_90a).

``forward_into`` writes caller-allocated out / lse buffers (kernels.interface.attention_forward), so the
check can poison them with NaN. Unavailable, with the reason, when there is no CUDA device, the GPU is not
sm90, or the kernels raise NotImplementedError (a tiny probe call, made once per process).
"""
from __future__ import annotations

import torch

from .base import Backend, cuda_arch, first_line, need_cuda


class FA4Backend(Backend):
    takes_out = True

    def __init__(self):
        self._probe: tuple[bool, str] | None = None

    def _available(self):
        ok, why = need_cuda(self.name)
        if not ok:
            return ok, why
        major, minor = cuda_arch()
        if major != 9:
            return False, f"{self.name}: sm{major}{minor} is not supported; our kernels run on sm90 (Hopper)"
        if self._probe is None:
            self._probe = self._run_probe()
        return self._probe

    def _run_probe(self) -> tuple[bool, str]:
        import kernels

        q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
        try:
            kernels.attention(q, q, q, causal=False)
        except NotImplementedError as e:
            return False, f"{self.name}: not implemented yet: {first_line(e)}"
        except Exception:  # a real failure is measured (and classified) by the job, not hidden as a skip
            return True, ""
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
