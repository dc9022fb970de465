"""GPU correctness of AttnConfig.bwd_stream_post (the dQ writer counts each dQ row unit's completed reductions, the
postprocess converts a tile once every K/V tile that visits it has counted: kernels/sm90/bwd.py _set_stream_post,
bwd_post.py ``stream``) by the DESIGN.md rule (tests/test_bwd_gpu.py's _run_case: fp64 reference, NaN-poisoned
outputs), hd 64 / 128, causal and not, seqlen_q above and below seqlen_k (causal rows that see no key), GQA; and the
same gradients as the grid-wide wait's, call after call on reused buffers (a counter read before its zeroing, or a
tile converted before its last reduction, would show as a difference)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _cfg, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, heads); causal with seqlen_q > seqlen_k leaves rows with no key, where the fp64
# reference is NaN: those shapes run non-causal here, causal in test_bwd_stream_post_rows_without_keys
SHAPES = [(2, 1024, 1024, 3), (3, 333, 397, 5), (1, 17, 129, 3), (3, 1, 1, 2), (1, 300, 77, 2), (2, 128, 128, 2),
          (1, 1003, 300, 2), (1, 4097, 4097, 1), (2, 1040, 1040, 2)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_stream_post(hdim, causal, dtype):
    cfg = _cfg(bwd_pdl=True, bwd_stream_post=True)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        if not (causal and sq > sk):
            _run_case(b, sq, sk, h, hdim, causal, dtype, cfg, seed=70 + i)


def rows_without_keys(hdim, shape, base, cand, seed, nan_memory=False):
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key (the forward's output there is
    0). ``cand``'s gradients equal ``base``'s (dK / dV bitwise), its dQ there exactly 0. ``nan_memory``: the
    allocator's free memory of dQaccum's size NaN-filled before the call (an unzeroed dQaccum starts as NaN)."""
    from attn_reference import attention_at_dtype
    from kernels.sm90.backward import attention_backward

    b, sq, sk, h = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(b, sq, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, sk, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    scale = 1.0 / math.sqrt(hdim)
    out, lse = attention_at_dtype(q.double(), k.double(), v.double(), True, scale)
    out, lse = out.nan_to_num(0.0).to(torch.bfloat16), lse.float().contiguous()
    ref = attention_backward(q, k, v, out, do, lse, True, scale, base)
    bufs = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    if nan_memory:
        junk = torch.full((b, h, sq + 240, hdim), float("nan"), device="cuda", dtype=torch.float32)
        del junk  # (the caching allocator hands this block to the call's dQaccum)
    got = attention_backward(q, k, v, out, do, lse, True, scale, cand, *bufs)
    torch.cuda.synchronize()
    assert int((got[0][:, : sq - sk] != 0).sum()) == 0
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    x, r = got[0].float(), ref[0].float()
    assert torch.isfinite(x).all() and int((x - r).abs().gt(r.abs() * 2 ** -7 + 1e-3 * r.abs().max()).sum()) == 0


def interleaved_against(hdim, causal, base, cand, s, seed, exact_dq, nan_memory=False):
    """20 calls each of ``cand`` and ``base``, interleaved, into the same NaN-poisoned output buffers (GQA: 4 Q heads
    per K/V head, batch 2, seqlen ``s``), against base's first call: dK / dV (and with ``exact_dq`` dQ) bitwise;
    dQ otherwise within the fp32 rounding of the reductions' order (a bf16 ulp of an element), where a tile
    converted or added to too early would miss a K/V tile's whole share. ``nan_memory``: the allocator's free memory
    of dQaccum's size NaN-filled before each call."""
    from kernels.sm90.backward import attention_backward

    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, hkv = 2, 8, 2
    q, do, out = (torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    k, v = (torch.randn(b, s, hkv, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    lse = torch.randn(b, h, s, device="cuda", dtype=torch.float32, generator=g) + 6.0
    scale = 1.0 / math.sqrt(hdim)
    ref = [t.clone() for t in attention_backward(q, k, v, out, do, lse, causal, scale, base)]
    bufs = [torch.full_like(t, float("nan")) for t in ref]
    for i in range(20):
        for cfg in (cand, base):
            if nan_memory:
                junk = torch.full((b, h, s + 240, hdim), float("nan"), device="cuda", dtype=torch.float32)
                del junk
            for t in bufs:
                t.fill_(float("nan"))
            got = attention_backward(q, k, v, out, do, lse, causal, scale, cfg, *bufs)
            torch.cuda.synchronize()
            which = "candidate" if cfg is cand else "base"
            for name, x, r in list(zip(("dq", "dk", "dv"), got, ref))[0 if exact_dq else 1:]:
                assert torch.equal(x, r), f"call {i} {name} differs ({which})"
            x, r = got[0].float(), ref[0].float()
            bad = (x - r).abs() > r.abs() * 2 ** -7 + 1e-3 * r.abs().max()
            assert torch.isfinite(x).all() and int(bad.sum()) == 0, f"call {i} dq: {int(bad.sum())} elements ({which})"


@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("shape", [(1, 300, 77, 2), (1, 1003, 300, 2), (2, 200, 77, 3)])
def test_bwd_stream_post_rows_without_keys(hdim, shape):
    """Their dQ units wait for no K/V tile and the postprocess writes zeros without reading dQaccum
    (rows_without_keys, against the grid-wide wait)."""
    rows_without_keys(hdim, shape, _cfg(bwd_pdl=True, bwd_stream_post=False), _cfg(bwd_pdl=True, bwd_stream_post=True),
                      13)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("hdim", [64, 128])
def test_bwd_stream_post_matches_the_grid_wait(hdim, causal):
    """interleaved_against the grid-wide wait at seqlen 2048 (2048 / 128 = 16 K/V tiles per Q tile): a tile
    converted before one of its reductions, or a stale counter, would miss a whole share."""
    interleaved_against(hdim, causal, _cfg(bwd_pdl=True, bwd_stream_post=False),
                        _cfg(bwd_pdl=True, bwd_stream_post=True), 2048, 12, exact_dq=False)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("hdim,extra", [(64, {}), (128, {}), (128, dict(bwd_det_diag_align=True)),
                                        (128, dict(bwd_det_two_writers=False))], ids=["64", "128", "128diag", "128w1"])
def test_bwd_stream_post_deterministic(hdim, extra, causal):
    """Deterministic kernels stream on their dQ semaphores (per Q tile, or per 8 rows with bwd_det_diag_align's
    walks): interleaved_against the grid-wide wait at seqlen 1500, every gradient bitwise (a tile converted before
    its last turn would miss that turn's share). Plus the DESIGN.md rule at odd shapes."""
    stream = _cfg(deterministic=True, bwd_pdl=True, bwd_stream_post=True, **extra)
    interleaved_against(hdim, causal, _cfg(deterministic=True, bwd_pdl=True, bwd_stream_post=False, **extra), stream,
                        1500, 14, exact_dq=True)
    for j, (bb, sq, sk, hh) in enumerate(SHAPES[:6]):
        if not (causal and sq > sk):
            _run_case(bb, sq, sk, hh, hdim, causal, torch.bfloat16, stream, seed=90 + j)
