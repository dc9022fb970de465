"""Issue 12.4 for variable length, on the CPU: the torch.library ops fa4lab::varlen_fwd / fa4lab::varlen_bwd
(registered in kernels/varlen.py with kernels/ops.py's helpers) -- schema, fake (meta) kernels, registered autograd,
and torch.compile(fullgraph=True) tracing ``kernels.attention_varlen``.

As tests/test_ops.py: CUDA *fake* tensors for the fake kernels and Dynamo tracing of the forward through the real
checks; a CPU *stand-in* kernel (test_ops' dense stand-in per sequence, off outside the fixture) for opcheck and
torch.compile(fullgraph=True, backend=aot_eager-like) of forward + backward. The real kernels under torch.compile:
tests/test_ops_gpu.py (test_compile_fullgraph_varlen_*).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kernels
from kernels import AttnConfig, InputError, attention_varlen
from kernels import varlen as kv
from kernels.reference import attention_exact
from test_ops import (_STANDIN, _Recorder, _contiguous_strides, _standin_bwd, _standin_fwd, graph_recorder,
                      standin_on)

FEATS = "int window_left=-1, int window_right=-1, float softcap=0."
VARLEN = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k"


# ---- schema, registration -------------------------------------------------------------------------------------------
def test_schemas():
    assert str(kv.varlen_fwd_op._schema) == (
        f"fa4lab::varlen_fwd(Tensor q, Tensor k, Tensor v, {VARLEN}, bool causal, float softmax_scale, str config, "
        f"{FEATS}) -> (Tensor out, Tensor lse)")
    assert str(kv.varlen_bwd_op._schema) == (
        f"fa4lab::varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {VARLEN}, bool causal, "
        f"float softmax_scale, str config, {FEATS}) -> (Tensor dq, Tensor dk, Tensor dv)")
    assert torch.ops.fa4lab.varlen_fwd.default is kv.varlen_fwd_op
    assert torch.ops.fa4lab.varlen_bwd.default is kv.varlen_bwd_op


def test_kernels_registered_per_dispatch_key():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ("fa4lab::varlen_fwd", "fa4lab::varlen_bwd"):
        assert has(name, "CUDA"), name
        assert has(name, "Meta"), name  # the fake kernel
        assert not has(name, "CPU"), name  # CUDA only (the stand-in below is registered by the fixture, and gated)
    assert has("fa4lab::varlen_fwd", "Autograd")


def test_eager_path_is_the_plain_autograd_function():
    """Eager CUDA calls go through the _VarlenFwd autograd.Function, traced ones through the op (kernels.ops style)."""
    assert issubclass(kv._VarlenFwd, torch.autograd.Function)
    from kernels.ops import _EagerAttention

    assert issubclass(_EagerAttention, torch.autograd.Function)


# ---- fake kernels on CUDA fakes ---------------------------------------------------------------------------------------
def _cu(lens, device="cuda"):
    return torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=device)


VSHAPES = [  # (lens_q, lens_k, h, h_kv, d, d_v)
    ([5, 0, 9], [7, 3, 9], 4, 4, 64, 64), ([1], [1], 1, 1, 128, 128), ([33, 70], [70, 33], 8, 2, 128, 128),
    ([16, 3], [40, 8], 8, 1, 64, 64), ([20, 7], [9, 30], 6, 3, 192, 128), ([4, 4], [4, 4], 2, 2, 256, 256)]


@pytest.mark.parametrize("shape", VSHAPES, ids=lambda s: f"hq{s[2]}-hkv{s[3]}-d{s[4]}-{s[5]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fake_forward_and_backward_shapes(shape, dtype):
    """attention_varlen on CUDA fakes takes the op: out (total_q, h, d_v) at q's dtype, lse (h, total_q) fp32, both
    contiguous; the backward op's dq / dk / dv are contiguous like q / k / v (GQA: K/V's heads)."""
    lq, lk, h, hkv, d, dv = shape
    tq, tk = sum(lq), sum(lk)
    with FakeTensorMode():
        q = torch.empty(h, tq, d, device="cuda", dtype=dtype).transpose(0, 1)  # head dim contiguous, the rest not
        k = torch.empty(tk, hkv, d, device="cuda", dtype=dtype)
        v = torch.empty(tk, hkv, dv, device="cuda", dtype=dtype)
        cu_q, cu_k = _cu(lq), _cu(lk)
        for causal in (False, True):
            out, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, return_lse=True,
                                        check_seqlens=False)  # fakes have no values to check
            assert (tuple(out.shape), out.dtype, out.device.type) == ((tq, h, dv), dtype, "cuda")
            assert out.stride() == _contiguous_strides((tq, h, dv))
            assert (tuple(lse.shape), lse.dtype, lse.stride()) == ((h, tq), torch.float32, _contiguous_strides((h, tq)))
            dout = torch.empty(tq, h, dv, device="cuda", dtype=dtype)
            grads = kv.varlen_bwd_op(dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk), causal,
                                     1.0 / math.sqrt(d), "{}")
            for g, like in zip(grads, (q, k, v)):
                assert (g.shape, g.dtype, g.device) == (like.shape, like.dtype, like.device)
                assert g.stride() == _contiguous_strides(tuple(like.shape))  # contiguous even when q is not


def test_checks_still_come_before_the_op():
    """On CUDA fakes every argument check but the value checks (check_seqlens=False) and the arch runs."""
    with FakeTensorMode():
        q = torch.empty(10, 2, 64, device="cuda", dtype=torch.bfloat16)
        cu = _cu([3, 7])
        with pytest.raises(InputError, match=r"head_dim: \(qk, v\) = \(96, 96\)"):
            attention_varlen(*(torch.empty(10, 2, 96, device="cuda", dtype=torch.bfloat16),) * 3, cu, cu, 7, 7)
        with pytest.raises(TypeError, match="config: expected kernels.AttnConfig"):
            attention_varlen(q, q, q, cu, cu, 7, 7, config={"tile_m": 64})
        with pytest.raises(TypeError, match=r"^max_seqlen_q: expected a Python int, got float"):
            attention_varlen(q, q, q, cu, cu, 7.0, 7)
        with pytest.raises(TypeError, match=r"^cu_seqlens_k: dtype torch.int64"):
            attention_varlen(q, q, q, cu, cu.long(), 7, 7)


# ---- Dynamo on CUDA fakes (forward) -----------------------------------------------------------------------------------
class _Varlen(torch.nn.Module):
    def __init__(self, cfg=None, causal=True, **kw):
        super().__init__()
        self.cfg, self.causal, self.kw = cfg, causal, kw

    def forward(self, q, k, v, cu_q, cu_k, max_q, max_k):
        return attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=self.causal, config=self.cfg,
                                **self.kw) * 2.0


def _fake_inputs(lq, lk, h=4, hkv=2, d=128):
    q = torch.empty(sum(lq), h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.empty(sum(lk), hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v, _cu(lq), _cu(lk), max(lq), max(lk)


def test_dynamo_fullgraph_forward_on_cuda_fakes():
    """fullgraph tracing with the default check_seqlens=True (the value checks are skipped under tracing: reading
    cu_seqlens values would break the graph), GQA, the config as a graph constant (a new config traces again), the
    window / softcap only when used."""
    rec = _Recorder()
    m = _Varlen(AttnConfig(deterministic=True))
    cm = torch.compile(m, fullgraph=True, backend=rec)
    with FakeTensorMode():
        args = _fake_inputs([100, 28, 64], [64, 200, 8])
        out = cm(*args)
        assert (tuple(out.shape), out.dtype, out.device.type) == ((192, 4, 128), torch.bfloat16, "cuda")
        (name, tail), = rec.calls
        assert name == "fa4lab.varlen_fwd.default"
        assert tail[4:] == (True, 1.0 / math.sqrt(128), '{"deterministic":true}')  # (.., max_q, max_k, causal, ...)
        m.cfg = AttnConfig(deterministic=True, tile_m=64)
        cm(*args)
        assert len(rec.graphs) == 2 and rec.calls[-1][1][-1] == '{"deterministic":true,"tile_m":64}'
        torch._dynamo.reset()
        rec.calls.clear()
        torch.compile(_Varlen(causal=False, window_size=(32, 16), softcap=30.0), fullgraph=True, backend=rec)(*args)
        assert rec.calls[-1][1][4:] == (False, 1.0 / math.sqrt(128), "{}", 32, 16, 30.0)


def test_dynamo_changing_max_seqlen_does_not_recompile_each_time():
    """max_seqlen are SymInt in the schema: after the first change Dynamo makes them dynamic, so a training loop whose
    max_seqlen changes every batch compiles at most twice (an ``int`` schema would specialise on every value)."""
    rec = _Recorder()
    cm = torch.compile(_Varlen(), fullgraph=True, backend=rec)
    with FakeTensorMode():
        for lens in ([100, 28], [50, 78], [3, 125], [64, 64], [127, 1]):
            cm(*_fake_inputs(lens, lens))
    assert len(rec.graphs) <= 2, len(rec.graphs)


# ---- a CPU stand-in kernel: opcheck and compile of forward + backward --------------------------------------------------
def _spans(cu):
    c = cu.tolist()
    return list(zip(c[:-1], c[1:]))


def _standin_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, config, *features):
    """Per sequence, test_ops' dense stand-in on (1, s, h, d): out (total_q, h, d_v), lse (h, total_q), contiguous."""
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
    lse = q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)
    for (a, b), (c, e) in zip(_spans(cu_q), _spans(cu_k)):
        o, l = _standin_fwd(q[a:b][None], k[c:e][None], v[c:e][None], causal, scale, config, *features)
        out[a:b], lse[:, a:b] = o[0], l[0]
    return out, lse


def _standin_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, config, *features):
    dq, dk, dv = (t.new_empty(t.shape) for t in (q, k, v))
    for (a, b), (c, e) in zip(_spans(cu_q), _spans(cu_k)):
        g = _standin_bwd(dout[a:b][None], q[a:b][None], k[c:e][None], v[c:e][None], out[a:b][None],
                         lse[:, a:b][None], causal, scale, config, *features)
        dq[a:b], dk[c:e], dv[c:e] = (x[0] for x in g)
    return dq, dk, dv


_REGISTERED = []


@pytest.fixture
def cpu_standin(monkeypatch):
    """Enable the CPU stand-in for the varlen ops and let attention_varlen accept CPU tensors (test only)."""
    ops = {"fa4lab::varlen_fwd": _standin_varlen_fwd, "fa4lab::varlen_bwd": _standin_varlen_bwd}
    with standin_on(monkeypatch, kv, ops, _REGISTERED):
        yield


def _inputs(lq, lk, h, hkv, d, dv, dtype=torch.float16, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), h, d, generator=g).to(dtype)
    k = torch.randn(sum(lk), hkv, d, generator=g).to(dtype)
    v = torch.randn(sum(lk), hkv, dv, generator=g).to(dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)] + [_cu(lq, "cpu"), _cu(lk, "cpu"), max(lq), max(lk)]


def test_standin_is_off_outside_the_fixture():
    q, k, v, cu_q, cu_k, mq, mk = _inputs([3, 5], [4, 4], 2, 2, 64, 64, grad=False)
    with pytest.raises(InputError, match="q: device cpu is not supported"):
        attention_varlen(q, k, v, cu_q, cu_k, mq, mk)
    if _REGISTERED:
        with pytest.raises(NotImplementedError, match="enabled only inside tests"):
            kv.varlen_fwd_op(q, k, v, cu_q, cu_k, mq, mk, False, 0.125, "{}")


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=False, window_size=(4, 2), softcap=20.0)])
def test_standin_matches_the_fp64_reference_per_sequence(cpu_standin, kw):
    """attention_varlen (eager on CPU tensors: the op with its registered autograd) equals the fp64 reference per
    sequence, forward and backward, GQA: the stand-in and the op's autograd wiring are right."""
    lq, lk = [7, 0, 12], [9, 5, 12]
    q, k, v, cu_q, cu_k, mq, mk = _inputs(lq, lk, 4, 2, 64, 64)
    out = attention_varlen(q, k, v, cu_q, cu_k, mq, mk, **kw)
    dout = torch.randn(out.shape).half()
    out.backward(dout)
    for (a, b), (c, e) in zip(_spans(cu_q), _spans(cu_k)):
        if a == b:
            continue
        q64, k64, v64 = (t.detach()[s:t_][None].double().requires_grad_(True)
                         for t, s, t_ in ((q, a, b), (k, c, e), (v, c, e)))
        g = q.shape[1] // k.shape[1]  # GQA: Q head i reads K/V head i // g
        ref = attention_exact(q64, k64.repeat_interleave(g, 2), v64.repeat_interleave(g, 2), **kw)
        ref.backward(dout[a:b][None].double())
        assert (out[a:b].double() - ref[0]).abs().max().item() < 2e-2
        for x, r in ((q.grad[a:b], q64.grad), (k.grad[c:e], k64.grad), (v.grad[c:e], v64.grad)):
            assert (x.double() - r[0]).abs().max().item() < 2e-2
    assert torch.equal(k.grad[9:14], torch.zeros_like(k.grad[9:14]))  # sequence 1 has no queries


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 1])
def test_opcheck(cpu_standin, causal, hkv):
    """opcheck (schema, fake vs real, autograd registration, AOT dispatch with dynamic shapes) of both ops."""
    q, k, v, cu_q, cu_k, mq, mk = _inputs([13, 30, 5], [40, 8, 24], 4, hkv, 64, 64)
    cstr = kernels.ops.config_string(AttnConfig(deterministic=True))
    torch.library.opcheck(kv.varlen_fwd_op, (q, k, v, cu_q, cu_k, mq, mk, causal, 0.125, cstr))
    torch.library.opcheck(kv.varlen_fwd_op, (q, k, v, cu_q, cu_k, mq, mk, causal, 0.125, cstr, 8, -1 if causal else 3,
                                             25.0))
    q, k, v = (t.detach() for t in (q, k, v))
    with torch.no_grad():
        out, lse = kv.varlen_fwd_op(q, k, v, cu_q, cu_k, mq, mk, causal, 0.125, cstr)
    torch.library.opcheck(kv.varlen_bwd_op, (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, mq, mk, causal,
                                             0.125, cstr),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


class _Block(torch.nn.Module):
    """Projections around attention_varlen on a packed batch (total, hidden), GQA (2 K/V heads for 4 Q heads)."""

    def __init__(self, hidden=256, heads=4, heads_kv=2, cfg=None):
        super().__init__()
        self.heads, self.heads_kv, self.cfg = heads, heads_kv, cfg
        self.dh = hidden // heads
        self.q = torch.nn.Linear(hidden, hidden, dtype=torch.float16)
        self.kv = torch.nn.Linear(hidden, 2 * heads_kv * self.dh, dtype=torch.float16)
        self.proj = torch.nn.Linear(hidden, hidden, dtype=torch.float16)

    def forward(self, x, cu, max_len):
        t = x.shape[0]
        q = self.q(x).view(t, self.heads, self.dh)
        k, v = self.kv(x).view(t, 2, self.heads_kv, self.dh).unbind(1)
        o = attention_varlen(q, k, v, cu, cu, max_len, max_len, causal=True, config=self.cfg)
        return self.proj(o.reshape(t, -1))


def _run(fn, params, x, cu, max_len):
    for p in params:
        p.grad = None
    x = x.detach().requires_grad_(True)
    y = fn(x, cu, max_len)
    y.float().square().mean().backward()
    return [y.detach(), x.grad] + [p.grad for p in params]


def test_compile_fullgraph_forward_backward_matches_eager(cpu_standin):
    """torch.compile(fullgraph=True) of a block calling attention_varlen (default check_seqlens=True): no graph
    break, forward and backward through fa4lab::varlen_fwd / fa4lab::varlen_bwd, results equal to eager bit for bit
    (same stand-in kernels); new lengths trace at most once more, a new config traces again."""
    torch.manual_seed(0)
    block = _Block(cfg=AttnConfig(deterministic=True))
    fwd_graphs, bwd_graphs = [], []
    cblock = torch.compile(block, fullgraph=True, backend=graph_recorder(fwd_graphs, bwd_graphs))
    params = list(block.parameters())
    for lens in ([20, 44], [31, 2, 40], [16, 16, 9]):
        x = torch.randn(sum(lens), 256).half()
        cu = _cu(lens, "cpu")
        eager = _run(block, params, x, cu, max(lens))
        compiled = _run(cblock, params, x, cu, max(lens))
        for a, b in zip(eager, compiled):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    targets = lambda gs: {str(n.target) for g in gs for n in g.graph.nodes if str(n.target).startswith("fa4lab.")}
    assert targets(fwd_graphs) == {"fa4lab.varlen_fwd.default"}
    assert targets(bwd_graphs) == {"fa4lab.varlen_bwd.default"}
    assert len(fwd_graphs) <= 2, len(fwd_graphs)  # lengths, batch and max_seqlen dynamic after the first change
    n_graphs = len(fwd_graphs)
    block.cfg = AttnConfig(deterministic=True, tile_m=64)
    _run(cblock, params, torch.randn(30, 256).half(), _cu([30], "cpu"), 30)
    assert len(fwd_graphs) == n_graphs + 1  # a new config: traced again (no stale config)


def test_value_checks_run_eagerly_and_are_skipped_when_traced(cpu_standin):
    """Eager: a max_seqlen below the longest sequence is an InputError. Traced: no value is read (documented), the
    call reaches the op."""
    q, k, v, cu_q, cu_k, mq, mk = _inputs([6, 10], [6, 10], 2, 2, 64, 64, grad=False)
    with pytest.raises(InputError, match=r"^max_seqlen_q=9 is smaller than the longest sequence"):
        attention_varlen(q, k, v, cu_q, cu_k, 9, mk)
    rec = _Recorder()
    torch.compile(lambda *a: attention_varlen(*a), fullgraph=True, backend=rec)(q, k, v, cu_q, cu_k, 9, mk)
    assert [c[0] for c in rec.calls] == ["fa4lab.varlen_fwd.default"]
