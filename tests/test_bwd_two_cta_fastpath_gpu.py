"""GPU checks of FlashBwdSm90's two_cta opt-in switches ``ds_cta_release`` and ``two_cta_dv_first`` (docs/BWD_TWO_CTA.md;
the CPU SASS checks are tests/test_bwd_two_cta_fastpath.py). Neither changes arithmetic: the first only drops a GPU-scope
fence in front of the dS buffer's hand-back, the second only issues the dV wgmma earlier. So: accuracy by the DESIGN.md
rule (tests/test_bwd_gpu.py's _run_case: fp64 reference, NaN-poisoned outputs) at hd 64 / 128, causal and not, odd
lengths, seqlen_q != seqlen_k, a pair whose second K/V tile is past seqlen_k; and results bitwise equal to the default
two_cta kernel: dK / dV always (each CTA's own sums), dQ with deterministic=True (the same turns and fp32 adds); repeated
runs of a long causal call (a race on the dS exchange buffer would show as a difference between repeats).

The switches reach the kernel through their AttnConfig fields (``bwd_two_cta_cta_release``, ``bwd_two_cta_dv_first``),
so the plumbing in kernels/sm90/backward.py is under test too.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _cfg, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

SWITCHES = dict(bwd_two_cta_cta_release=True, bwd_two_cta_dv_first=True)
# (batch, seqlen_q, seqlen_k, heads): odd lengths, one tile, seqlen_k ending inside the pair's first tile, > 4k
SHAPES = [(2, 1024, 1024, 3), (1, 1000, 1000, 2), (3, 333, 397, 5), (1, 17, 129, 3), (2, 64, 64, 2), (1, 300, 1003, 2),
          (2, 2048, 2048, 2), (1, 4097, 4097, 1)]


def _two_cta(on: bool, **kw):
    """two_cta config with the switches (on) or the default two_cta kernel."""
    return _cfg(two_cta=True, **(SWITCHES if on else {}), **kw)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_accuracy(shape, causal, d):
    b, sq, sk, h = shape
    _run_case(b, sq, sk, h, d, causal, torch.bfloat16, _two_cta(True), seed=11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_bitwise_equal_to_default_two_cta(d, causal, dtype):
    """Deterministic mode: dQ, dK, dV bitwise equal to the default two_cta kernel; non-deterministic: dK, dV."""
    from kernels.sm90.backward import attention_backward

    for det in (True, False):
        for b, sq, sk, h in ((2, 2048, 2048, 2), (1, 1000, 1337, 3)):
            g = torch.Generator(device="cuda").manual_seed(5)
            q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for s in (sq, sk, sk, sq))
            scale = 1.0 / math.sqrt(d)
            out, lse = _forward(q, k, v, causal, scale)
            res = []
            for on in (False, True):
                res.append(attention_backward(q, k, v, out, do, lse, causal, scale, _two_cta(on, deterministic=det)))
            torch.cuda.synchronize()
            names = ("dq", "dk", "dv") if det else ("dk", "dv")
            for name in names:
                i = ("dq", "dk", "dv").index(name)
                assert torch.equal(res[0][i], res[1][i]), (name, det, b, sq, sk, h, d, causal, dtype)


@pytest.mark.parametrize("d", [64, 128])
def test_repeats_bitwise(d):
    """Deterministic two_cta with the switches: 30 repeats of a 16k causal call, bitwise equal."""
    from kernels.sm90.backward import attention_backward

    b, s, h = 1, 16384, 4
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    out, lse = _forward(q, k, v, True, scale)
    cfg = _two_cta(True, deterministic=True)
    first = attention_backward(q, k, v, out, do, lse, True, scale, cfg)
    for _ in range(30):
        again = attention_backward(q, k, v, out, do, lse, True, scale, cfg)
        for x, y in zip(first, again):
            assert torch.equal(x, y)


def _forward(q, k, v, causal, scale):
    """Output and fp32 LSE (natural log, (b, h, s_q)) of exact attention at fp32, the backward's inputs."""
    from attn_reference import attention_at_dtype

    with torch.no_grad():
        out, lse = attention_at_dtype(q.float(), k.float(), v.float(), causal, scale)
    return out.to(q.dtype), lse.float().contiguous()
