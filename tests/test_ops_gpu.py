"""Issue 12.4 on the GPU: the real kernels through the torch.library ops fa4lab::fwd / fa4lab::bwd -- opcheck on CUDA
inputs, torch.compile(fullgraph=True) (inductor) of forward + backward equal to eager, and the CUDA-graph path
(mode="reduce-overhead"). Run: python -m pytest -q tests/test_ops_gpu.py (H200; skipped without CUDA)."""
from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import AttnConfig, ops

pytestmark = pytest.mark.gpu
DET = AttnConfig(deterministic=True)


def _qkv(b, sq, sk, h, d, dv, grad=True, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, s, h, e, device="cuda", dtype=dtype, generator=g).requires_grad_(grad)
            for s, e in ((sq, d), (sk, d), (sk, dv))]


@pytest.mark.parametrize("shape,causal", [((2, 200, 200, 4, 64, 64), True), ((1, 130, 300, 2, 128, 128), False),
                                          ((2, 256, 256, 2, 128, 128), True)])
def test_opcheck_forward_with_autograd(shape, causal):
    q, k, v = _qkv(*shape)
    torch.library.opcheck(ops.fwd_op, (q, k, v, causal, 1.0 / math.sqrt(shape[4]), ops.config_string(DET)))


@pytest.mark.parametrize("shape", [(1, 150, 150, 2, 192, 128), (1, 128, 256, 2, 256, 256)])
def test_opcheck_forward_only_head_dims(shape):
    """(192, 128) and 256 have a forward only: opcheck without autograd inputs."""
    q, k, v = _qkv(*shape, grad=False)
    torch.library.opcheck(ops.fwd_op, (q, k, v, True, 1.0 / math.sqrt(shape[4]), "{}"))


@pytest.mark.parametrize("hdim", [64, 128])
def test_opcheck_backward(hdim):
    q, k, v = _qkv(2, 180, 180, 2, hdim, hdim, grad=False)
    scale = 1.0 / math.sqrt(hdim)
    cstr = ops.config_string(DET)
    out, lse = ops.fwd_op(q, k, v, True, scale, cstr)
    dout = torch.randn_like(out)
    torch.library.opcheck(ops.bwd_op, (dout, q, k, v, out, lse, True, scale, cstr),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


class _Block(torch.nn.Module):
    def __init__(self, hidden=512, heads=4, cfg=DET):
        super().__init__()
        self.heads, self.cfg = heads, cfg
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, device="cuda", dtype=torch.bfloat16)
        self.proj = torch.nn.Linear(hidden, hidden, device="cuda", dtype=torch.bfloat16)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).unbind(2)
        return self.proj(kernels.attention(q, k, v, causal=True, config=self.cfg).reshape(b, s, -1))


def _step(fn, params, x, dy):
    for p in params:
        p.grad = None
    x = x.detach().requires_grad_(True)
    y = fn(x)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad for p in params]


class _AttnOnly(torch.nn.Module):
    def forward(self, q, k, v):
        return kernels.attention(q, k, v, causal=True, config=DET)


def test_compile_fullgraph_attention_bitwise_equals_eager():
    """Only our ops in the graph (deterministic backward): compiled forward and gradients equal eager bit for bit."""
    q, k, v = _qkv(2, 333, 333, 4, 128, 128)
    dout = torch.randn(2, 333, 4, 128, device="cuda", dtype=torch.bfloat16)
    m = _AttnOnly()
    cm = torch.compile(m, fullgraph=True)
    res = []
    for fn in (m, cm):
        for t in (q, k, v):
            t.grad = None
        out = fn(q, k, v)
        out.backward(dout)
        res.append([out.detach(), q.grad, k.grad, v.grad])
    for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
        assert torch.equal(a, b), f"{name}: compiled differs from eager"


@pytest.mark.parametrize("seqlen", [256, 1000])
def test_compile_fullgraph_block_matches_eager(seqlen):
    """A projection block around kernels.attention, inductor, fullgraph: no graph break, output and every gradient
    close to eager (inductor may fuse the projections differently, so not bitwise)."""
    torch.manual_seed(0)
    block = _Block()
    params = list(block.parameters())
    cblock = torch.compile(block, fullgraph=True)
    x = torch.randn(2, seqlen, 512, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    eager, compiled = _step(block, params, x, dy), _step(cblock, params, x, dy)
    for a, b in zip(eager, compiled):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)


def test_compile_reduce_overhead_cuda_graphs_replay_equals_eager():
    """mode="reduce-overhead" (inductor CUDA graphs): forward + backward through our ops is captured (no cudagraph
    skip) and its replays on fresh inputs give the eager result bit for bit (deterministic backward)."""
    from torch._dynamo.utils import counters

    counters.clear()
    m = _AttnOnly()
    cm = torch.compile(m, fullgraph=True, mode="reduce-overhead")
    shape = (2, 300, 4, 64)
    for it in range(4):  # warm-up, record, then replays
        q, k, v = _qkv(2, 300, 300, 4, 64, 64, seed=it)
        dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        out = cm(q, k, v)
        out.backward(dout)
        got = [out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]
        qe, ke, ve = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        oe = kernels.attention(qe, ke, ve, causal=True, config=DET)
        oe.backward(dout)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, (oe, qe.grad, ke.grad, ve.grad)):
            assert torch.equal(a, b.detach()), f"step {it}: {name} differs from eager"
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])


# ---- variable length: fa4lab::varlen_fwd / fa4lab::varlen_bwd ---------------------------------------------------------
def _varlen_inputs(lens_q, lens_k, h, h_kv, d, seed=0, cu_device="cuda", grad=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lens_q), h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(sum(lens_k), h_kv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = lambda lens: torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32,
                                   device=cu_device)
    return [t.requires_grad_(grad) for t in (q, k, v)] + [cu(lens_q), cu(lens_k), max(lens_q), max(lens_k)]


class _VarlenOnly(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v, cu_q, cu_k, max_q, max_k):
        return kernels.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, config=DET, **self.kw)


@pytest.mark.parametrize("h_kv", [4, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_varlen(h_kv, causal):
    """The real varlen kernels under opcheck: schema, fake vs real, registered autograd, AOT dispatch (GQA / MQA)."""
    from kernels.varlen import varlen_bwd_op, varlen_fwd_op

    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs([130, 7, 200], [90, 64, 200], 4, h_kv, 64)
    cstr = ops.config_string(DET)
    torch.library.opcheck(varlen_fwd_op, (q, k, v, cu_q, cu_k, mq, mk, causal, 0.125, cstr))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = varlen_fwd_op(q, k, v, cu_q, cu_k, mq, mk, causal, 0.125, cstr)
    torch.library.opcheck(varlen_bwd_op, (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, mq, mk, causal, 0.125,
                                          cstr), test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("case", [
    dict(h=8, h_kv=2, d=128, kw=dict(causal=True)),
    dict(h=4, h_kv=1, d=64, kw=dict(causal=False), cu_device="cpu"),
    dict(h=8, h_kv=2, d=64, kw=dict(causal=True, window_size=(48, 0), softcap=30.0)),
], ids=["gqa-causal-d128", "mqa-d64-cpu-cu", "gqa-window-softcap"])
def test_compile_fullgraph_varlen_bitwise_equals_eager(case):
    """torch.compile(fullgraph=True) (inductor) of attention_varlen, forward + backward, GQA / MQA, deterministic
    backward: output and dq / dk / dv equal the eager call bit for bit; new lengths and max_seqlen (dynamic after the
    first change) too, without a graph break."""
    m = _VarlenOnly(**case["kw"])
    cm = torch.compile(m, fullgraph=True)
    for seed, (lq, lk) in enumerate([([300, 17, 129], [300, 40, 129]), ([64, 250], [64, 251]), ([1, 96, 33], [5, 96, 33])]):
        q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs(lq, lk, case["h"], case["h_kv"], case["d"], seed=seed,
                                                     cu_device=case.get("cu_device", "cuda"))
        dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
        res = []
        for fn in (m, cm):
            for t in (q, k, v):
                t.grad = None
            out = fn(q, k, v, cu_q, cu_k, mq, mk)
            out.backward(dout)
            res.append([out.detach(), q.grad, k.grad, v.grad])
        for name, a, b in zip(("out", "dq", "dk", "dv"), *res):
            assert torch.isfinite(a).all(), name
            assert torch.equal(a, b), f"lengths {lq} / {lk}: {name} compiled differs from eager"


def test_arch_and_device_errors_unchanged_through_the_op():
    q, k, v = _qkv(1, 64, 64, 2, 64, 64, grad=False)
    with pytest.raises(kernels.InputError, match="q: device cpu is not supported"):
        kernels.attention(q.cpu(), k.cpu(), v.cpu())
    if torch.cuda.get_device_capability()[0] != 9:
        with pytest.raises(kernels.InputError, match="compute capability"):
            kernels.attention(q, k, v)


def test_report_host_overhead_of_the_op(capsys):
    """Report (not assert) the host time per call of kernels.attention (through fa4lab::fwd) next to the direct
    launcher (interface.attention_forward) on a tiny, host-bound shape."""
    import time

    from kernels.interface import attention_forward, resolve_config

    q, k, v = _qkv(1, 128, 128, 1, 64, 64, grad=False)
    cfg = resolve_config(None, 64, False)

    def per_call(fn, n=2000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    direct = per_call(lambda: attention_forward(q, k, v, False, 0.125, cfg))
    through_op = per_call(lambda: kernels.attention(q, k, v))
    qg, kg, vg = _qkv(1, 128, 128, 1, 64, 64)
    with_grad = per_call(lambda: kernels.attention(qg, kg, vg))
    with capsys.disabled():
        print(f"\n[host per call, (1,128,1,64) fwd] attention_forward {direct:.1f} us, kernels.attention {through_op:.1f} us,"
              f" with autograd {with_grad:.1f} us")
