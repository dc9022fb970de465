"""GPU correctness of AttnConfig.bwd_dq_stages=2 at hd64 (two dQ staging buffers in a struct of exactly 227 KB:
kernels/sm90/bwd.py _set_dq_stages): the DESIGN.md rule (tests/test_bwd_gpu.py _run_case: fp64 reference,
NaN-poisoned outputs), bf16 / fp16, causal and not, odd lengths, seqlen_q != seqlen_k, deterministic with one and two
writers; and 20 calls interleaved with the one-buffer kernel (GQA 4:1): dK / dV bitwise, deterministic dQ bitwise
too (the buffers change where a tile waits, not the order of its fp32 adds)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _cfg, _run_case  # noqa: E402
from test_bwd_stream_post_gpu import SHAPES, interleaved_against  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [(False, {}), (True, {}), (False, dict(deterministic=True)), (True, dict(deterministic=True)),
         (False, dict(deterministic=True, bwd_det_two_writers=True))]
IDS = ["nc", "c", "nc_det", "c_det", "nc_det_2w"]


@pytest.mark.parametrize("causal,extra", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_dq_stages2(causal, extra, dtype):
    cfg = _cfg(bwd_dq_stages=2, **extra)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        if not (causal and sq > sk):
            _run_case(b, sq, sk, h, 64, causal, dtype, cfg, seed=120 + i)


@pytest.mark.parametrize("causal,extra", CASES, ids=IDS)
def test_bwd_dq_stages2_against_one(causal, extra):
    # bwd_dq_stages=1 explicitly: hd64 non-causal's deterministic default has two buffers (DEFAULTS' det pair)
    interleaved_against(64, causal, _cfg(bwd_dq_stages=1, **extra), _cfg(bwd_dq_stages=2, **extra), 2048, 16,
                        exact_dq=bool(extra.get("deterministic")))
