"""GPU tests of the persistent forward (AttnConfig(persistent=True)): out and lse against the fp64 reference
(kernels.reference.attention_exact; out by the DESIGN.md rule max|out - ref| <= 2 * max|out_pt - ref| + atol with
out_pt = attention_naive at the input dtype; lse within 1e-3), out / lse preallocated and NaN-poisoned.

Cases: hd 64 / 128 / 256 / (192, 128), causal both, odd lengths (1000, 1, 4097, s_q != s_k both ways), a window and a
softcap, GQA; and with the SM count patched down to 1 or 3 (``kernels.interface._sm_count``, the documented hook) so
that each CTA walks many tiles: the pipelines' phases, the Q / O shared-memory hand-over and the pingpong token carried
over tiles. Also: persistent=None picks the persistent kernel at a short seqlen (the compile cache key says so).

    python -m pytest -q tests/test_persistent_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ATOL = 2e-3


def _run(cfg_kwargs, b, sq, sk, h, hkv, d, dv, causal, window=(-1, -1), cap=0.0, dtype=torch.bfloat16, seed=0):
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config
    from kernels.reference import attention_exact, attention_naive
    from kernels.validate import canonical_window

    g = torch.Generator(device="cuda").manual_seed(seed + sq + 7 * sk)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dtype, generator=g)
    scale = 1.0 / math.sqrt(d)
    rep = h // hkv
    kr, vr = (t.repeat_interleave(rep, dim=2) for t in (k, v))
    with torch.no_grad():
        ref, ref_lse = attention_exact(q, kr, vr, causal=causal, softmax_scale=scale, return_lse=True,
                                       window_size=window, softcap=cap)
        pt = attention_naive(q, kr, vr, causal=causal, softmax_scale=scale, window_size=window, softcap=cap)
    c_causal, left, right = canonical_window(causal, window)
    cfg = resolve_config(AttnConfig(**cfg_kwargs), d, c_causal)
    out = torch.full((b, sq, h, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    o, l = attention_forward(q, k, v, c_causal, scale, cfg, out=out, lse=lse, window_left=left, window_right=right,
                             softcap=cap)
    torch.cuda.synchronize()
    tag = f"b{b} sq{sq} sk{sk} h{h}/{hkv} d{d}/{dv} causal={causal} window={window} cap={cap} {cfg_kwargs}"
    assert torch.isfinite(o).all(), f"out: non-finite values (an element left unwritten?) {tag}"
    err = (o.double() - ref).abs().max().item()
    err_pt = (pt.double() - ref).abs().max().item()
    assert err <= 2 * err_pt + ATOL, f"out: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL} {tag}"
    assert not torch.isnan(l).any(), f"lse: NaN left (unwritten?) {tag}"
    empty = torch.isinf(ref_lse)  # rows that see no key: out 0, lse -inf
    assert torch.equal(torch.isinf(l) & (l < 0), empty), f"lse: -inf rows differ {tag}"
    dl = (l.double() - ref_lse)[~empty]
    tol = 1e-3 + cap * 1e-4
    assert dl.numel() == 0 or dl.abs().max().item() < tol, f"lse: max err {dl.abs().max().item():.3e} {tag}"


HDIMS = [(64, 64), (128, 128), (256, 256), (192, 128)]
# (b, s_q, s_k, h): odd lengths, a single row, s_q != s_k both ways
SHAPES = [(2, 1000, 1000, 3), (3, 1, 1, 2), (1, 4097, 4097, 2), (1, 17, 1500, 2), (2, 1500, 17, 2)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hdims", HDIMS, ids=[f"hd{d}x{dv}" for d, dv in HDIMS])
def test_persistent_matches_reference(hdims, causal):
    d, dv = hdims
    for b, sq, sk, h in SHAPES:
        _run({"persistent": True}, b, sq, sk, h, h, d, dv, causal)


@pytest.mark.parametrize("sms", [1, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", [
    ({}, 128, 128, (-1, -1), 0.0, 1),
    ({}, 64, 64, (-1, -1), 0.0, 1),
    ({}, 256, 256, (-1, -1), 0.0, 1),
    ({"intra_wg_overlap": False}, 128, 128, (-1, -1), 0.0, 1),
    ({"pingpong": False}, 64, 64, (-1, -1), 0.0, 1),
    ({}, 128, 128, (200, -1), 30.0, 4),  # window + softcap + GQA 4:1
    ({}, 64, 64, (200, -1), 30.0, 4),  # the same at hd64 (non-causal persistent by default up to 8k since session 61)
    ({"persistent_snake": True}, 64, 64, (-1, -1), 0.0, 1),  # causal: odd full rounds in reverse CTA order
    ({"persistent_snake": True}, 128, 128, (-1, -1), 0.0, 1),
], ids=["hd128", "hd64", "hd256", "no_overlap", "no_pingpong", "window_cap_gqa", "window_cap_gqa64", "snake64",
         "snake128"])
def test_few_ctas_walk_many_tiles(monkeypatch, sms, causal, case):
    """A grid of 1 or 3 CTAs (the SM count patched) walks every tile (dozens per CTA)."""
    import kernels.interface as iface

    monkeypatch.setattr(iface, "_sm_count", lambda index: sms)
    switches, d, dv, window, cap, group = case
    for b, sq, sk, h in [(2, 1000, 1000, 4), (1, 257, 777, 4), (2, 777, 257, 4)]:
        _run({"persistent": True, **switches}, b, sq, sk, h, h // group, d, dv, causal, window, cap)


def test_default_rule_runs_the_persistent_kernel_at_short_seqlen():
    from kernels.compile_cache import compile_records

    _run({}, 2, 1000, 1000, 4, 4, 64, 64, True)  # hd64 causal <= 1024: persistent, 128-row tiles, greedy walk
    _run({}, 1, 1100, 1100, 4, 4, 64, 64, True)  # 1025-16384: persistent, the table's 192-row tiles, greedy walk
    _run({}, 1, 16500, 16500, 1, 1, 64, 64, True)  # past the bound: the one-tile kernel
    _run({}, 1, 8192, 8192, 1, 1, 64, 64, False)  # hd64 non-causal <= 8192 (since session 61): persistent, round robin
    _run({}, 1, 8200, 8200, 1, 1, 64, 64, False)  # past the bound: the one-tile kernel
    _run({}, 2, 1000, 1000, 4, 4, 128, 128, True)  # hd128 causal: greedy walk, exp_in_branch + causal_split
    _run({}, 1, 1100, 1100, 2, 2, 128, 128, True, window=(256, -1))  # with a window: greedy, no exp_in_branch
    _run({}, 1, 1100, 1100, 2, 2, 128, 128, True, window=(256, -1), cap=30.0)
    _run({}, 2, 1000, 1000, 4, 4, 256, 256, True)  # hd256 / (192, 128) causal <= 16k: greedy walk
    _run({}, 2, 1000, 1000, 4, 4, 192, 128, True)
    keys = [str(r.key) for r in compile_records() if r.key[0] == "fwd"]  # (which config each call takes:
    assert any("('persistent', True)" in k and "('tile_m', 128)" in k for k in keys)  # test_persistent.py, CPU)
    assert any("('persistent_greedy', True)" in k and "('exp_in_branch', True)" in k for k in keys)
    assert any("persistent" not in k for k in keys)
    fwd = [r.key for r in compile_records() if r.key[0] == "fwd"]  # (kind, fields, dtype, hdim, hdim_v, causal, ...)
    assert any(("persistent", True) in k[1] and k[3] == 64 and k[5] is False for k in fwd)  # hd64 non-causal 8192
