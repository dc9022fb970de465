"""GPU tests of native GQA / MQA (issue 12.1): K/V with h_kv heads dividing q's h, forward and backward, against an
fp64 reference with K/V repeated (Q head i reads K/V head i // (h / h_kv)), by the DESIGN.md rule:
max|x - ref| <= 2 * max|x_pt - ref| + atol, x_pt plain PyTorch (autograd) at the input dtype with K/V repeated.

Outputs (out, lse, dq, dk, dv) are preallocated and NaN-poisoned. The backward gets out / lse from fp64 math so it is
tested alone; one case goes through kernels.attention end to end (autograd). ids name the head dim, the group, the
causal flag and the lengths, e.g. ``-k "hd256"``, ``-k "mqa"``, ``-k "g8"``, ``-k deterministic``. Kept small (about
a dozen compiled (config, head dim, causal, group) keys) so the file runs in about two minutes.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from attn_reference import attention_at_dtype, grads_at_dtype  # noqa: E402

pytestmark = pytest.mark.gpu

ATOL = 2e-3


def _inputs(b, sq, sk, hq, hkv, d, dv, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, s, h, e, device="cuda", dtype=dtype, generator=g)
            for s, h, e in ((sq, hq, d), (sk, hkv, d), (sk, hkv, dv), (sq, hq, dv))]


def _check(name, x, r, p, tag):
    assert x.shape == r.shape, (name, tuple(x.shape), tuple(r.shape))
    assert torch.isfinite(x).all(), f"{name}: non-finite values (an element left unwritten?) {tag}"
    err = (x.double() - r).abs().max().item()
    err_pt = (p.double() - r).abs().max().item()
    assert err <= 2 * err_pt + ATOL, f"{name}: max err {err:.3e} > 2*{err_pt:.3e}+{ATOL} {tag}"


# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head dims, causal, config switches): groups 2 / 4 / 8 and MQA
# (heads_kv 1), every head dim both causal and not, odd lengths, seqlen_q != seqlen_k both ways, a length-1 query
CASES = [
    (2, 128, 128, 4, 2, (64, 64), False, {}),
    (1, 113, 257, 8, 2, (64, 64), True, {}),
    (2, 301, 301, 8, 1, (128, 128), True, {}),
    (1, 200, 77, 4, 1, (128, 128), False, {}),
    (2, 17, 17, 4, 2, (256, 256), True, {}),
    (1, 129, 300, 8, 1, (256, 256), False, {}),
    (1, 150, 150, 8, 2, (192, 128), True, {}),
    (1, 1, 333, 4, 2, (192, 128), False, {}),
    (2, 255, 511, 8, 2, (128, 128), False, {}),
    (1, 300, 300, 8, 2, (128, 128), True, {"two_cta": True}),
]


def _id(c):
    b, sq, sk, hq, hkv, (d, dv), causal, sw = c
    hd = f"hd{d}" if d == dv else f"hd{d}x{dv}"
    kind = "mqa" if hkv == 1 else "gqa"
    return "-".join([hd, f"g{hq // hkv}", kind, "causal" if causal else "full", f"sq{sq}", f"sk{sk}", *sw])


def _cfg(**kw):
    from kernels import AttnConfig

    return AttnConfig(**kw)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_gqa_forward(case):
    from kernels.interface import attention_forward, resolve_config

    b, sq, sk, hq, hkv, (d, dv), causal, sw = case
    dtype = torch.bfloat16
    q, k, v, _ = _inputs(b, sq, sk, hq, hkv, d, dv, dtype, seed=1)
    scale = 1.0 / math.sqrt(d)
    with torch.no_grad():
        ref, ref_lse = attention_at_dtype(q.double(), k.double(), v.double(), causal, scale)
        pt, _ = attention_at_dtype(q, k, v, causal, scale)
    out = torch.full((b, sq, hq, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    cfg = resolve_config(_cfg(**sw), d, causal)
    o, l = attention_forward(q, k, v, causal, scale, cfg, out=out, lse=lse)
    torch.cuda.synchronize()
    assert o.data_ptr() == out.data_ptr() and l.data_ptr() == lse.data_ptr()
    _check("out", o, ref, pt, _id(case))
    assert torch.isfinite(l).all() and (l.double() - ref_lse).abs().max().item() < 1e-3, _id(case)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_gqa_backward(case):
    from kernels.sm90.backward import attention_backward

    b, sq, sk, hq, hkv, (d, dv), causal, sw = case
    dtype = torch.bfloat16
    q, k, v, do = _inputs(b, sq, sk, hq, hkv, d, dv, dtype, seed=2)
    scale = 1.0 / math.sqrt(d)
    with torch.no_grad():
        out64, lse = attention_at_dtype(q.double(), k.double(), v.double(), causal, scale)
    ref = grads_at_dtype(q.double(), k.double(), v.double(), do.double(), causal, scale, torch.float64)[1:]
    pt = grads_at_dtype(q, k, v, do, causal, scale, dtype)[1:]
    poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    ours = attention_backward(q, k, v, out64.to(dtype), do, lse.float().contiguous(), causal, scale, _cfg(**sw),
                              *poisoned)
    torch.cuda.synchronize()
    assert all(o.data_ptr() == p.data_ptr() for o, p in zip(ours, poisoned)), "preallocated outputs not used"
    assert tuple(ours[1].shape) == (b, sk, hkv, d) and tuple(ours[2].shape) == (b, sk, hkv, dv)
    for name, x, r, p in zip(("dq", "dk", "dv"), ours, ref, pt):
        _check(name, x, r, p, _id(case))


def test_gqa_end_to_end_autograd():
    """kernels.attention with grouped K/V, forward and backward through autograd (the public path)."""
    import kernels

    b, sq, sk, hq, hkv, d = 1, 113, 257, 8, 2, 64
    dtype = torch.bfloat16
    q, k, v, do = _inputs(b, sq, sk, hq, hkv, d, d, dtype, seed=3)
    scale = 1.0 / math.sqrt(d)
    ref = grads_at_dtype(q.double(), k.double(), v.double(), do.double(), True, scale, torch.float64)
    pt = grads_at_dtype(q, k, v, do, True, scale, dtype)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = kernels.attention(qq, kk, vv, causal=True)
    out.backward(do)
    for name, x, r, p in zip(("out", "dq", "dk", "dv"), (out.detach(), qq.grad, kk.grad, vv.grad), ref, pt):
        _check(name, x, r, p, "end-to-end")


def test_gqa_deterministic_bitwise():
    """deterministic=True with GQA: dq, dk, dv bitwise equal over repeats (the group sum is a fixed-order reduction)."""
    from kernels.sm90.backward import attention_backward

    b, sq, sk, hq, hkv, d, causal = 2, 1000, 1000, 8, 2, 128, True
    dtype = torch.bfloat16
    q, k, v, do = _inputs(b, sq, sk, hq, hkv, d, d, dtype, seed=4)
    scale = 1.0 / math.sqrt(d)
    with torch.no_grad():
        out64, lse = attention_at_dtype(q.double(), k.double(), v.double(), causal, scale)
    out, lse = out64.to(dtype), lse.float().contiguous()
    cfg = _cfg(deterministic=True)
    first = [t.clone() for t in attention_backward(q, k, v, out, do, lse, causal, scale, cfg)]
    for _ in range(50):
        again = attention_backward(q, k, v, out, do, lse, causal, scale, cfg)
        for name, a, x in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, x), f"{name}: not bitwise equal across repeats"
