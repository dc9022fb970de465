"""The host path of an eager call (CPU; no kernel runs): what the eager autograd Function hands its backward, the
backward's input checks, the memoised pieces and AttnConfig's cached hash.

- The eager Function routes its backward to ``kernels.sm90.backward.backward_trusted`` (no second input check) with
  the tensors the forward saved, the config resolved from its string, and the window / softcap only when used; the
  never-used gradient of lse is not materialized (None, not a zeros tensor).
- ``attention_backward`` (the public entry and the torch.library op's) still checks its inputs, in the same order.
- AttnConfig's hash is computed once, equal for equal configs, and rebuilt (not copied) by pickle in another process.
"""
import dataclasses
import pickle
import subprocess
import sys

import pytest
import torch

from kernels import AttnConfig, ops
from kernels.config import resolve_cached
from kernels.sm90 import backward as bwd


def _recording_function(monkeypatch):
    """An eager Function made by ops._eager_function with a CPU forward and ops._bwd_eager as its backward, whose
    backward_trusted is replaced by a recorder returning recognisable gradients."""
    calls = []

    def fake_trusted(q, k, v, out, dout, lse, causal, scale, config, **kw):
        calls.append(dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, causal=causal, scale=scale, config=config, **kw))
        return torch.full_like(q, 1.0), torch.full_like(k, 2.0), torch.full_like(v, 3.0)

    monkeypatch.setattr(ops, "backward_trusted", fake_trusted)

    def fwd(q, k, v, causal, scale, config, *features):
        return (q * 2).detach(), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    return ops._eager_function("_Recorder", fwd, ops._bwd_eager, 3), calls


def test_eager_backward_goes_to_backward_trusted_with_the_saved_tensors(monkeypatch):
    fn, calls = _recording_function(monkeypatch)
    q, k, v = (torch.randn(1, 5, 2, 64, requires_grad=True) for _ in range(3))
    out, lse = fn.apply(q, k, v, True, 0.125, '{"deterministic":true}')
    dout = torch.randn_like(out)
    out.backward(dout)
    assert len(calls) == 1
    c = calls[0]
    assert c["q"] is not None and torch.equal(c["q"], q.detach()) and torch.equal(c["dout"], dout)
    assert torch.equal(c["out"], out.detach()) and c["lse"].shape == (1, 2, 5)
    assert c["causal"] is True and c["scale"] == 0.125
    assert c["config"] == resolve_cached(AttnConfig(deterministic=True), "sm90", 64, True)
    assert (c["window_left"], c["window_right"], c["softcap"]) == (-1, -1, 0.0)
    assert torch.equal(q.grad, torch.ones_like(q)) and torch.equal(v.grad, torch.full_like(v, 3.0))


def test_eager_backward_passes_window_and_softcap(monkeypatch):
    fn, calls = _recording_function(monkeypatch)
    q, k, v = (torch.randn(1, 5, 2, 64, requires_grad=True) for _ in range(3))
    out, _ = fn.apply(q, k, v, False, 0.125, "{}", 3, 1, 30.0)
    out.sum().backward()
    assert (calls[0]["window_left"], calls[0]["window_right"], calls[0]["softcap"]) == (3, 1, 30.0)
    assert calls[0]["causal"] is False


def test_lse_gradient_is_not_materialized_and_no_grad_flow_returns_none(monkeypatch):
    fn, calls = _recording_function(monkeypatch)
    q, k, v = (torch.randn(1, 5, 2, 64, requires_grad=True) for _ in range(3))
    out, lse = fn.apply(q, k, v, True, 0.125, "{}")
    assert not lse.requires_grad  # non-differentiable
    seen = {}

    def spy(ctx, dout, dlse):
        seen["dlse"] = dlse
        return real(ctx, dout, dlse)
    real = fn.backward
    monkeypatch.setattr(fn, "backward", staticmethod(spy))
    out.sum().backward()
    assert seen["dlse"] is None  # a materialized gradient would be a zeros tensor
    # a graph in which nothing flows into out: the backward returns None gradients, no kernel call
    ctx = type("Ctx", (), {"args": (True, 0.125, "{}")})()
    assert ops._Autograd(3, None).backward(ctx, None, None) == (None,) * 6


def test_attention_backward_still_checks_inputs_in_order():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match=r"^q: expected a 4-D .* CUDA tensor"):
        bwd.attention_backward(q, q, q, q, q, lse, True, None, None)
    with pytest.raises(ValueError, match=r"^q: expected a 4-D"):
        bwd.check_backward_inputs(q, q, q, q, q, lse)


def test_check_backward_inputs_shapes_and_lse(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the checks after the device one
    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 16, 2, 64, dtype=torch.bfloat16)  # GQA: 2 K/V heads for 4 Q heads
    lse = torch.zeros(2, 4, 8)
    bwd.check_backward_inputs(q, k, k, q, q, lse)  # valid
    with pytest.raises(ValueError, match=r"^lse: expected fp32"):
        bwd.check_backward_inputs(q, k, k, q, q, lse.double())
    with pytest.raises(ValueError, match=r"^lse: expected fp32 \(batch, heads, seqlen_q\)"):
        bwd.check_backward_inputs(q, k, k, q, q, torch.zeros(2, 8, 4))
    with pytest.raises(ValueError, match=r"^dout: expected shape \(2, 8, 4, 64\)"):
        bwd.check_backward_inputs(q, k, k, q, q[:, :7], lse)
    with pytest.raises(ValueError, match=r"^v: expected shape"):
        bwd.check_backward_inputs(q, k, k[:, :15], q, q, lse)
    with pytest.raises(ValueError, match=r"heads"):
        bwd.check_backward_inputs(q, torch.randn(2, 16, 3, 64, dtype=torch.bfloat16),
                                  torch.randn(2, 16, 3, 64, dtype=torch.bfloat16), q, q, lse)


def test_config_hash_cached_equal_and_distinct():
    a, b = AttnConfig(), AttnConfig()
    assert a is not b and a == b and hash(a) == hash(b)
    c = AttnConfig(deterministic=True)
    assert c != a and {a: 1, c: 2}[b] == 1
    r = resolve_cached(None, "sm90", 128, True)
    assert hash(r) == hash(dataclasses.replace(r)) and r == dataclasses.replace(r)


def test_config_pickle_rebuilds_the_hash_in_another_process():
    code = ("import pickle, sys; from kernels import AttnConfig; "
            "sys.stdout.buffer.write(pickle.dumps(AttnConfig(det_schedule='naive', deterministic=True)))")
    blob = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1])).stdout
    there = pickle.loads(blob)
    here = AttnConfig(det_schedule="naive", deterministic=True)
    assert there == here and hash(there) == hash(here) and {here: 1}[there] == 1
