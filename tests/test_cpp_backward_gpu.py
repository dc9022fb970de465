"""GPU checks of the C++ backward node (the eager default; FA4LAB_CPP_BWD=0 off; kernels/sm90/cpp_backward.py): it
loads with the real TVM FFI, the eager call takes it (grad_fn) once the call's backward is compiled (the first call
of a key keeps the Python node), and out / dq / dk / dv equal the Python node's (same kernels, same arguments): bit
for bit where the kernels are deterministic (out, dk, dv always; dq with deterministic=True), dq within the accuracy
of atomics' order otherwise; GQA / MQA, windows and softcap too; a call it does not cover (q not contiguous) keeps
the Python node."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.config import AttnConfig
from kernels.sm90 import cpp_backward as cb

pytestmark = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, heads): odd lengths, s_q != s_k, one row, a multi-tile causal call
SHAPES = [(2, 17, 17, 4), (1, 1, 300, 2), (2, 1000, 700, 3), (1, 4097, 4097, 2)]
# (hdim, hdim_v, causal, deterministic): every head dim's kernel family (hd256: the 2-CTA default), both masks at
# hd 64 / 128, deterministic at 128 (spt causal, rotate / two writers non-causal) and 256 (the 80-row pairs)
CASES = [(64, 64, False, False), (64, 64, True, False), (128, 128, False, False), (128, 128, True, False),
         (128, 128, False, True), (128, 128, True, True), (192, 128, True, False), (256, 256, False, False),
         (256, 256, True, True)]


@pytest.fixture
def node():
    cb.force = True
    ext = cb.extension()
    if ext is None:
        cb.force = None
        pytest.fail(f"the C++ backward node did not load on the GPU host: {cb.status()}")
    yield ext
    cb.force = None


def _grads(q, k, v, do, causal, config, cpp: bool, **kw):
    cb.force = cpp
    try:
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = kernels.attention(*leaves, causal=causal, config=config, **kw)
        node = out.grad_fn.name()
        dq, dk, dv = torch.autograd.grad(out, leaves, do)
        torch.cuda.synchronize()
        return out.detach(), dq, dk, dv, node
    finally:
        cb.force = True


@pytest.mark.parametrize("d, dv_dim, causal, det", CASES,
                         ids=[f"{c[0]}x{c[1]}-{'c' if c[2] else 'nc'}{'-det' if c[3] else ''}" for c in CASES])
def test_cpp_node_matches_the_python_node(node, d, dv_dim, causal, det):
    torch.manual_seed(0)
    config = AttnConfig(deterministic=True) if det else None
    for b, sq, sk, h in SHAPES:
        if causal and sq > sk:
            continue
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, h, dv_dim, device="cuda", dtype=torch.bfloat16)
        do = torch.randn(b, sq, h, dv_dim, device="cuda", dtype=torch.bfloat16)
        o_py, dq_py, dk_py, dv_py, n_py = _grads(q, k, v, do, causal, config, cpp=False)
        o_c, dq_c, dk_c, dv_c, n_c = _grads(q, k, v, do, causal, config, cpp=True)
        assert "AttentionBackwardNode" in n_c and "AttentionBackwardNode" not in n_py
        assert torch.equal(o_c, o_py) and torch.equal(dk_c, dk_py) and torch.equal(dv_c, dv_py), (b, sq, sk, h)
        if det:
            assert torch.equal(dq_c, dq_py), (b, sq, sk, h)
        else:  # fp32 atomics in another order: a few bf16 ulps at most
            scale = dq_py.float().abs().max().item()
            assert (dq_c.float() - dq_py.float()).abs().max().item() <= 2e-2 * scale + 1e-6, (b, sq, sk, h)


# GQA (group 2 and MQA), a sliding window, a softcap: the same kernel arguments, the features in the compile key
FEATURE_CASES = [dict(hdim=128, h=4, h_kv=2, causal=True, kw={}), dict(hdim=64, h=4, h_kv=1, causal=False, kw={}),
                 dict(hdim=64, h=2, h_kv=2, causal=True, kw=dict(window_size=(96, 0))),
                 dict(hdim=128, h=2, h_kv=2, causal=False, kw=dict(window_size=(128, 64), softcap=30.0))]


@pytest.mark.parametrize("case", FEATURE_CASES, ids=["gqa2", "mqa", "window", "window_softcap"])
def test_cpp_node_gqa_window_softcap_match_the_python_node(node, case):
    torch.manual_seed(3)
    d, h, h_kv, causal, kw = case["hdim"], case["h"], case["h_kv"], case["causal"], case["kw"]
    det = AttnConfig(deterministic=True)
    for b, sq, sk in ((2, 301, 301), (1, 200, 517)):
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, h_kv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        py = _grads(q, k, v, do, causal, det, cpp=False, **kw)
        c = _grads(q, k, v, do, causal, det, cpp=True, **kw)
        assert "AttentionBackwardNode" in c[4] and "AttentionBackwardNode" not in py[4]
        assert all(torch.equal(x, y) for x, y in zip(c[:4], py[:4])), (case, b, sq, sk)


def test_cpp_node_fp16_and_the_calls_it_leaves_alone(node):
    torch.manual_seed(1)
    q, k, v, do = (torch.randn(2, 333, 4, 128, device="cuda", dtype=torch.float16) for _ in range(4))
    # a key whose backward is not compiled yet: the Python node runs (its backward compiles it), the next call not
    *first, n_first = _grads(q, k, v, do, True, AttnConfig(deterministic=True), cpp=True)
    assert "AttentionBackwardNode" not in n_first
    o_py, dq_py, dk_py, dv_py, _ = _grads(q, k, v, do, True, AttnConfig(deterministic=True), cpp=False)
    assert all(torch.equal(a, b) for a, b in zip(first, (o_py, dq_py, dk_py, dv_py)))
    o_c, dq_c, dk_c, dv_c, n_c = _grads(q, k, v, do, True, AttnConfig(deterministic=True), cpp=True)
    assert "AttentionBackwardNode" in n_c
    assert all(torch.equal(a, b) for a, b in ((o_c, o_py), (dq_c, dq_py), (dk_c, dk_py), (dv_c, dv_py)))
    cfg = AttnConfig(deterministic=True)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2).detach().requires_grad_(True)  # same values, not contiguous
    leaves = [qt] + [t.detach().requires_grad_(True) for t in (k, v)]
    out = kernels.attention(*leaves, causal=True, config=cfg)
    assert "AttentionBackwardNode" not in out.grad_fn.name()  # not contiguous: the Python node
    assert torch.equal(torch.autograd.grad(out, leaves[0], do)[0], dq_py)
