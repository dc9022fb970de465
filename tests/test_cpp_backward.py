"""kernels/csrc/bwd_node.cpp (the eager backward as a C++ autograd node; FA4LAB_CPP_BWD=0 turns it off): built here
with the CPU torch, its three kernel calls recorded through a fake TVM FFI and checked against backward_trusted's
argument lists (shapes, dtypes, order, scalars) for the plan kinds it takes; errors; the autograd node on CPU
tensors; which calls take it. The real kernels and the bitwise comparison with the Python node:
tests/test_cpp_backward_gpu.py."""
from __future__ import annotations

import types

import pytest
import torch

from kernels.sm90 import cpp_backward as cb

BF16, F32, I32 = 4016, 2032, 32  # the fake's dtype tag: DLPack code * 1000 + bits
TENSOR, INT, FLOAT = 7, 1, 3  # TVM FFI type indices (DLTensor*, int, float)


@pytest.fixture(scope="module")
def ext():
    try:
        e = cb.load_extension()
    except Exception as err:  # no C++ compiler on this machine
        pytest.skip(f"the extension does not build here: {str(err).splitlines()[-1][:200]}")
    e.set_api(*e.fake_api(), 0, 0)
    e.fake_calls()
    yield e
    cb._ext, cb._why_not = None, None  # a later extension() sets the real TVM FFI entry points again


def _inputs(b=2, sq=100, sk=130, h=3, d=64, grad=False):
    q = torch.randn(b, sq, h, d, dtype=torch.bfloat16, requires_grad=grad)
    k = torch.randn(b, sk, h, d, dtype=torch.bfloat16, requires_grad=grad)
    v = torch.randn(b, sk, h, d, dtype=torch.bfloat16, requires_grad=grad)
    out = torch.randn(b, sq, h, d, dtype=torch.bfloat16)
    lse = torch.randn(b, h, sq, dtype=torch.float32)
    return q, k, v, out, lse


def _plan(ext, pre=1, main=2, post=3, tile_m=64, q_pad_rows=0, sem_rows=64, sem_mult=1, tile_n=128, ctas=0,
          zero_sem=False, stream_pre=False, stream_post=False):
    return ext.register_plan(pre, main, post, tile_m, q_pad_rows, sem_rows, sem_mult, tile_n, ctas, zero_sem,
                             stream_pre, stream_post)


def _t(*shape_and_dtype):
    return (TENSOR, list(shape_and_dtype), 0.0)


def test_one_tile_plan_calls_pre_main_post_as_backward_trusted(ext):
    q, k, v, out, lse = _inputs()
    dout = torch.randn_like(out)
    dq, dk, dv = ext.run_backward(q, k, v, out, dout, lse, _plan(ext), 0.125)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dq.dtype == torch.bfloat16
    calls = ext.fake_calls()
    assert [c[0] for c in calls] == [1, 2, 3]
    qkv_q, qkv_k, lse_t = (2, 100, 3, 64, BF16), (2, 130, 3, 64, BF16), (2, 3, 100, F32)
    rows = (2, 3, 128, F32)  # 100 Q rows padded to two 64-row tiles
    dqacc = (2, 3, 128, 64, F32)
    assert calls[0][1] == [_t(*qkv_q), _t(*qkv_q), _t(*lse_t), _t(*rows), _t(*rows), _t(*dqacc)]
    sem = (2, 3, 2, I32)  # one semaphore per 64-row tile
    assert calls[1][1] == [_t(*qkv_q), _t(*qkv_k), _t(*qkv_k), _t(*qkv_q), _t(*rows), _t(*rows), _t(*dqacc),
                           _t(*qkv_k), _t(*qkv_k), _t(*sem), (FLOAT, [], 0.125)]
    assert calls[2][1] == [_t(*dqacc), _t(*qkv_q), (FLOAT, [], 0.125)]


def test_streaming_persistent_plan_passes_the_semaphores_and_the_grid(ext):
    q, k, v, out, lse = _inputs()
    pid = _plan(ext, tile_m=80, q_pad_rows=80, sem_rows=8, sem_mult=2, ctas=132, zero_sem=True, stream_pre=True,
                stream_post=True)
    ext.run_backward(q, k, v, out, torch.randn_like(out), lse, pid, 0.5)
    pre, main, post = (c[1] for c in ext.fake_calls())
    rows = 2 * 80 + 80  # 100 rows in 80-row tiles, plus diag_align's extra tile
    sem = _t(2, 3, rows // 8 * 2, I32)
    assert pre[-1] == sem and len(pre) == 7
    assert main[9] == sem and main[10] == (FLOAT, [], 0.5)
    assert main[11] == (INT, [], 12.0)  # min(SMs 132, K/V tiles 2 x 3 heads x 2 batches)
    assert post[2:] == [sem, (INT, [], 130.0), (FLOAT, [], 0.5)]  # the postprocess streams: semaphores, seqlen_k


def test_errors_are_raised_not_swallowed(ext):
    q, k, v, out, lse = _inputs()
    with pytest.raises(RuntimeError, match="main kernel call failed"):
        ext.run_backward(q, k, v, out, torch.randn_like(out), lse, _plan(ext, main=13), 1.0)
    ext.fake_calls()
    with pytest.raises(RuntimeError, match="unknown plan"):
        ext.attach(q, k, v, out, lse, 10 ** 6, 1.0)
    with pytest.raises(RuntimeError, match="null kernel handle"):
        _plan(ext, pre=0)


def test_autograd_node_returns_the_three_gradients(ext):
    q, k, v, out, lse = _inputs(grad=True)
    y = ext.attach(q, k, v, out, lse, _plan(ext), 0.125)
    assert y.grad_fn is not None and "AttentionBackwardNode" in y.grad_fn.name()
    assert torch.equal(y, out) and not lse.requires_grad
    dq, dk, dv = torch.autograd.grad(y, (q, k, v), torch.randn_like(y))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert [c[0] for c in ext.fake_calls()] == [1, 2, 3]


def test_plan_fields_follow_backward_trusted():
    cfg = types.SimpleNamespace(bwd_tile_m=80, two_cta=False, deterministic=True)
    kern = dict(q_pad_rows=80, sem_rows=8, tile_n=128, persistent=False, stream_pre=True, stream_post=True,
                dq_claim=False)
    f = cb.plan_fields(cfg, kern, 132)
    assert f == dict(tile_m=80, q_pad_rows=80, sem_rows=8, sem_mult=1, tile_n=128, ctas=0, zero_sem=True,
                     stream_pre=True, stream_post=True)
    f = cb.plan_fields(types.SimpleNamespace(bwd_tile_m=64, two_cta=True, deterministic=False),
                       {**kern, "persistent": True, "q_pad_rows": 0}, 132)
    assert f["sem_mult"] == 2 and f["ctas"] == 132 and f["zero_sem"] is False


def test_gqa_plan_sums_the_per_head_gradients_into_kv_heads(ext):
    q, _, _, out, lse = _inputs(h=4)
    k, v = (torch.randn(2, 130, 2, 64, dtype=torch.bfloat16) for _ in range(2))  # 2 K/V heads for 4 Q heads
    dq, dk, dv = ext.run_backward(q, k, v, out, torch.randn_like(out), lse, _plan(ext), 0.125)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    main = ext.fake_calls()[1][1]
    assert main[1] == _t(2, 130, 2, 64, BF16)  # K with its own heads
    assert main[7] == main[8] == _t(2, 130, 4, 64, BF16)  # dK / dV per Q head (scratch), summed after the kernels


def test_which_calls_take_it(monkeypatch):
    q, k, v, *_ = _inputs(grad=True)
    assert cb.covers(q, k, v)
    assert cb.covers(q, k[:, :, :1].contiguous(), v[:, :, :1].contiguous())  # GQA too
    assert not cb.covers(q.transpose(1, 2), k, v)  # not contiguous
    with torch.no_grad():
        assert not cb.covers(q, k, v)
    monkeypatch.delenv(cb.ENV, raising=False)
    assert cb.enabled()  # on unless FA4LAB_CPP_BWD=0
    monkeypatch.setenv(cb.ENV, "0")
    assert not cb.enabled()
    monkeypatch.setattr(cb, "force", True)
    assert cb.enabled()


def test_a_backward_the_kernels_refuse_keeps_the_python_node(monkeypatch):
    """The forward of a call whose backward raises ConfigError (e.g. two_cta at (192, 128)) does not raise: the C++
    path steps aside and the Python node's backward raises it, as before; an uncompiled key steps aside too."""
    from kernels import ConfigError
    from kernels.sm90 import backward as bwd

    monkeypatch.setattr(cb, "extension", lambda: object())
    monkeypatch.setattr(bwd, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q, k, v, *_ = _inputs(grad=True)

    def refuse(*a, **kw):
        raise ConfigError("two_cta=True at hdim (192, 128)")
    monkeypatch.setattr(bwd, "_call_config", refuse)
    assert cb.attention(q, k, v, True, 0.125, None) is None
    monkeypatch.setattr(bwd, "_call_config", lambda *a, **kw: (None, ("bwd", "a key never compiled")))
    assert cb.attention(q, k, v, True, 0.125, None) is None
