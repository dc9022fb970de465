"""GPU tests of the hd256 two_cta backward (kernels/sm90/bwd_wide_two_cta.py) against the fp64 reference.

Same rule and harness as tests/test_bwd_gpu.py (its ``_run_case``: max|x - ref| <= 2 * max|x_pt - ref| + atol, ref in
fp64, x_pt plain PyTorch autograd at the input dtype; dq / dk / dv preallocated and NaN-poisoned). Cases aim at what
the cluster adds: K/V tile counts that leave the pair's second tile partly or wholly past seqlen_k, Q tiles that one CTA
of a causal pair sees fully masked, seqlen_q != seqlen_k both ways, lengths 1 and 17, every switch the kernel takes
(deterministic with both schedules, the exp2 emulation), GQA, and a deterministic bitwise repeat.
``pytest -m gpu tests/test_bwd_wide_two_cta_gpu.py``.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from attn_reference import attention_at_dtype, grads_at_dtype  # noqa: E402
from test_bwd_gpu import SHAPES, _repeat_dq, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu


def _cfg(**kw):
    """The 64-row pair kernel (bwd_two_cta_n80=False: the 80-row kernel, the non-deterministic default since session 30,
    has its own tests in test_bwd_two_cta_n80_gpu.py)."""
    from kernels import AttnConfig

    return AttnConfig(two_cta=True, **{"bwd_two_cta_n80": False, **kw})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}-sq{}-sk{}-h{}".format(*s))
def test_two_cta_hd256_shapes(dtype, causal, shape):
    """test_bwd_gpu.py's shape grid (lengths 1, 17, odd, s_q != s_k, 4097) with two_cta."""
    b, sq, sk, h = shape
    if causal and sq > sk:
        pytest.skip("causal with seqlen_q > seqlen_k leaves rows with no key (reference is NaN there)")
    _run_case(b, sq, sk, h, 256, causal, getattr(torch, dtype), _cfg())


# (batch, seqlen_q, seqlen_k, heads): K/V tile counts 1 (the pair's second tile wholly past seqlen_k), 2, 3 (an odd
# count: a last pair with one tile), 5 with a 1-row last tile; seqlen_q one row past a Q tile, and below / above s_k
PAIR_SHAPES = [(1, 64, 64, 2), (2, 65, 65, 1), (1, 150, 130, 2), (1, 130, 150, 2), (2, 77, 260, 1),
               (1, 257, 257, 3), (1, 150, 300, 2), (2, 333, 397, 2)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", PAIR_SHAPES, ids=lambda s: "b{}-sq{}-sk{}-h{}".format(*s))
def test_two_cta_hd256_pair_edges(causal, shape):
    b, sq, sk, h = shape
    if causal and sq > sk:
        pytest.skip("causal with seqlen_q > seqlen_k leaves rows with no key (reference is NaN there)")
    _run_case(b, sq, sk, h, 256, causal, torch.bfloat16, _cfg(), seed=3)


def _sid(switch):
    return "-".join(f"{k}={v}" for k, v in switch.items())


@pytest.mark.parametrize("switch", [dict(deterministic=True), dict(deterministic=True, det_schedule="naive"),
                                    dict(deterministic=True, det_schedule="spt"), dict(bwd_rotate_q=True),
                                    dict(exp2_emu_fraction=0.5), dict(exp2_emu_fraction=1.0),
                                    dict(deterministic=True, exp2_emu_fraction=0.5)], ids=_sid)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_two_cta_hd256_switches(switch, causal):
    dtype = torch.float16 if switch.get("exp2_emu_fraction") == 1.0 else torch.bfloat16
    _run_case(2, 333, 397, 2, 256, causal, dtype, _cfg(**switch), seed=1)
    _run_case(1, 256, 256, 3, 256, causal, dtype, _cfg(**switch), seed=2)


@pytest.mark.parametrize("schedule", ["spt", "naive", "rotate"])  # rotate: the pairs' rotated walks (non-causal)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_two_cta_hd256_deterministic_bitwise(causal, schedule):
    """deterministic two_cta: dq / dk / dv bitwise equal over 200 repeats (each CTA's head-dim half of a Q tile has
    its own semaphore; turns over the pairs)."""
    n_diff = _repeat_dq(_cfg(deterministic=True, det_schedule=schedule), causal, 200, d=256)
    assert n_diff == 0, f"deterministic two_cta hd256 differed in {n_diff}/200 repeats"


def test_two_cta_hd256_nondeterministic_reorders(capsys):
    """Report (not assert) whether the unordered dQ reductions change bits run to run."""
    n_diff = _repeat_dq(_cfg(), False, 50, d=256)
    with capsys.disabled():
        print(f"\n[non-deterministic bwd, two_cta hd256] dq/dk/dv differed bitwise in {n_diff}/50 repeats")


@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal", [(2, 17, 17, 4, 2, True), (1, 129, 300, 8, 1, False),
                                                   (1, 300, 300, 4, 2, True)],
                         ids=["g2-causal-sq17", "mqa-full-sq129-sk300", "g2-causal-sq300"])
def test_two_cta_hd256_gqa(b, sq, sk, hq, hkv, causal):
    """GQA / MQA with two_cta: the CTA of Q head i loads K/V head i // g, the peer's K half included."""
    gqa_case(b, sq, sk, hq, hkv, causal, _cfg())


def gqa_case(b, sq, sk, hq, hkv, causal, cfg):
    """One hd256 GQA / MQA backward with ``cfg`` against the fp64 reference (NaN-poisoned preallocated outputs)."""
    from kernels.sm90.backward import attention_backward

    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(6)
    q, k, v, do = (torch.randn(b, s, h, 256, device="cuda", dtype=dtype, generator=g)
                   for s, h in ((sq, hq), (sk, hkv), (sk, hkv), (sq, hq)))
    scale = 1.0 / math.sqrt(256)
    with torch.no_grad():
        out64, lse = attention_at_dtype(q.double(), k.double(), v.double(), causal, scale)
    ref = grads_at_dtype(q.double(), k.double(), v.double(), do.double(), causal, scale, torch.float64)[1:]
    pt = grads_at_dtype(q, k, v, do, causal, scale, dtype)[1:]
    poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    ours = attention_backward(q, k, v, out64.to(dtype), do, lse.float().contiguous(), causal, scale, cfg, *poisoned)
    torch.cuda.synchronize()
    assert all(o.data_ptr() == p.data_ptr() for o, p in zip(ours, poisoned)), "preallocated outputs not used"
    for name, x, r, p in zip(("dq", "dk", "dv"), ours, ref, pt):
        assert x.shape == r.shape and torch.isfinite(x).all(), name
        err = (x.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + 2e-3, f"{name}: max err {err:.3e} > 2*{err_pt:.3e}+2e-3"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_two_cta_hd256_matches_one_cta(causal):
    """Same inputs through the one-CTA and the two-CTA kernel: dK / dV come from the same GEMMs in the same order (a
    causal pair's extra, fully masked Q tiles add exact zeros), so they are bitwise equal; dQ agrees to within bf16
    rounding of the other fp32 summation order (a layout or chunk mix-up in dQaccum would be O(1))."""
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    b, s, h, d = 2, 1000, 2, 256
    g = torch.Generator(device="cuda").manual_seed(9)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    with torch.no_grad():
        out32, lse = attention_at_dtype(q.float(), k.float(), v.float(), causal, scale)
    out = out32.to(torch.bfloat16)
    one = attention_backward(q, k, v, out, do, lse, causal, scale, AttnConfig(two_cta=False))
    two = attention_backward(q, k, v, out, do, lse, causal, scale, _cfg())
    assert torch.equal(one[1], two[1]) and torch.equal(one[2], two[2]), "dK / dV differ from the one-CTA kernel's"
    ref = one[0].float().abs().max().item()
    assert (one[0].float() - two[0].float()).abs().max().item() <= 2e-2 * ref + 1e-3, "dQ"
