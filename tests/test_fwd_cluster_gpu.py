"""GPU tests of the 2x1-cluster forward (AttnConfig(cluster_m=2): K/V TMA multicast between the CTAs of adjacent Q
tiles): out and lse against the fp64 reference (kernels.reference.attention_exact; out by the DESIGN.md rule
max|out - ref| <= 2 * max|out_pt - ref| + atol with out_pt = attention_naive at the input dtype; lse within 1e-3), out /
lse preallocated and NaN-poisoned; and bitwise equal to the cluster_m=1 kernel of the same config (the cluster changes
who loads K/V, not the arithmetic).

Cases: hd 64 / 128 / 256 / (192, 128), odd m-block counts (the padding CTA of the last cluster: seqlen_q 1, 129, 300,
500, 4097 give odd counts at tile_m 128 or 192) -- with out / lse views at the start of larger NaN buffers, whose tail
must stay NaN (the padding CTA stores nothing); s_q != s_k both ways; GQA 2:1; pingpong / intra-warpgroup overlap off;
softcap; fp16. Causal and sliding windows are ConfigErrors (the two Q tiles would need different K/V ranges).

    python -m pytest -q tests/test_fwd_cluster_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ATOL = 2e-3


def _inputs(b, sq, sk, h, hkv, d, dv, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed + sq + 7 * sk)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def _poisoned(shape, dtype, slack):
    """A contiguous NaN tensor of ``shape`` at the start of a NaN buffer ``slack`` elements longer."""
    n = math.prod(shape)
    buf = torch.full((n + slack,), float("nan"), device="cuda", dtype=dtype)
    return buf[:n].view(shape), buf


def _forward(q, k, v, cfg_kwargs, scale, cap, slack=0):
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config

    b, sq, h, _ = q.shape
    dv = v.shape[3]
    cfg = resolve_config(AttnConfig(**cfg_kwargs), q.shape[3], False)
    out, out_buf = _poisoned((b, sq, h, dv), q.dtype, slack * h * dv)
    lse, lse_buf = _poisoned((b, h, sq), torch.float32, slack)
    o, l = attention_forward(q, k, v, False, scale, cfg, out=out, lse=lse, softcap=cap)
    torch.cuda.synchronize()
    return o, l, out_buf[out.numel():], lse_buf[lse.numel():]


def _run(cfg_kwargs, b, sq, sk, h, hkv, d, dv, cap=0.0, dtype=torch.bfloat16, seed=0):
    from kernels.reference import attention_exact, attention_naive

    q, k, v = _inputs(b, sq, sk, h, hkv, d, dv, dtype, seed)
    scale = 1.0 / math.sqrt(d)
    rep = h // hkv
    kr, vr = (t.repeat_interleave(rep, dim=2) for t in (k, v))
    with torch.no_grad():
        ref, ref_lse = attention_exact(q, kr, vr, causal=False, softmax_scale=scale, return_lse=True, softcap=cap)
        pt = attention_naive(q, kr, vr, causal=False, softmax_scale=scale, softcap=cap)
    kw = {"cluster_m": 2, **cfg_kwargs}
    slack = 256 if b == 1 else 0  # b == 1: rows past seqlen_q of the last tile lie in the buffer's tail
    o, l, o_tail, l_tail = _forward(q, k, v, kw, scale, cap, slack)
    tag = f"b{b} sq{sq} sk{sk} h{h}/{hkv} d{d}/{dv} cap={cap} {dtype} {kw}"
    assert torch.isfinite(o).all(), f"out: non-finite values (an element left unwritten?) {tag}"
    assert torch.isnan(o_tail).all() and torch.isnan(l_tail).all(), f"written past the end (padding CTA?) {tag}"
    err = (o.double() - ref).abs().max().item()
    err_pt = (pt.double() - ref).abs().max().item()
    assert err <= 2 * err_pt + ATOL, f"out: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL} {tag}"
    assert torch.isfinite(l).all(), f"lse: non-finite (unwritten?) {tag}"
    dl = (l.double() - ref_lse).abs().max().item()
    assert dl < 1e-3 + cap * 1e-4, f"lse: max err {dl:.3e} {tag}"
    # the same kernel without the cluster: bitwise the same result
    o1, l1, _, _ = _forward(q, k, v, {**kw, "cluster_m": 1}, scale, cap)
    assert torch.equal(o, o1) and torch.equal(l, l1), f"cluster_m=2 differs from cluster_m=1 {tag}"


HDIMS = [(64, 64), (128, 128), (256, 256), (192, 128)]
# (b, s_q, s_k, h): odd m-block counts at tile_m 128 (1, 129 -> 2, 300 -> 3, 4097 -> 33) and 192 (1, 129 -> 1,
# 500 -> 3); even ones (1000); s_q != s_k both ways
SHAPES = [(2, 1000, 1000, 3), (1, 1, 1, 2), (1, 129, 129, 2), (1, 300, 777, 2), (1, 500, 500, 2), (1, 4097, 4097, 2),
          (1, 17, 1500, 2), (2, 1500, 17, 2)]


def test_shapes_have_odd_m_block_counts():
    for tile_m in (128, 192):
        assert any(-(-sq // tile_m) % 2 for _, sq, _, _ in SHAPES), tile_m


@pytest.mark.parametrize("hdims", HDIMS, ids=[f"hd{d}x{dv}" for d, dv in HDIMS])
def test_cluster_matches_reference(hdims):
    d, dv = hdims
    for b, sq, sk, h in SHAPES:
        _run({}, b, sq, sk, h, h, d, dv)


@pytest.mark.parametrize("case", [
    ({}, 128, 128, 2, 0.0),  # GQA 2:1
    ({}, 64, 64, 2, 0.0),
    ({"pingpong": False}, 128, 128, 1, 0.0),
    ({"intra_wg_overlap": False}, 64, 64, 1, 0.0),
    ({"pingpong": False, "intra_wg_overlap": False}, 256, 256, 2, 0.0),
    ({}, 128, 128, 1, 30.0),  # softcap
    ({}, 192, 128, 2, 50.0),
], ids=["gqa2-hd128", "gqa2-hd64", "no_pingpong", "no_overlap", "both_off-gqa2-hd256", "softcap", "softcap-gqa2-hd192"])
def test_cluster_switches(case):
    switches, d, dv, group, cap = case
    for b, sq, sk, h in [(2, 1000, 1000, 4), (1, 300, 777, 4), (2, 777, 300, 4), (1, 1, 1, 2)]:
        _run(switches, b, sq, sk, h, h // group, d, dv, cap)


def test_cluster_fp16():
    _run({}, 2, 500, 1000, 2, 2, 128, 128, dtype=torch.float16)
    _run({}, 1, 129, 129, 2, 1, 64, 64, dtype=torch.float16)


def test_causal_and_window_are_config_errors():
    from kernels import AttnConfig
    from kernels.config import ConfigError
    from kernels.ops import attention

    q, k, v = _inputs(1, 256, 256, 2, 2, 128, 128, torch.bfloat16, 0)
    two = AttnConfig(cluster_m=2)
    with pytest.raises(ConfigError, match="causal"):
        attention(q, k, v, causal=True, config=two)
    with pytest.raises(ConfigError, match="window"):
        attention(q, k, v, config=two, window_size=(64, 64))
    out = attention(q, k, v, config=two)  # the public entry runs the cluster kernel
    ref = attention(q, k, v)
    assert torch.equal(out, ref)
