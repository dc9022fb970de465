"""GPU tests of the packed GQA forward (AttnConfig(pack_gqa=True), issue 12.1): one CTA per K/V head, Q tile rows
(position, head of the group). Against an fp64 reference with K/V repeated (Q head i reads K/V head i // g), by the
DESIGN.md rule max|out - ref| <= 2 * max|out_pt - ref| + atol (out_pt: plain PyTorch at the input dtype), LSE within
1e-3, rows that see no key out 0 / LSE -inf; out and LSE preallocated and NaN-poisoned. Groups 2 / 4 / 8, seqlen_q
1 / 17 / 128 / 1000 with seqlen_k >= seqlen_q, causal both, hd 64 / 128, sliding windows.

Bitwise (a prediction, not yet seen on a GPU): with rescale_threshold=0 (always rescale) the packed kernel should give
exactly the per-Q-head GQA kernel's out and LSE when no left window bound is set: each row runs the same wgmma dot
products and the same softmax over the same K/V blocks in the same order, and the extra blocks the per-Q-head kernel's
taller tile visits lie past the row's right bound, so they come first (K/V blocks run last to first) while the row's
maximum is still -inf (P = 0, then a rescale by 2^-inf = 0 of zeros). With a left bound its extra blocks come last, after
a finite maximum: a rescale by 2^(m*s - m*s), which an FFMA may leave a rounding residual away from 1, so those cases
are held to the correctness rule only. With the default tau = 8 the stale-maximum decision is a vote over a warp's rows
and a warp's rows differ (positions x group heads vs positions), so there too only the correctness rule holds.
ids name head dim, group, causal, lengths and window, e.g. ``-k g8``, ``-k sq1-``, ``-k bitwise``.

    python -m pytest -q tests/test_pack_gqa_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)

ATOL = 2e-3
SEQLENS = ((1, 513), (17, 300), (128, 128), (1000, 1037))  # (seqlen_q, seqlen_k), seqlen_k >= seqlen_q
HKV = 2  # K/V heads; Q heads = HKV * group

# (seqlen_q, seqlen_k, group, hd, causal, window)
CASES = [(sq, sk, g, hd, causal, (-1, -1)) for hd in (64, 128) for causal in (False, True) for g in (2, 4, 8)
         for sq, sk in SEQLENS]
WINDOW_CASES = [
    (1000, 1037, 4, 128, True, (256, -1)),
    (1000, 1037, 4, 64, True, (64, -1)),
    (17, 300, 8, 128, False, (100, 37)),
    (1000, 1000, 2, 64, False, (-1, 32)),
    (128, 700, 4, 128, False, (128, 128)),
    (1, 513, 8, 64, False, (10, 10)),
    (1000, 777, 4, 128, True, (300, -1)),  # seqlen_q > seqlen_k: the first rows see no key
    (300, 611, 2, 256, True, (-1, -1)),  # hd256 (tile_m 128, tile_n 80)
    (77, 1000, 4, 256, False, (-1, -1)),
]


def _id(c):
    sq, sk, g, hd, causal, (wl, wr) = c
    parts = [f"hd{hd}", f"g{g}", "causal" if causal else "full", f"sq{sq}", f"sk{sk}"]
    if (wl, wr) != (-1, -1):
        parts.append(f"w{wl}_{wr}")
    return "-".join(parts)


def _inputs(b, sq, sk, g, hd, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, HKV * g, hd, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, sk, HKV, hd, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, sk, HKV, hd, device="cuda", dtype=dtype, generator=gen)
    return q, k, v


def _refs(q, k, v, causal, scale, window):
    from kernels.reference import attention_exact, attention_naive

    rep = q.shape[2] // k.shape[2]
    kr, vr = (t.repeat_interleave(rep, dim=2) for t in (k, v))
    ref, ref_lse = attention_exact(q, kr, vr, causal=causal, softmax_scale=scale, return_lse=True, window_size=window)
    pt = attention_naive(q, kr, vr, causal=causal, softmax_scale=scale, window_size=window)
    return ref, ref_lse, pt


def _check(o, l, ref, ref_lse, pt, tag):
    assert torch.isfinite(o).all(), f"out: non-finite values (an element left unwritten?) {tag}"
    err = (o.double() - ref).abs().max().item()
    err_pt = (pt.double() - ref).abs().max().item()
    assert err <= 2 * err_pt + ATOL, f"out: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL} {tag}"
    assert not torch.isnan(l).any(), f"lse: NaN left (unwritten?) {tag}"
    empty = torch.isinf(ref_lse)  # rows that see no key: out 0, lse -inf
    assert torch.equal(torch.isinf(l) & (l < 0), empty), f"lse: -inf rows differ from the reference's {tag}"
    assert (o.double()[empty.transpose(1, 2)] == 0).all(), f"out: rows without keys must be 0 {tag}"
    d = (l.double() - ref_lse)[~empty]
    assert d.numel() == 0 or d.abs().max().item() < 1e-3, f"lse: max err {d.abs().max().item():.3e} {tag}"


def _run(q, k, v, causal, scale, window, **cfg_kw):
    """(out, lse) of attention_forward into NaN-poisoned buffers; (causal, window) as canonical_window takes them."""
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config
    from kernels.validate import canonical_window

    c_causal, left, right = canonical_window(causal, window)
    cfg = resolve_config(AttnConfig(**cfg_kw), q.shape[3], c_causal)
    b, sq, h, _ = q.shape
    out = torch.full((b, sq, h, v.shape[3]), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    o, l = attention_forward(q, k, v, c_causal, scale, cfg, out=out, lse=lse, window_left=left, window_right=right)
    torch.cuda.synchronize()
    assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr(), "preallocated outputs not used"
    return o, l


@pytest.mark.parametrize("case", CASES + WINDOW_CASES, ids=[_id(c) for c in CASES + WINDOW_CASES])
def test_packed_forward(case):
    sq, sk, g, hd, causal, window = case
    q, k, v = _inputs(2, sq, sk, g, hd, torch.bfloat16, seed=sq * 7 + sk + g)
    scale = 1.0 / math.sqrt(hd)
    with torch.no_grad():
        ref, ref_lse, pt = _refs(q, k, v, causal, scale, window)
    o, l = _run(q, k, v, causal, scale, window, pack_gqa=True)
    _check(o, l, ref, ref_lse, pt, _id(case))


BITWISE = [c for c in CASES if c[0] != 128 and (c[3] == 128 or c[2] == 4)] + [WINDOW_CASES[3]]  # no left bound


@pytest.mark.parametrize("case", BITWISE, ids=[_id(c) for c in BITWISE])
def test_packed_bitwise_vs_gqa_kernel_tau0(case):
    """rescale_threshold=0: out and LSE bitwise equal to the per-Q-head GQA kernel's (see the module docstring)."""
    sq, sk, g, hd, causal, window = case
    q, k, v = _inputs(1, sq, sk, g, hd, torch.bfloat16, seed=11 + sq + g)
    scale = 1.0 / math.sqrt(hd)
    o_p, l_p = _run(q, k, v, causal, scale, window, pack_gqa=True, rescale_threshold=0.0)
    o_p, l_p = o_p.clone(), l_p.clone()
    o_g, l_g = _run(q, k, v, causal, scale, window, rescale_threshold=0.0, persistent=False)  # one tile per CTA too
    assert torch.equal(o_p, o_g), f"out differs: max {(o_p.float() - o_g.float()).abs().max().item():.3e} {_id(case)}"
    assert torch.equal(l_p, l_g), f"lse differs: max {(l_p - l_g).abs().max().item():.3e} {_id(case)}"


def test_packed_fp16_and_switches():
    """fp16, and the packed kernel without intra-warpgroup overlap / pingpong."""
    sq, sk, g, hd = 300, 611, 4, 128
    scale = 1.0 / math.sqrt(hd)
    for dtype, kw in ((torch.float16, {}), (torch.bfloat16, {"intra_wg_overlap": False}),
                      (torch.bfloat16, {"pingpong": False})):
        q, k, v = _inputs(1, sq, sk, g, hd, dtype, seed=5)
        with torch.no_grad():
            ref, ref_lse, pt = _refs(q, k, v, True, scale, (-1, -1))
        o, l = _run(q, k, v, True, scale, (-1, -1), pack_gqa=True, **kw)
        _check(o, l, ref, ref_lse, pt, f"{dtype} {kw}")


def test_public_api_packed_forward_and_backward():
    """kernels.attention(config=AttnConfig(pack_gqa=True)) with grouped K/V: forward and backward (the backward is the
    plain GQA one) against the fp64 reference."""
    import kernels
    from attn_reference import grads_at_dtype

    b, sq, sk, hq, hkv, d = 1, 113, 257, 8, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    do = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 1.0 / math.sqrt(d)
    ref = grads_at_dtype(q.double(), k.double(), v.double(), do.double(), True, scale, torch.float64)
    pt = grads_at_dtype(q, k, v, do, True, scale, torch.bfloat16)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = kernels.attention(qq, kk, vv, causal=True, config=kernels.AttnConfig(pack_gqa=True))
    out.backward(do)
    for name, x, r, p in zip(("out", "dq", "dk", "dv"), (out.detach(), qq.grad, kk.grad, vv.grad), ref, pt):
        assert torch.isfinite(x).all(), name
        err, err_pt = (x.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + ATOL, f"{name}: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL}"


def test_group_one_is_the_plain_kernel():
    """pack_gqa=True without grouped K/V runs the plain kernel: bitwise its output, no error."""
    import kernels

    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    for causal in (False, True):
        plain = kernels.attention(q, k, v, causal=causal)
        packed = kernels.attention(q, k, v, causal=causal, config=kernels.AttnConfig(pack_gqa=True))
        assert torch.equal(plain, packed), causal
