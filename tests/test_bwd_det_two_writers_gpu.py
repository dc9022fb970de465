"""GPU checks of AttnConfig.bwd_det_two_writers (deterministic sm90 backward, kernels/sm90/bwd.py dq_writer_pair; on by
default at (192, 128) and hd128, opt-in at hd64 -- the tests at the end): two dQ writer warps take the Q tiles in
turn, each frees the staging buffer once its bulk reduction has read it and waits for the completion only before its
semaphore release. Accuracy by the DESIGN.md
rule (tests/test_bwd_gpu.py's _run_case: fp64 reference, NaN-poisoned outputs), causal and non-causal ("rotate" runs
there; "spt" / "naive" too), bf16 / fp16, odd lengths (a CTA with an odd number of Q tiles: writer 0 takes the last),
seqlen_q != seqlen_k, one Q tile (writer 1 idle), a sliding window (turns over the window's visitors); bitwise
reproducibility over 20 repeats including 16k non-causal (128 K/V tiles per head, the rotated order with every CTA
resident) and a many-wave 4k causal call; and equality with the one-writer kernel: the same turns, so the same
sequence of fp32 adds into every dQ tile, dK / dV untouched -- bitwise equal results."""
from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from attn_reference import attention_at_dtype  # noqa: E402
from test_bwd_gpu import _cfg, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

D = (192, 128)
ONE_WRITER = _cfg(deterministic=True, bwd_det_two_writers=False)  # the reference: the one-writer kernel
SCHEDULES = [dict(), dict(det_schedule="spt"), dict(det_schedule="naive")]
# (batch, seqlen_q, seqlen_k, heads); causal with seqlen_q > seqlen_k leaves rows with no key (NaN reference): none here
SHAPES = [(2, 1024, 1024, 3), (2, 1000, 1000, 2), (3, 333, 397, 5), (1, 17, 129, 3), (3, 1, 1, 2), (2, 64, 64, 2),
          (2, 192, 192, 2), (1, 300, 1003, 2), (2, 2048, 2048, 2), (1, 4097, 4097, 1)]


def _sid(d):
    return "-".join(f"{k}={v}" for k, v in d.items()) or "default"


@pytest.mark.parametrize("sched", SCHEDULES, ids=_sid)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_det_two_writers_accuracy(sched, causal, dtype):
    cfg = _cfg(deterministic=True, bwd_det_two_writers=True, **sched)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        _run_case(b, sq, sk, h, D, causal, dtype, cfg, seed=190 + i)


def _inputs(b, sq, sk, h, causal, seed, d=D):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d[0], device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, h, d[0], device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, h, d[1], device="cuda", dtype=torch.bfloat16, generator=g)
    do = torch.randn(b, sq, h, d[1], device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 1.0 / math.sqrt(d[0])
    with torch.no_grad():
        out32, lse = attention_at_dtype(q.float(), k.float(), v.float(), causal, scale)
    return q, k, v, out32.to(torch.bfloat16), do, lse.float().contiguous(), scale


# (batch, seqlen_q, seqlen_k, heads, causal): odd lengths, seqlen_q < seqlen_k; 4k causal with 40 (batch, head)s (many
# waves); 16k non-causal, 128 K/V tiles per head (rotate: a head's CTAs all resident, 10 heads, ~10 waves)
BITWISE = [(2, 1024, 1024, 8, False), (2, 1024, 1024, 8, True), (2, 1000, 1337, 4, False), (2, 1000, 1337, 4, True),
           (4, 4096, 4096, 10, True), (1, 16384, 16384, 10, False)]


@pytest.mark.parametrize("b,sq,sk,h,causal", BITWISE)
def test_bwd_det_two_writers_bitwise(b, sq, sk, h, causal):
    """Bitwise over 20 repeats, and bitwise equal to the one-writer deterministic kernel (same turns, same adds)."""
    from kernels.sm90.backward import attention_backward

    q, k, v, out, do, lse, scale = _inputs(b, sq, sk, h, causal, seed=19)
    cfg = _cfg(deterministic=True, bwd_det_two_writers=True)
    first = attention_backward(q, k, v, out, do, lse, causal, scale, cfg)
    assert all(torch.isfinite(x).all() for x in first)
    n_diff = sum(int(not all(torch.equal(a, c) for a, c in zip(first, attention_backward(
        q, k, v, out, do, lse, causal, scale, cfg)))) for _ in range(20))
    assert n_diff == 0, f"bwd_det_two_writers differed in {n_diff}/20 repeats"
    one = attention_backward(q, k, v, out, do, lse, causal, scale, ONE_WRITER)
    for name, x, r in zip(("dq", "dk", "dv"), first, one):
        assert torch.equal(x, r), f"{name}: two writers differ from the one-writer kernel"


def test_bwd_det_two_writers_window():
    """A sliding window (turns over the window's visitors, m_block_visitors) with the two writers."""
    cfg = _cfg(deterministic=True, bwd_det_two_writers=True)
    from kernels.sm90.backward import attention_backward

    q, k, v, out, do, lse, scale = _inputs(2, 1000, 1000, 3, True, seed=29)
    a = attention_backward(q, k, v, out, do, lse, True, scale, cfg, window_left=200)
    for _ in range(5):
        b = attention_backward(q, k, v, out, do, lse, True, scale, cfg, window_left=200)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    ref = attention_backward(q, k, v, out, do, lse, True, scale, ONE_WRITER, window_left=200)
    assert all(torch.equal(x, y) for x, y in zip(a, ref))


# ---- FlashBwdSm90 (hd64 opt-in, hd128 default) -----------------------------------------------------------------------
# (batch, seqlen_q, seqlen_k, heads): odd lengths (an odd number of Q tiles per CTA: writer 0 takes the last), seqlen_q
# != seqlen_k both ways, one Q tile (writer 1 idle), a many-wave 4k call
SM90_SHAPES = [(2, 1024, 1024, 4), (2, 1000, 1337, 3), (3, 333, 397, 2), (1, 17, 129, 2), (2, 64, 64, 2),
               (4, 4096, 4096, 10)]


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("hd", [64, 128])
def test_sm90_two_writers_bitwise(hd, causal):
    """hd 64 (128-row tiles) / 128 (80-row tiles): bitwise over 10 repeats and bitwise equal to the one-writer
    deterministic kernel (same turns, same fp32 adds in the same order), on every SM90_SHAPES shape."""
    from kernels.sm90.backward import attention_backward

    for i, (b, sq, sk, h) in enumerate(SM90_SHAPES):
        if causal and sq > sk:
            continue
        q, k, v, out, do, lse, scale = _inputs(b, sq, sk, h, causal, seed=40 + i, d=(hd, hd))
        cfg = _cfg(deterministic=True, bwd_det_two_writers=True)
        first = attention_backward(q, k, v, out, do, lse, causal, scale, cfg)
        assert all(torch.isfinite(x).all() for x in first)
        for _ in range(10):
            again = attention_backward(q, k, v, out, do, lse, causal, scale, cfg)
            assert all(torch.equal(a, c) for a, c in zip(first, again)), (b, sq, sk, h)
        one = attention_backward(q, k, v, out, do, lse, causal, scale, ONE_WRITER)
        for name, x, r in zip(("dq", "dk", "dv"), first, one):
            assert torch.equal(x, r), f"{name} {(b, sq, sk, h)}: two writers differ from the one-writer kernel"


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("hd", [64, 128])
def test_sm90_two_writers_accuracy(hd, causal):
    """The DESIGN.md rule against fp64 (NaN-poisoned outputs), bf16 and fp16."""
    cfg = _cfg(deterministic=True, bwd_det_two_writers=True)
    for dtype in (torch.bfloat16, torch.float16):
        for i, (b, sq, sk, h) in enumerate(SM90_SHAPES[:5]):
            if causal and sq > sk:
                continue
            _run_case(b, sq, sk, h, hd, causal, dtype, cfg, seed=60 + i)


# variants FlashBwdSm90 compiles with the two writers: 64-row tiles (two staging buffers), two_cta, a sliding window
VARIANTS = [("tm64", dict(bwd_tile_m=64), {}), ("two_cta", dict(two_cta=True), {}),
            ("window", {}, dict(window_left=200))]


@pytest.mark.parametrize("name,extra,kw", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("hd", [64, 128])
def test_sm90_two_writers_variants_bitwise(name, extra, kw, hd):
    """Bitwise equal to the one-writer deterministic kernel of the same variant, causal both, odd lengths."""
    from kernels.sm90.backward import attention_backward

    for causal in (False, True):
        for i, (b, sq, sk, h) in enumerate([(2, 1000, 1337, 3), (2, 1024, 1024, 4)]):
            q, k, v, out, do, lse, scale = _inputs(b, sq, sk, h, causal, seed=80 + i, d=(hd, hd))
            two = attention_backward(q, k, v, out, do, lse, causal, scale,
                                     _cfg(deterministic=True, bwd_det_two_writers=True, **extra), **kw)
            for _ in range(3):
                again = attention_backward(q, k, v, out, do, lse, causal, scale,
                                           _cfg(deterministic=True, bwd_det_two_writers=True, **extra), **kw)
                assert all(torch.equal(a, c) for a, c in zip(two, again))
            one = attention_backward(q, k, v, out, do, lse, causal, scale,
                                     _cfg(deterministic=True, bwd_det_two_writers=False, **extra), **kw)
            for n, x, r in zip(("dq", "dk", "dv"), two, one):
                assert torch.equal(x, r), f"{name} hd{hd} causal={causal} {n}: differs from the one-writer kernel"


def test_sm90_two_writers_varlen_bitwise():
    """Varlen (the sequence's padded Q tiles and semaphores): bitwise equal to the one-writer deterministic kernel."""
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward_varlen
    from test_varlen_gpu import SELF_LENS, _bwd_setup

    for hd, causal in ((64, True), (128, True), (128, False)):
        case = (f"bwd-det2w-hd{hd}", SELF_LENS, 2, 2, hd, causal, {})
        (lens, q, k, v, out, do, lse, cu_q, cu_k, max_q, max_k, c_causal, scale, cfg, window, cap,
         kw) = _bwd_setup(*case, config=AttnConfig(deterministic=True, bwd_det_two_writers=True))
        two = attention_backward_varlen(q, k, v, out, do, lse, cu_q, cu_k, max_q, max_k, c_causal, scale, cfg, **kw)
        one_cfg = dataclasses.replace(cfg, bwd_det_two_writers=False)
        one = attention_backward_varlen(q, k, v, out, do, lse, cu_q, cu_k, max_q, max_k, c_causal, scale, one_cfg,
                                        **kw)
        for n, x, r in zip(("dq", "dk", "dv"), two, one):
            assert torch.equal(x, r), f"varlen hd{hd} causal={causal} {n}: differs from the one-writer kernel"
