"""GPU checks of the C++ backward node (the eager default; FA4LAB_CPP_BWD=0 off; kernels/sm90/cpp_backward.py): it loads with the real TVM
FFI, the eager call takes it (grad_fn) once the call's backward is compiled (the first call of a key keeps the Python
node), and out / dq / dk / dv equal the Python node's (same kernels, same
arguments): bit for bit where the kernels are deterministic (out, dk, dv always; dq with deterministic=True), dq
within the accuracy of atomics' order otherwise; calls it does not cover (GQA, a window) keep the Python node."""
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


def _grads(q, k, v, do, causal, config, cpp: bool):
    cb.force = cpp
    try:
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = kernels.attention(*leaves, causal=causal, config=config)
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
    leaves = [t.detach().requires_grad_(True) for t in (q, k[:, :, :1].contiguous(), v[:, :, :1].contiguous())]
    assert "AttentionBackwardNode" not in kernels.attention(*leaves, causal=True).grad_fn.name()  # GQA
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = kernels.attention(*leaves, causal=True, window_size=(64, 0))
    assert "AttentionBackwardNode" not in out.grad_fn.name()  # a window
