"""GPU tests of the persistent backward (AttnConfig(bwd_persistent=True), kernels/sm90/bwd.py _set_persistent).

dq / dk / dv against fp64 by the DESIGN.md rule (test_bwd_gpu._run_case: outputs preallocated and NaN-poisoned) at hd 64
/ 128, causal both, odd lengths and s_q != s_k, the hd128 64-row tile, a window and GQA; with the SM count patched down
(``kernels.sm90.backward._sm_count``) to 1 or 3 so that each CTA walks many K/V tiles: the K/V hand-back after the
dK / dV store, the Q / dO pipeline phases, the dQ staging buffers and the lpt_heads regrouping carried over tiles.
dk / dv are also compared bitwise with the one-tile kernel's (same arithmetic per K/V tile; dQ's reductions arrive in
another order, so dq only by the rule).

    python -m pytest -q tests/test_bwd_persistent_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, heads): odd lengths, s_q != s_k both ways, 1 query, more tiles than any patched SM count
SHAPES = [(2, 333, 397, 3), (1, 1000, 1000, 2), (2, 300, 77, 2), (3, 1, 129, 2)]


def _cfg(**kw):
    from kernels import AttnConfig

    return AttnConfig(bwd_persistent=True, **kw)


@pytest.mark.parametrize("sms", [1, 3, None], ids=["sm1", "sm3", "small"])
@pytest.mark.parametrize("hdim,dtype", [(64, torch.float16), (128, torch.bfloat16)], ids=["64", "128"])
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_persistent_rule(monkeypatch, sms, hdim, dtype, causal):
    import kernels.sm90.backward as bwd

    if sms is not None:
        monkeypatch.setattr(bwd, "_sm_count", lambda index: sms)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        if causal and sq > sk:  # rows with no key: the reference is NaN there
            continue
        _run_case(b, sq, sk, h, hdim, causal, dtype, _cfg(), seed=40 + i)


@pytest.mark.parametrize("switch", [dict(bwd_tile_m=64), dict(bwd_lpt_heads=2), dict(window_left=100,
                                                                                     window_right=20)],
                         ids=["t64", "lpt2", "window"])
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_persistent_switches(monkeypatch, switch, causal):
    """hd128 with 64-row Q tiles, the lpt_heads regrouping (causal) and a sliding window, 3 CTAs."""
    import kernels
    import kernels.sm90.backward as bwd
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    monkeypatch.setattr(bwd, "_sm_count", lambda index: 3)
    switch = dict(switch)
    win = {k: switch.pop(k) for k in ("window_left", "window_right") if k in switch}
    if win:  # dk / dv bitwise equal to the one-tile kernel's, dq by the reduction-order tolerance
        if causal:
            win.pop("window_right")
        b, sq, sk, h, d = 2, 700, 700, 2, 128
        g = torch.Generator(device="cuda").manual_seed(5)
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                       for s in (sq, sk, sk, sq))
        scale = 1.0 / math.sqrt(d)
        with torch.no_grad():
            out, lse = kernels.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True,
                                         window_size=(win.get("window_left", -1), win.get("window_right", -1)))
        ref = attention_backward(q, k, v, out, do, lse, causal, scale, AttnConfig(), **win)
        got = attention_backward(q, k, v, out, do, lse, causal, scale, _cfg(), **win)
        _compare(got, ref)
        return
    for i, (b, sq, sk, h) in enumerate(SHAPES[:3]):
        if causal and sq > sk:
            continue
        _run_case(b, sq, sk, h, 128, causal, torch.bfloat16, _cfg(**switch), seed=60 + i)


@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sms", [3, None], ids=["sm3", "small"])
def test_bwd_persistent_matches_one_tile(monkeypatch, hdim, causal, sms):
    """dk / dv bitwise equal to the one-tile kernel's, dq within a few ulps of its (reduction order), GQA 4:1."""
    import kernels
    import kernels.sm90.backward as bwd
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    if sms is not None:
        monkeypatch.setattr(bwd, "_sm_count", lambda index: sms)
    b, s, h, hk = 2, 1536, 8, 2
    g = torch.Generator(device="cuda").manual_seed(11)
    q, do = (torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hk, hdim, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    scale = 1.0 / math.sqrt(hdim)
    with torch.no_grad():
        out, lse = kernels.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    ref = attention_backward(q, k, v, out, do, lse, causal, scale, AttnConfig())
    got = attention_backward(q, k, v, out, do, lse, causal, scale, _cfg())
    _compare(got, ref)


def _compare(got, ref):
    """dk / dv bitwise equal (per K/V tile the same arithmetic), dq within 1% of its largest value (the bulk
    reductions of a Q tile's contributors arrive in another order); all finite."""
    torch.cuda.synchronize()
    for name, x in zip(("dq", "dk", "dv"), got):
        assert torch.isfinite(x).all(), f"{name}: non-finite values"
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2]), "dk / dv differ from the one-tile kernel"
    err = (got[0].float() - ref[0].float()).abs().max().item()
    assert err <= 1e-2 * ref[0].float().abs().max().item(), f"dq: max diff {err:.3e}"
