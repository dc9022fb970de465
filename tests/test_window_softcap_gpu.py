"""GPU tests of the sliding window ``window_size=(left, right)`` and ``softcap`` (issue 12.3), forward and backward, against the fp64
reference (kernels.reference.attention_exact, FlashAttention semantics: query i sees keys i + s_k - s_q - left ..
i + s_k - s_q + right, -1 unbounded, causal right 0; softcap: scores softcap * tanh(q.k * scale / softcap)), by the
DESIGN.md rule max|out - ref| <= 2 * max|out_pt - ref| + atol with out_pt = attention_naive at the input dtype.

out / lse are preallocated and NaN-poisoned. Cases: every head dim, causal both, s_q != s_k both ways, odd lengths,
windows narrower than a tile, spanning several tiles, one-sided, (0, 0), and softcap 30 / 50 alone and with windows;
one case per non-default path (intra_wg_overlap off, pingpong off, GQA, tau 0, exp2 emulation).

Backward (kernels/sm90/backward.py; out / lse from the fp64 reference, so the backward is tested alone): dq / dk / dv
preallocated and NaN-poisoned, vs autograd of attention_exact (fp64) by the same rule with x_pt = autograd of
attention_naive at the input dtype; every head dim, causal both, s_q != s_k both ways (rows that see no key: dq 0; K/V
tiles that no query sees: dk / dv 0), odd lengths, every window kind, softcap alone and with windows, GQA, bwd_tile_m 64
at hd 64, exp2 emulation; deterministic=True with a window / softcap: bitwise-equal repeats. The public
``kernels.attention`` path is checked end to end (our forward, then autograd through our backward).
ids name head dim, causal, lengths, window and softcap, e.g. ``-k "cap30"``, ``-k "w64_64"``, ``-k hd256``.

    python -m pytest -q tests/test_window_softcap_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

ATOL = 2e-3

# (batch, s_q, s_k, heads, heads_kv, (d, dv), causal, window, softcap, switches)
CASES = [
    (2, 1000, 1000, 4, 4, (128, 128), False, (128, 128), 0.0, {}),
    (2, 1000, 1000, 4, 4, (128, 128), True, (256, -1), 0.0, {}),
    (1, 777, 1301, 4, 4, (128, 128), False, (100, 37), 0.0, {}),
    (1, 1301, 777, 4, 4, (128, 128), True, (300, 0), 0.0, {}),  # s_q > s_k: early rows see no key
    (2, 513, 513, 4, 4, (64, 64), False, (0, 0), 0.0, {}),
    (1, 999, 2049, 4, 4, (64, 64), True, (1000, -1), 0.0, {}),
    (1, 600, 900, 2, 2, (64, 64), False, (-1, 200), 0.0, {}),
    (1, 901, 901, 2, 2, (256, 256), False, (-1, -1), 30.0, {}),
    (2, 333, 700, 2, 2, (256, 256), True, (64, -1), 50.0, {}),
    (1, 640, 640, 2, 2, (256, 256), False, (700, -1), 0.0, {}),
    (1, 517, 517, 4, 4, (192, 128), True, (-1, -1), 30.0, {}),
    (1, 517, 1025, 4, 4, (192, 128), False, (128, 128), 50.0, {}),
    (2, 1000, 1000, 4, 4, (128, 128), True, (-1, -1), 50.0, {}),
    (2, 1000, 1000, 4, 4, (128, 128), False, (-1, -1), 30.0, {}),
    (1, 1, 500, 2, 2, (128, 128), False, (10, 10), 30.0, {}),
    (1, 1000, 1000, 4, 4, (128, 128), True, (200, -1), 30.0, {"intra_wg_overlap": False}),
    (1, 1000, 1000, 4, 4, (64, 64), False, (150, 150), 0.0, {"pingpong": False}),
    (1, 800, 800, 8, 2, (128, 128), True, (128, -1), 30.0, {}),  # GQA 4:1
    (1, 800, 900, 4, 4, (128, 128), False, (64, 300), 30.0, {"rescale_threshold": 0.0}),
    (1, 800, 900, 4, 4, (64, 64), True, (400, -1), 50.0, {"exp2_emu_fraction": 0.25}),
]


def _id(c):
    b, sq, sk, h, hkv, (d, dv), causal, (wl, wr), cap, sw = c
    hd = f"hd{d}" if d == dv else f"hd{d}x{dv}"
    parts = [hd, "causal" if causal else "full", f"sq{sq}", f"sk{sk}", f"w{wl}_{wr}", f"cap{cap:g}"]
    if hkv != h:
        parts.append(f"g{h // hkv}")
    return "-".join(parts + [f"{k}={v}" for k, v in sw.items()])


def _inputs(b, sq, sk, h, hkv, d, dv, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def _refs(q, k, v, causal, scale, window, cap):
    from kernels.reference import attention_exact, attention_naive

    rep = q.shape[2] // k.shape[2]
    kr, vr = (t.repeat_interleave(rep, dim=2) for t in (k, v))
    ref, ref_lse = attention_exact(q, kr, vr, causal=causal, softmax_scale=scale, return_lse=True,
                                   window_size=window, softcap=cap)
    pt = attention_naive(q, kr, vr, causal=causal, softmax_scale=scale, window_size=window, softcap=cap)
    return ref, ref_lse, pt


def _check(o, l, ref, ref_lse, pt, tag, cap=0.0):
    """out by the DESIGN.md rule; lse within 1e-3 (+ cap * 1e-4 with a softcap: MUFU.TANH's ~2^-11 relative error,
    scaled by the cap); rows that see no key: out 0, lse -inf; nothing left NaN."""
    assert torch.isfinite(o).all(), f"out: non-finite values (an element left unwritten?) {tag}"
    err = (o.double() - ref).abs().max().item()
    err_pt = (pt.double() - ref).abs().max().item()
    assert err <= 2 * err_pt + ATOL, f"out: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL} {tag}"
    assert not torch.isnan(l).any(), f"lse: NaN left (unwritten?) {tag}"
    empty = torch.isinf(ref_lse)  # rows that see no key: out 0, lse -inf
    assert torch.equal(torch.isinf(l) & (l < 0), empty), f"lse: -inf rows differ from the reference's {tag}"
    assert (o.double()[empty.transpose(1, 2)] == 0).all(), f"out: rows without keys must be 0 {tag}"
    d = (l.double() - ref_lse)[~empty]
    tol = 1e-3 + cap * 1e-4
    assert d.numel() == 0 or d.abs().max().item() < tol, f"lse: max err {d.abs().max().item():.3e} > {tol:.1e} {tag}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_window_softcap_forward(case, dtype):
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config
    from kernels.validate import canonical_window

    b, sq, sk, h, hkv, (d, dv), causal, window, cap, sw = case
    dt = getattr(torch, dtype)
    q, k, v = _inputs(b, sq, sk, h, hkv, d, dv, dt, seed=sq + sk)
    scale = 1.0 / math.sqrt(d)
    with torch.no_grad():
        ref, ref_lse, pt = _refs(q, k, v, causal, scale, window, cap)
    c_causal, left, right = canonical_window(causal, window)
    cfg = resolve_config(AttnConfig(**sw), d, c_causal)
    out = torch.full((b, sq, h, dv), float("nan"), device="cuda", dtype=dt)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    o, l = attention_forward(q, k, v, c_causal, scale, cfg, out=out, lse=lse, window_left=left, window_right=right,
                             softcap=cap)
    torch.cuda.synchronize()
    assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
    _check(o, l, ref, ref_lse, pt, _id(case), cap)


def test_window_softcap_public_api():
    """kernels.attention with window / softcap: the forward matches the reference."""
    import kernels

    q, k, v = _inputs(2, 700, 900, 4, 2, 128, 128, torch.bfloat16, seed=7)
    scale = 1.0 / math.sqrt(128)
    for kw in (dict(causal=True, window_size=(128, 128)), dict(window_size=(64, 32), softcap=30.0), dict(softcap=50.0),
               dict(window_size=(-1, 0))):
        out, lse = kernels.attention(q, k, v, return_lse=True, **kw)
        ref, ref_lse, pt = _refs(q, k, v, kw.get("causal", False), scale, kw.get("window_size", (-1, -1)),
                                 kw.get("softcap", 0.0))
        _check(out, lse, ref, ref_lse, pt, str(kw), kw.get("softcap", 0.0))


def test_window_equal_to_full_when_wide():
    """(-1, -1) / softcap 0 is the plain kernel exactly, (-1, 0) is causal exactly; a window wider than the sequences
    (another compiled kernel) agrees with the plain one within rounding."""
    import kernels

    q, k, v = _inputs(1, 500, 500, 2, 2, 64, 64, torch.bfloat16, seed=9)
    plain = kernels.attention(q, k, v)
    assert torch.equal(kernels.attention(q, k, v, window_size=(-1, -1), softcap=0.0), plain)
    assert torch.equal(kernels.attention(q, k, v, window_size=(-1, 0)), kernels.attention(q, k, v, causal=True))
    wide = kernels.attention(q, k, v, window_size=(5000, 5000))
    assert (wide.double() - plain.double()).abs().max().item() < 1e-2


# ---- backward ---------------------------------------------------------------------------------------------------------
# (batch, s_q, s_k, heads, heads_kv, (d, dv), causal, window, softcap, switches, dtypes)
BF, BH = ("bfloat16",), ("bfloat16", "float16")
BWD_CASES = [
    (1, 1000, 1000, 2, 2, (128, 128), False, (128, 128), 0.0, {}, BH),
    (1, 777, 1301, 2, 2, (128, 128), True, (200, -1), 30.0, {}, BF),
    (1, 1301, 777, 2, 2, (128, 128), False, (100, 37), 0.0, {}, BF),  # s_q > s_k: early rows see no key (dq 0)
    (1, 700, 700, 2, 2, (128, 128), False, (0, 0), 0.0, {}, BF),
    (2, 999, 999, 2, 2, (128, 128), False, (-1, -1), 50.0, {}, BH),
    (1, 999, 2049, 2, 2, (64, 64), True, (300, -1), 0.0, {}, BF),  # keys < 750 seen by no row: empty Q ranges, dk/dv 0
    (2, 513, 513, 2, 2, (64, 64), True, (-1, -1), 30.0, {}, BH),
    (1, 600, 900, 2, 2, (64, 64), False, (-1, 200), 50.0, {"bwd_tile_m": 64}, BF),
    (1, 901, 901, 2, 2, (256, 256), False, (64, 32), 30.0, {}, BF),
    (1, 333, 700, 2, 2, (256, 256), True, (64, -1), 0.0, {}, BF),
    (1, 517, 1025, 2, 2, (192, 128), False, (128, 128), 50.0, {}, BF),
    (1, 517, 517, 2, 2, (192, 128), True, (-1, -1), 30.0, {}, BF),
    (1, 800, 800, 4, 2, (128, 128), True, (128, -1), 30.0, {}, BF),  # GQA 2:1
    (1, 800, 900, 2, 2, (64, 64), True, (400, -1), 50.0, {"exp2_emu_fraction": 0.25}, BF),
    # (192, 128) without softcap: the 64 x 128 kernel (kernels/sm90/bwd_wide192.py; with softcap bwd_wide.py's runs)
    (1, 517, 1025, 2, 2, (192, 128), False, (128, 128), 0.0, {}, BH),
    (1, 700, 900, 4, 2, (192, 128), True, (300, -1), 0.0, {}, BF),  # GQA 2:1, causal window, s_q < s_k
]
BWD_PARAMS = [pytest.param(c[:-1], dt, id=f"{_id(c[:-1])}-{dt}") for c in BWD_CASES for dt in c[-1]]


def _bwd_refs(q, k, v, do, causal, scale, window, cap):
    """(out64, lse64, grads64, grads_pt): the fp64 reference's out / lse and autograd gradients, and those of plain
    PyTorch at the input dtype (dk / dv with K/V's heads: autograd sums the repeated heads)."""
    from kernels.reference import attention_exact, attention_naive

    rep = q.shape[2] // k.shape[2]
    res = []
    for fn, dt in ((attention_exact, torch.float64), (attention_naive, q.dtype)):
        qq, kk, vv = (t.detach().to(dt).requires_grad_(True) for t in (q, k, v))
        kr, vr = (t.repeat_interleave(rep, dim=2) for t in (kk, vv))
        out, lse = fn(qq, kr, vr, causal=causal, softmax_scale=scale, return_lse=True, window_size=window,
                      softcap=cap)
        out.backward(do.to(dt))
        res.append((out.detach(), lse.detach(), (qq.grad, kk.grad, vv.grad)))
    (out64, lse64, g64), (_, _, gpt) = res
    return out64, lse64, g64, gpt


def _run_bwd(case, dtype, cfg_extra=None, seed=None, repeats=1):
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward
    from kernels.validate import canonical_window

    b, sq, sk, h, hkv, (d, dv), causal, window, cap, sw = case
    dt = getattr(torch, dtype)
    q, k, v = _inputs(b, sq, sk, h, hkv, d, dv, dt, seed=seed if seed is not None else sq * 7 + sk)
    do = torch.randn(b, sq, h, dv, device="cuda", dtype=dt)
    scale = 1.0 / math.sqrt(d)
    out64, lse64, g64, gpt = _bwd_refs(q, k, v, do, causal, scale, window, cap)
    c_causal, left, right = canonical_window(causal, window)
    cfg = AttnConfig(**{**sw, **(cfg_extra or {})})
    runs = []
    for _ in range(repeats):
        bufs = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        got = attention_backward(q, k, v, out64.to(dt), do, lse64.float(), c_causal, scale, cfg, dq=bufs[0],
                                 dk=bufs[1], dv=bufs[2], window_left=left, window_right=right, softcap=cap)
        torch.cuda.synchronize()
        assert all(x.data_ptr() == y.data_ptr() for x, y in zip(got, bufs))
        runs.append(got)
    for name, x, r, p in zip(("dq", "dk", "dv"), runs[0], g64, gpt):
        assert torch.isfinite(x).all(), f"{name}: non-finite values (an element left unwritten?) {_id(case)} {dtype}"
        err = (x.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + ATOL, f"{name}: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL} {_id(case)} {dtype}"
    return runs


@pytest.mark.parametrize("case,dtype", BWD_PARAMS)
def test_window_softcap_backward(case, dtype):
    _run_bwd(case, dtype)


@pytest.mark.parametrize("case", [BWD_CASES[1][:-1], BWD_CASES[5][:-1], BWD_CASES[8][:-1], BWD_CASES[-1][:-1]],
                         ids=lambda c: _id(c))
def test_window_softcap_backward_deterministic(case):
    """deterministic=True with a window (its dQ turns count only the K/V tiles that visit a Q tile) and softcap:
    correct, and bitwise-equal over repeats."""
    runs = _run_bwd(case, "bfloat16", cfg_extra={"deterministic": True}, repeats=10)
    for got in runs[1:]:
        for x, y in zip(runs[0], got):
            assert torch.equal(x, y)


def test_window_softcap_public_api_backward():
    """End to end: kernels.attention (our forward, window / softcap, GQA) and autograd through our backward."""
    import kernels

    q, k, v = _inputs(1, 700, 900, 4, 2, 128, 128, torch.bfloat16, seed=11)
    do = torch.randn(1, 700, 4, 128, device="cuda", dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(128)
    for kw in (dict(causal=True, window_size=(128, 128)), dict(window_size=(64, 32), softcap=30.0)):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        kernels.attention(qq, kk, vv, **kw).backward(do)
        _, _, g64, gpt = _bwd_refs(q, k, v, do, kw.get("causal", False), scale, kw["window_size"],
                                   kw.get("softcap", 0.0))
        for name, x, r, p in zip(("dq", "dk", "dv"), (qq.grad, kk.grad, vv.grad), g64, gpt):
            err = (x.double() - r).abs().max().item()
            err_pt = (p.double() - r).abs().max().item()
            assert err <= 2 * err_pt + ATOL, f"{name}: {err:.3e} > 2*{err_pt:.3e}+{ATOL} {kw}"
