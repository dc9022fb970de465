"""Issue 12.4 on the CPU: the torch.library ops fa4lab::fwd / fa4lab::bwd (kernels/ops.py) -- schema, fake (meta)
kernels, registered autograd, the config string, and torch.compile(fullgraph=True) tracing.

Two ways to run without a GPU:
- CUDA *fake* tensors (FakeTensorMode, device "cuda"): the fake kernels, and Dynamo tracing kernels.attention's
  forward through the real device checks. Autograd on CUDA fakes aborts a CPU-only torch build (AccumulateGrad
  needs a CUDA device guard), so the backward is not traced this way.
- A CPU *stand-in* kernel for both ops (plain fp32 math, registered for the tests only, off outside them) and the
  device check relaxed: torch.library.opcheck (schema, autograd registration, fake vs real, AOT dispatch with
  dynamic shapes) and torch.compile(fullgraph=True, backend="aot_eager") of forward + backward.
What needs the GPU (tests/test_ops_gpu.py): the real kernels under opcheck, inductor, and CUDA graphs.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kernels
from kernels import AttnConfig, InputError
from kernels import ops
from kernels.reference import attention_exact

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [  # (b, s_q, s_k, h, d, d_v)
    (1, 1, 1, 1, 64, 64), (2, 97, 200, 3, 64, 64), (2, 256, 256, 4, 128, 128), (1, 300, 129, 2, 192, 128),
    (1, 128, 512, 2, 256, 256),
]


# ---- schema, registration -------------------------------------------------------------------------------------------
def test_schemas():
    feats = "int window_left=-1, int window_right=-1, float softcap=0."
    assert str(ops.fwd_op._schema) == ("fa4lab::fwd(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale, "
                                       f"str config, {feats}) -> (Tensor out, Tensor lse)")
    assert str(ops.bwd_op._schema) == ("fa4lab::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                                       f"bool causal, float softmax_scale, str config, {feats}) -> "
                                       "(Tensor dq, Tensor dk, Tensor dv)")
    assert torch.ops.fa4lab.fwd.default is ops.fwd_op


def test_kernels_registered_per_dispatch_key():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ("fa4lab::fwd", "fa4lab::bwd"):
        assert has(name, "CUDA"), name
        assert has(name, "Meta"), name  # the fake kernel
        assert not has(name, "CPU"), name  # CUDA only (the test stand-in below is a separate, switchable kernel)
    assert has("fa4lab::fwd", "Autograd")


# ---- the config string ------------------------------------------------------------------------------------------------
def test_config_string_round_trip_and_cache():
    assert ops.config_string(None) == ops.config_string(AttnConfig()) == "{}"
    cfg = AttnConfig(rescale_threshold=0.0, deterministic=True, tile_m=64, det_schedule="naive", exp2_emu_fraction=0.25)
    s = ops.config_string(cfg)
    assert s == '{"det_schedule":"naive","deterministic":true,"exp2_emu_fraction":0.25,"rescale_threshold":0.0,"tile_m":64}'
    assert ops.config_string(cfg) is s  # cached: no encoding per call
    assert ops.config_string(AttnConfig(rescale_threshold=0.0, deterministic=True, tile_m=64, det_schedule="naive",
                                        exp2_emu_fraction=0.25)) == s  # equal configs, equal strings
    assert ops.config_from_string(s) == cfg and ops.config_from_string("{}") == AttnConfig()
    assert ops._resolved(s, 128, True) == cfg.resolve("sm90", 128, True)
    with pytest.raises(TypeError, match="config: expected kernels.AttnConfig or None, got dict"):
        ops.config_string({"tile_m": 64})
    with pytest.raises(kernels.ConfigError, match="unknown AttnConfig field 'bogus'"):
        ops.config_from_string('{"bogus":1}')
    with pytest.raises(kernels.ConfigError, match="not the JSON"):
        ops.config_from_string("tile_m=64")


# ---- fake kernels on CUDA fakes ---------------------------------------------------------------------------------------
def _contiguous_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fake_forward_and_backward_shapes(shape, dtype):
    b, sq, sk, h, d, dv = shape
    with FakeTensorMode():
        # q in a (b, h, s, d) buffer seen as (b, s, h, d): head dim contiguous, the rest not (accepted by check_qkv)
        q = torch.empty(b, h, sq, d, device="cuda", dtype=dtype).transpose(1, 2)
        k = torch.empty(b, sk, h, d, device="cuda", dtype=dtype)
        v = torch.empty(b, sk, h, dv, device="cuda", dtype=dtype)
        for causal in (False, True):
            out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
            assert (tuple(out.shape), out.dtype, out.device.type) == ((b, sq, h, dv), dtype, "cuda")
            assert out.stride() == _contiguous_strides((b, sq, h, dv))
            assert (tuple(lse.shape), lse.dtype, lse.stride()) == ((b, h, sq), torch.float32, _contiguous_strides((b, h, sq)))
            dout = torch.empty(b, sq, h, dv, device="cuda", dtype=dtype)
            grads = ops.bwd_op(dout, q, k, v, out, lse, causal, 1.0 / math.sqrt(d), "{}")
            for g, like in zip(grads, (q, k, v)):
                assert (g.shape, g.dtype, g.device) == (like.shape, like.dtype, like.device)
                assert g.stride() == _contiguous_strides(tuple(like.shape))  # contiguous even when q is not


# GQA / MQA (issue 12.1): (b, s_q, s_k, h_q, h_kv, d, d_v)
GQA_SHAPES = [(2, 97, 200, 8, 2, 64, 64), (1, 64, 64, 4, 1, 128, 128), (1, 33, 70, 6, 3, 192, 128),
              (2, 16, 40, 8, 1, 256, 256)]


@pytest.mark.parametrize("shape", GQA_SHAPES, ids=lambda s: f"hq{s[3]}-hkv{s[4]}-d{s[5]}")
def test_fake_shapes_grouped_kv(shape):
    """Fake kernels with fewer K/V heads: out / lse per Q head, dk / dv of K / V's shape (not Q's head count)."""
    b, sq, sk, h, hkv, d, dv = shape
    with FakeTensorMode():
        q = torch.empty(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.empty(b, sk, hkv, dv, device="cuda", dtype=torch.bfloat16)
        out, lse = kernels.attention(q, k, v, causal=True, return_lse=True)
        assert tuple(out.shape) == (b, sq, h, dv) and tuple(lse.shape) == (b, h, sq)
        dout = torch.empty(b, sq, h, dv, device="cuda", dtype=torch.bfloat16)
        dq, dk, dv_ = ops.bwd_op(dout, q, k, v, out, lse, True, 1.0 / math.sqrt(d), "{}")
        assert tuple(dq.shape) == tuple(q.shape) and tuple(dk.shape) == (b, sk, hkv, d)
        assert tuple(dv_.shape) == (b, sk, hkv, dv) and dk.stride() == _contiguous_strides((b, sk, hkv, d))


def test_grouped_kv_argument_errors():
    """K/V head counts that differ, or do not divide Q's, are one-line InputErrors naming the heads."""
    with FakeTensorMode():
        t = lambda h: torch.empty(1, 16, h, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(InputError, match=r"heads: the K/V heads \(3\) must divide the Q heads \(8\)"):
            kernels.attention(t(8), t(3), t(3))
        with pytest.raises(InputError, match=r"heads: k and v must share the number of heads, got 2 and 4"):
            kernels.attention(t(8), t(2), t(4))
        with pytest.raises(InputError, match=r"heads: the K/V heads \(8\) must divide the Q heads \(4\)"):
            kernels.attention(t(4), t(8), t(8))
        kernels.attention(t(8), t(1), t(1))  # MQA
        kernels.attention(t(8), t(8), t(8))  # MHA


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_grouped_kv(cpu_standin, causal):
    """The ops with fewer K/V heads under opcheck (schema, fake vs real, autograd, AOT dispatch), CPU stand-in."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 40, 8, 64, generator=g).half().requires_grad_(True)
    k, v = (torch.randn(2, 72, 2, 64, generator=g).half().requires_grad_(True) for _ in range(2))
    torch.library.opcheck(ops.fwd_op, (q, k, v, causal, 0.125, "{}"))
    with torch.no_grad():
        out, lse = ops.fwd_op(q, k, v, causal, 0.125, "{}")
    q, k, v = (t.detach() for t in (q, k, v))
    torch.library.opcheck(ops.bwd_op, (torch.randn_like(out), q, k, v, out, lse, causal, 0.125, "{}"),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_attention_checks_still_come_before_the_op():
    """On CUDA fakes the arch is never checked (the op's real kernel does that), everything else is."""
    with FakeTensorMode():
        q = torch.empty(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(InputError, match="head_dim: \\(qk, v\\) = \\(96, 96\\)"):
            kernels.attention(*(torch.empty(1, 64, 2, 96, device="cuda", dtype=torch.bfloat16),) * 3)
        with pytest.raises(TypeError, match="config: expected kernels.AttnConfig"):
            kernels.attention(q, q, q, config={"tile_m": 64})
        if torch.cuda.device_count() != 1:  # a fake cuda:1 on a real one-GPU host is an invalid device ordinal
            with pytest.raises(InputError, match="q, k, v: must be on one device"):
                kernels.attention(q, q, torch.empty(1, 64, 2, 64, device="cuda:1", dtype=torch.bfloat16))


# ---- Dynamo on CUDA fakes (forward) -----------------------------------------------------------------------------------
class _Attn(torch.nn.Module):
    def __init__(self, cfg=None, causal=True):
        super().__init__()
        self.cfg, self.causal = cfg, causal

    def forward(self, q, k, v):
        return kernels.attention(q, k, v, causal=self.causal, config=self.cfg) * 2.0


class _Recorder:
    """A torch.compile backend that keeps every graph and the fa4lab calls in it."""

    def __init__(self):
        self.graphs, self.calls = [], []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.calls += [(str(n.target), n.args[3:]) for n in gm.graph.nodes
                       if n.op == "call_function" and str(n.target).startswith("fa4lab.")]
        return gm


def test_dynamo_fullgraph_forward_on_cuda_fakes():
    rec = _Recorder()
    first = AttnConfig(deterministic=True)
    m = _Attn(first)
    cm = torch.compile(m, fullgraph=True, backend=rec)
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = cm(q, k, v)
        assert (tuple(out.shape), out.dtype, out.device.type) == ((2, 256, 4, 128), torch.bfloat16, "cuda")
        assert rec.calls == [("fa4lab.fwd.default", (True, 1.0 / math.sqrt(128), '{"deterministic":true}'))]
        m.cfg = AttnConfig(deterministic=True, two_cta=True)  # a different config must recompile, never reuse
        cm(q, k, v)
        m.cfg = first  # back to the first object: its graph is reused
        cm(q, k, v)
        assert len(rec.graphs) == 2
        m.cfg = AttnConfig(deterministic=True, two_cta=True)  # Dynamo guards on the config's string: an equal new
        cm(q, k, v)                                             # object reuses that graph
        assert len(rec.graphs) == 2
        m.cfg = AttnConfig(deterministic=True, det_schedule="naive")  # an unequal one traces again
        cm(q, k, v)
    assert [c[1][2] for c in rec.calls] == ['{"deterministic":true}', '{"deterministic":true,"two_cta":true}',
                                            '{"det_schedule":"naive","deterministic":true}']


# ---- a CPU stand-in kernel: opcheck and compile of forward + backward --------------------------------------------------
_STANDIN = {"on": False}


def _mask(sq, sk, device):
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + (sk - sq)  # bottom-right aligned, as the kernels


def _repeat_kv(k, v, heads_q):
    """GQA / MQA: K/V head j serves Q heads j*g .. j*g+g-1 (the kernels' mapping, Q head i -> K/V head i // g)."""
    g = heads_q // k.shape[2]
    return (k, v) if g == 1 else (k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2))


def _standin_fwd(q, k, v, causal, softmax_scale, config, window_left=-1, window_right=-1, softcap=0.0):
    """fp32 math with the kernels' contract (out contiguous at q's dtype, lse (b, h, s_q) fp32)."""
    if not _STANDIN["on"]:
        raise NotImplementedError("fa4lab ops run on CUDA; this CPU stand-in is enabled only inside tests")
    ops.config_from_string(config)  # the string must decode
    k, v = _repeat_kv(k, v, q.shape[2])
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * softmax_scale
    if softcap > 0.0:
        s = torch.tanh(s / softcap) * softcap
    if causal:
        s = s.masked_fill(~_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
    if window_left >= 0 or window_right >= 0:
        from kernels.reference import window_mask

        s = s.masked_fill(~window_mask(q.shape[1], k.shape[1], causal, (window_left, window_right), q.device),
                          float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]).nan_to_num(0.0), v.float())
    return out.to(q.dtype).contiguous(), lse.contiguous()


def _standin_bwd(dout, q, k, v, out, lse, causal, softmax_scale, config, window_left=-1, window_right=-1, softcap=0.0):
    if not _STANDIN["on"]:
        raise NotImplementedError("fa4lab ops run on CUDA; this CPU stand-in is enabled only inside tests")
    h_kv = k.shape[2]
    k, v = _repeat_kv(k, v, q.shape[2])
    qf, kf, vf, of, dof = (t.float() for t in (q, k, v, out, dout))
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * softmax_scale
    dcap = 1.0
    if softcap > 0.0:  # s' = softcap * tanh(s / softcap): ds'/ds = 1 - tanh^2
        t = torch.tanh(s / softcap)
        s, dcap = t * softcap, 1.0 - t * t
    if causal:
        s = s.masked_fill(~_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
    if window_left >= 0 or window_right >= 0:
        from kernels.reference import window_mask

        s = s.masked_fill(~window_mask(q.shape[1], k.shape[1], causal, (window_left, window_right), q.device),
                          float("-inf"))
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows without keys (lse -inf): 0
    dv = torch.einsum("bhqk,bqhd->bkhd", p, dof)
    dp = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    delta = (dof * of).sum(-1).transpose(1, 2)[..., None]  # (b, h, s_q, 1)
    ds = p * (dp - delta) * dcap * softmax_scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kf)
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, qf)
    if h_kv != q.shape[2]:  # GQA: sum each group's Q heads into its K/V head, as the kernels do
        dk, dv = (t.unflatten(2, (h_kv, -1)).sum(3) for t in (dk, dv))
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


_REGISTERED = []


@contextlib.contextmanager
def standin_on(monkeypatch, module, kernels_by_op: dict, registered: list):
    """Register the CPU stand-in kernels once (``registered`` remembers), let ``module.check_devices`` accept CPU
    tensors and turn the stand-in on for the block (test only)."""
    if not registered:
        for op, fn in kernels_by_op.items():
            torch.library.register_kernel(op, "cpu", fn)
        registered.append(True)
    real_check = module.check_devices
    monkeypatch.setattr(module, "check_devices", lambda q, k, v, need_cuda=False: real_check(q, k, v, need_cuda=False))
    _STANDIN["on"] = True
    try:
        yield
    finally:
        _STANDIN["on"] = False


@pytest.fixture
def cpu_standin(monkeypatch):
    """Enable the CPU stand-in for both ops and let kernels.attention accept CPU tensors (test only)."""
    with standin_on(monkeypatch, ops, {"fa4lab::fwd": _standin_fwd, "fa4lab::bwd": _standin_bwd}, _REGISTERED):
        yield


def _inputs(b, sq, sk, h, d, dv, dtype=torch.float16, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, h, e, generator=g).to(dtype) for s, e in ((sq, d), (sk, d), (sk, dv)))
    return [t.requires_grad_(grad) for t in (q, k, v)]


def test_standin_is_off_outside_the_fixture():
    q, k, v = _inputs(1, 8, 8, 1, 64, 64, grad=False)
    with pytest.raises(InputError, match="q: device cpu is not supported"):
        kernels.attention(q, k, v)
    if _REGISTERED:
        with pytest.raises(NotImplementedError, match="enabled only inside tests"):
            ops.fwd_op(q, k, v, False, 0.125, "{}")


def test_standin_matches_the_fp64_reference(cpu_standin):
    """The stand-in's backward formula (used by the tests below) is right: grads vs autograd of attention_exact."""
    q, k, v = _inputs(2, 33, 70, 2, 64, 64)
    dout = torch.randn(2, 33, 2, 64).half()
    out = kernels.attention(q, k, v, causal=True)
    out.backward(dout)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = attention_exact(q64, k64, v64, causal=True)
    ref.backward(dout.double())
    for x, r in ((out, ref), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (x.double() - r).abs().max().item() < 2e-2


@pytest.mark.parametrize("shape", [(2, 40, 72, 3, 64, 64), (1, 50, 50, 2, 192, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_forward_with_autograd(cpu_standin, shape, causal):
    q, k, v = _inputs(*shape)
    scale = 1.0 / math.sqrt(shape[4])
    torch.library.opcheck(ops.fwd_op, (q, k, v, causal, scale, ops.config_string(AttnConfig(deterministic=True))))


def test_opcheck_backward(cpu_standin):
    q, k, v = _inputs(2, 40, 72, 3, 64, 64, grad=False)
    with torch.no_grad():
        out, lse = ops.fwd_op(q, k, v, True, 0.125, "{}")
    dout = torch.randn_like(out)
    torch.library.opcheck(ops.bwd_op, (dout, q, k, v, out, lse, True, 0.125, "{}"),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


class _Block(torch.nn.Module):
    """A small attention block: projections, fa4lab attention, output projection."""

    def __init__(self, hidden=128, heads=2, cfg=None):
        super().__init__()
        self.heads, self.cfg = heads, cfg
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, dtype=torch.float16)
        self.proj = torch.nn.Linear(hidden, hidden, dtype=torch.float16)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).unbind(2)
        o = kernels.attention(q, k, v, causal=True, config=self.cfg)
        return self.proj(o.reshape(b, s, -1))


def _run(fn, params, x):
    for p in params:
        p.grad = None
    x = x.detach().requires_grad_(True)
    y = fn(x)
    y.float().square().mean().backward()
    return [y.detach(), x.grad] + [p.grad for p in params]


def graph_recorder(fwd_graphs: list, bwd_graphs: list):
    """A torch.compile backend (AOT autograd) that appends each forward / backward graph it compiles to the lists."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def keep(store):
        def compiler(g, _):
            store.append(g)
            return make_boxed_func(g)
        return compiler

    def backend(gm, example_inputs):
        return aot_autograd(fw_compiler=keep(fwd_graphs), bw_compiler=keep(bwd_graphs))(gm, example_inputs)
    return backend


@pytest.mark.skipif(sys.platform != "linux", reason="torch.compile on linux")
def test_compile_fullgraph_forward_backward_matches_eager(cpu_standin):
    """torch.compile(fullgraph=True) of a block calling kernels.attention: one graph, no break, forward and backward
    through fa4lab::fwd / fa4lab::bwd, results equal to eager (same kernels); a new sequence length (dynamic) and a
    new config trace again without a break."""
    torch.manual_seed(0)
    block = _Block(cfg=AttnConfig(deterministic=True))
    fwd_graphs, bwd_graphs = [], []
    cblock = torch.compile(block, fullgraph=True, backend=graph_recorder(fwd_graphs, bwd_graphs))
    params = list(block.parameters())
    for s in (64, 97):
        x = torch.randn(2, s, 128).half()
        eager = _run(block, params, x)
        compiled = _run(cblock, params, x)
        for a, b in zip(eager, compiled):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    targets = lambda gs: [str(n.target) for g in gs for n in g.graph.nodes if str(n.target).startswith("fa4lab.")]
    assert set(targets(fwd_graphs)) == {"fa4lab.fwd.default"} and set(targets(bwd_graphs)) == {"fa4lab.bwd.default"}
    n_graphs = len(fwd_graphs)
    block.cfg = AttnConfig(deterministic=True, tile_m=64)
    _run(cblock, params, torch.randn(2, 97, 128).half())
    assert len(fwd_graphs) == n_graphs + 1  # a new config: traced again (no stale config)


def _fa4lab_installed() -> bool:
    try:
        importlib.metadata.distribution("fa4lab")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _fa4lab_installed(), reason="needs the fa4lab distribution installed (pip install -e .)")
def test_fa4lab_and_kernels_imported_as_two_modules_share_the_ops():
    """fa4lab imported before the repo's kernels gives two module trees; the ops are defined once and both work."""
    probe = (
        "import fa4lab, kernels, kernels.ops, fa4lab.kernels.ops as fo, torch\n"
        "assert fo is not kernels.ops and fo.fwd_op is kernels.ops.fwd_op\n"
        "assert fo.config_string(fa4lab.AttnConfig(tile_m=64)) == kernels.ops.config_string(kernels.AttnConfig(tile_m=64))\n"
        "print('OK')\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-2000:]


# ---- sliding window and softcap (issue 12.3) -----------------------------------------------------------------------
def test_window_softcap_fake_shapes_and_op_args():
    """Through the op on CUDA fakes: the same output shapes; the canonical window / softcap reach the op only when used
    (a plain call keeps the 6-argument form, so its graph is the one of before)."""
    rec = _Recorder()

    class _W(torch.nn.Module):
        def __init__(self, **kw):
            super().__init__()
            self.kw = kw

        def forward(self, q, k, v):
            return kernels.attention(q, k, v, **self.kw)

    cases = [(dict(causal=True, window_size=(64, 64)), (True, 64, -1, 0.0)),  # causal: right bound is the diagonal
             (dict(window_size=(32, 16), softcap=30.0), (False, 32, 16, 30.0)),
             (dict(window_size=(-1, 0)), (True,)),  # non-causal right 0 = plain causal: no extra arguments
             (dict(causal=True, window_size=(-1, -1), softcap=0.0), (True,)),
             (dict(softcap=50), (False, -1, -1, 50.0))]
    with FakeTensorMode():
        q = torch.empty(2, 97, 4, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.empty(2, 200, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for kw, want in cases:
            rec.calls.clear()
            torch._dynamo.reset()
            out = torch.compile(_W(**kw), fullgraph=True, backend=rec)(q, k, v)
            assert (tuple(out.shape), out.dtype) == ((2, 97, 4, 128), torch.bfloat16)
            (name, args), = rec.calls
            assert name == "fa4lab.fwd.default"
            assert (args[0],) + tuple(args[3:]) == want, (kw, args)
            out, lse = kernels.attention(q, k, v, return_lse=True, **kw)  # eagerly on fakes: the op, fake kernel
            assert tuple(out.shape) == (2, 97, 4, 128) and tuple(lse.shape) == (2, 4, 97)
        o, l = ops.fwd_op(q, k, v, False, 0.1, "{}", 8, 8, 30.0)
        assert tuple(o.shape) == (2, 97, 4, 128) and l.dtype == torch.float32
        dq, dk, dv = ops.bwd_op(torch.empty_like(o), q, k, v, o, l, False, 0.1, "{}", 8, 8, 30.0)  # fake: shapes only
        assert dk.shape == k.shape and dq.shape == q.shape


def test_window_softcap_argument_errors():
    """window_size: a pair of ints >= -1; softcap: a finite number >= 0; one-line ConfigErrors naming the argument."""
    with FakeTensorMode():
        q = torch.empty(1, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
        for bad in [(1,), (1, 2, 3), (1.5, 2), (-2, 0), (0, -5), "ab", (True, 1), 5]:
            with pytest.raises(kernels.ConfigError, match=r"^window_size=") as e:
                kernels.attention(q, q, q, window_size=bad)
            assert "\n" not in str(e.value)
        for bad in [-1.0, float("inf"), float("nan"), "30", True, None]:
            with pytest.raises(kernels.ConfigError, match=r"^softcap=") as e:
                kernels.attention(q, q, q, softcap=bad)
            assert "\n" not in str(e.value)
        with pytest.raises(InputError, match="head_dim"):  # tensor checks still come first
            kernels.attention(*(torch.empty(1, 8, 1, 96, device="cuda", dtype=torch.bfloat16),) * 3, softcap=-1.0)
        kernels.attention(q, q, q, window_size=[3, 0])  # a list is accepted, as a tuple
        kernels.attention(q, q, q, window_size=None, softcap=0)


@pytest.mark.parametrize("kw", [dict(window_size=(8, 8)), dict(softcap=30.0), dict(causal=True, window_size=(16, 0))])
def test_window_softcap_forward_and_backward_standin(cpu_standin, kw):
    """The op's forward with window / softcap matches the fp64 reference (CPU stand-in), and its autograd backward
    reaches fa4lab::bwd with the same window / softcap: gradients match autograd of the reference."""
    q, k, v = _inputs(2, 33, 70, 2, 64, 64)
    out = kernels.attention(q, k, v, **kw)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = attention_exact(q64, k64, v64, **kw)
    assert (out.double() - ref).abs().max().item() < 2e-2
    dout = torch.randn(out.shape).half()
    out.backward(dout)
    ref.backward(dout.double())
    for x, r in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (x.double() - r).abs().max().item() < 2e-2, kw
    with torch.no_grad():  # inference: no gradient asked, no error
        kernels.attention(q, k, v, **kw)
    if "softcap" in kw:
        torch.library.opcheck(ops.fwd_op, (q.detach(), k.detach(), v.detach(), False, 0.125, "{}", -1, -1, 30.0),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_window_plain_equivalents_keep_the_backward(cpu_standin):
    """(-1, 0) non-causal is plain causal, and (-1, -1) is no window: both keep the (stand-in) backward."""
    q, k, v = _inputs(1, 20, 30, 2, 64, 64)
    kernels.attention(q, k, v, window_size=(-1, 0)).float().sum().backward()
    assert q.grad is not None
    kernels.attention(q, k, v, causal=True, window_size=(-1, 5)).float().sum().backward()
