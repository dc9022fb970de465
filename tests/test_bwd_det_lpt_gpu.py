"""GPU checks of det_schedule="lpt" (deterministic backward, opt-in; kernels/sm90/bwd.py _set_det_lpt): the
grid launches the longest K/V tile first (max(bwd_lpt_heads, 8) heads interleaved), each K/V tile walks its Q tiles
from the last one down to its diagonal (non-causal: ascending), dQ turns in K/V tile order. Accuracy by the DESIGN.md rule
(tests/test_bwd_gpu.py's _run_case: fp64 reference, NaN-poisoned outputs) at hd 64 / 128 (80- and 64-row Q tiles),
bf16 / fp16, odd lengths, seqlen_q < seqlen_k, one row, a length past 4096, group sizes 8 / 9 / 16 (a last smaller
group); bitwise reproducibility over 20 repeats, including a call whose heads' CTAs cannot all be resident at once
(16k, hd128: 128 K/V tiles per head, 256 CTAs on 132 SMs) -- where the rotated non-causal order could deadlock; and
agreement with the spt kernel up to the fp32 summation order."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from attn_reference import attention_at_dtype  # noqa: E402
from test_bwd_gpu import _cfg, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

SWITCHES = [dict(), dict(bwd_lpt_heads=9), dict(bwd_lpt_heads=16), dict(bwd_tile_m=64)]
# (batch, seqlen_q, seqlen_k, heads); causal with seqlen_q > seqlen_k leaves rows with no key (NaN reference): none here
SHAPES = [(2, 1024, 1024, 3), (2, 1000, 1000, 2), (3, 333, 397, 5), (1, 17, 129, 3), (3, 1, 1, 2), (2, 128, 128, 2),
          (1, 300, 1003, 2), (2, 2048, 2048, 2), (1, 4097, 4097, 1)]


def _sid(d):
    return "-".join(f"{k}={v}" for k, v in d.items()) or "default"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("switch", SWITCHES, ids=_sid)
@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_det_lpt_accuracy(switch, hdim, dtype, causal):
    if switch.get("bwd_tile_m") == 64 and hdim == 64:
        pytest.skip("hd64 runs 128-row tiles only")
    if not causal and dtype == torch.float16 and switch:
        pytest.skip("non-causal fp16 with the default switches only (pairwise coverage)")
    cfg = _cfg(deterministic=True, det_schedule="lpt", **switch)
    for i, (b, sq, sk, h) in enumerate(SHAPES + ([] if causal else [(2, 1003, 300, 3)])):
        _run_case(b, sq, sk, h, hdim, causal, dtype, cfg, seed=90 + i)


def _inputs(b, sq, sk, h, d, seed, causal=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    scale = 1.0 / math.sqrt(d)
    with torch.no_grad():
        out32, lse = attention_at_dtype(q.float(), k.float(), v.float(), causal, scale)
    return q, k, v, out32.to(torch.bfloat16), do, lse, scale


# (batch, seqlen_q, seqlen_k, heads, hdim): 16 (batch, head)s of 8 K/V tiles; odd lengths, seqlen_q < seqlen_k; 4k
# with 64 (batch, head)s (2048 CTAs, many waves); 16k hd128 with 2 heads (128 K/V tiles each: not all resident)
BITWISE = [(2, 1024, 1024, 8, 128), (2, 1000, 1337, 4, 128), (2, 1000, 1000, 4, 64), (4, 4096, 4096, 16, 128),
           (8, 2048, 2048, 16, 64), (1, 16384, 16384, 2, 128)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("b,sq,sk,h,d", BITWISE)
def test_bwd_det_lpt_bitwise(b, sq, sk, h, d, causal):
    from kernels.sm90.backward import attention_backward

    q, k, v, out, do, lse, scale = _inputs(b, sq, sk, h, d, seed=17, causal=causal)
    cfg = _cfg(deterministic=True, det_schedule="lpt")
    first = attention_backward(q, k, v, out, do, lse, causal, scale, cfg)
    assert all(torch.isfinite(x).all() for x in first)
    n_diff = sum(int(not all(torch.equal(a, c) for a, c in zip(first, attention_backward(
        q, k, v, out, do, lse, causal, scale, cfg)))) for _ in range(20))
    assert n_diff == 0, f"det_schedule='lpt' differed in {n_diff}/20 repeats"


@pytest.mark.parametrize("d,g", [(64, 8), (64, 32), (128, 16)])
def test_bwd_det_lpt_noncausal_is_naive_regrouped(d, g):
    """Non-causal "lpt" walks every Q tile ascending and takes the dQ turns in K/V tile order, as "naive" does: only
    the grid order differs (g heads interleaved), so dq / dk / dv are bitwise those of the naive kernel. 40 (batch,
    head)s: a last, smaller group."""
    from kernels.sm90.backward import attention_backward

    q, k, v, out, do, lse, scale = _inputs(5, 1000, 1000, 8, d, seed=29, causal=False)
    ref = attention_backward(q, k, v, out, do, lse, False, scale, _cfg(deterministic=True, det_schedule="naive"))
    got = attention_backward(q, k, v, out, do, lse, False, scale,
                             _cfg(deterministic=True, det_schedule="lpt", bwd_lpt_heads=g))
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(x).all(), name
        assert torch.equal(x, r), name


@pytest.mark.parametrize("d", [64, 128])
def test_bwd_det_lpt_matches_spt(d):
    """The same inputs through the spt kernel and the lpt one agree up to the fp32 summation order: dK / dV sum the
    same Q tiles in the reverse walk order, dQ the same K/V tiles in another turn order."""
    from kernels.sm90.backward import attention_backward

    q, k, v, out, do, lse, scale = _inputs(2, 1024, 1024, 4, d, seed=23)
    ref = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(deterministic=True, det_schedule="spt"))
    got = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(deterministic=True, det_schedule="lpt"))
    torch.cuda.synchronize()
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(x).all(), name
        tol = 1e-2 * r.float().abs().max().item() + 1e-3
        assert (x.float() - r.float()).abs().max().item() <= tol, name
