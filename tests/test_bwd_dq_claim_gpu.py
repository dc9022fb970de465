"""GPU correctness of AttnConfig.bwd_dq_claim (the preprocess does not zero dQaccum; the first dQ writer per unit
stores, the others add after its store: kernels/sm90/bwd.py _set_dq_claim): the DESIGN.md rule (tests/test_bwd_gpu.py
_run_case: fp64 reference, NaN-poisoned outputs) at hd 64 / 128, causal and not (hd128 non-causal with bwd_rotate_q),
odd lengths; and the gradients of the kernel with zeroing, call after call, with dQaccum's memory NaN-filled before
each call (a unit read or added to before its claimant's store landed would turn dQ into NaN or miss a share)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _cfg, _run_case  # noqa: E402
from test_bwd_stream_post_gpu import SHAPES  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [(64, False, {}), (64, True, {}), (128, True, {}), (128, False, dict(bwd_rotate_q=True))]
IDS = ["64nc", "64c", "128c", "128nc_rotq"]


@pytest.mark.parametrize("hdim,causal,extra", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_dq_claim(hdim, causal, extra, dtype):
    cfg = _cfg(bwd_dq_claim=True, **extra)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        if not (causal and sq > sk):
            _run_case(b, sq, sk, h, hdim, causal, dtype, cfg, seed=80 + i)


def _against_zeroing(hdim, causal, base, claim, s, seed, exact_dq):
    """20 calls each of ``claim`` and ``base`` (with zeroing), interleaved, into NaN-poisoned reused buffers; before
    each call the allocator's free memory of dQaccum's size is filled with NaN and released, so an unzeroed dQaccum
    starts as NaN. dK / dV (and with ``exact_dq`` dQ) equal to base's first call; dQ otherwise within the fp32
    reduction order (a K/V tile's whole share missing, or one NaN, fails it). GQA (4 Q heads per K/V head), batch 2."""
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
        for cfg in (claim, base):
            junk = torch.full((b, h, s + 240, hdim), float("nan"), device="cuda", dtype=torch.float32)
            del junk  # (the caching allocator hands this block to the call's dQaccum)
            for t in bufs:
                t.fill_(float("nan"))
            got = attention_backward(q, k, v, out, do, lse, causal, scale, cfg, *bufs)
            torch.cuda.synchronize()
            which = "claim" if cfg is claim else "zeroed"
            for name, x, r in list(zip(("dq", "dk", "dv"), got, ref))[0 if exact_dq else 1:]:
                assert torch.equal(x, r), f"call {i} {name} differs ({which})"
            x, r = got[0].float(), ref[0].float()
            bad = (x - r).abs() > r.abs() * 2 ** -7 + 1e-3 * r.abs().max()
            assert torch.isfinite(x).all() and int(bad.sum()) == 0, f"call {i} dq: {int(bad.sum())} elements ({which})"


@pytest.mark.parametrize("hdim,causal,extra", CASES, ids=IDS)
def test_bwd_dq_claim_over_nan_memory(hdim, causal, extra):
    """_against_zeroing at seqlen 2048."""
    _against_zeroing(hdim, causal, _cfg(bwd_dq_claim=False, **extra), _cfg(bwd_dq_claim=True, **extra), 2048, 15,
                     exact_dq=False)


@pytest.mark.parametrize("hdim", [64, 128])
def test_bwd_dq_claim_rows_without_keys(hdim):
    """Causal, seqlen_q > seqlen_k: the units of rows that see no key are claimed by nobody; the postprocess writes
    their zeros without reading the (NaN) dQaccum."""
    from attn_reference import attention_at_dtype
    from kernels.sm90.backward import attention_backward

    b, sq, sk, h = 1, 1003, 300, 2
    g = torch.Generator(device="cuda").manual_seed(16)
    q, do = (torch.randn(b, sq, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, sk, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    scale = 1.0 / math.sqrt(hdim)
    out, lse = attention_at_dtype(q.double(), k.double(), v.double(), True, scale)
    out, lse = out.nan_to_num(0.0).to(torch.bfloat16), lse.float().contiguous()
    ref = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(bwd_dq_claim=False))
    junk = torch.full((b, h, sq + 240, hdim), float("nan"), device="cuda", dtype=torch.float32)
    del junk
    got = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(bwd_dq_claim=True))
    torch.cuda.synchronize()
    assert int((got[0][:, : sq - sk] != 0).sum()) == 0
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    x, r = got[0].float(), ref[0].float()
    assert torch.isfinite(x).all() and int((x - r).abs().gt(r.abs() * 2 ** -7 + 1e-3 * r.abs().max()).sum()) == 0


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("hdim,extra", [(64, {}), (128, {}), (128, dict(bwd_det_two_writers=False))],
                         ids=["64", "128", "128w1"])
def test_bwd_dq_turn0_store_deterministic(hdim, extra, causal):
    """Deterministic: each dQ tile's turn 0 stores (no zeroed dQaccum): every gradient bitwise equal (torch.equal)
    to the kernel with zeroing (_against_zeroing at seqlen 1500); plus the DESIGN.md rule at odd shapes."""
    claim = _cfg(deterministic=True, bwd_dq_claim=True, **extra)
    _against_zeroing(hdim, causal, _cfg(deterministic=True, bwd_dq_claim=False, **extra), claim, 1500, 17,
                     exact_dq=True)
    for j, (bb, sq, sk, hh) in enumerate(SHAPES[:6]):
        if not (causal and sq > sk):
            _run_case(bb, sq, sk, hh, hdim, causal, torch.bfloat16, claim, seed=95 + j)
