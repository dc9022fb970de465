"""Issue 13.2: the attention API reports input errors in a fixed order (shape, dtype, head dim, scale, causal,
config, then device), so on a CPU every error but the device one is still named."""
import pytest
import torch

from kernels import ConfigError, InputError, attention


def _t(s=64, d=64, dtype=torch.bfloat16):
    return torch.randn(1, s, 2, d).to(dtype)


def _err(*args, **kw) -> str:
    with pytest.raises((InputError, ConfigError, TypeError)) as e:
        attention(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("args, kw, starts", [
    ((_t(s=0), _t(), _t()), {}, "shape: batch, seqlen and heads must be >= 1"),
    ((_t(dtype=torch.float32),) * 3, {}, "q: dtype torch.float32 is not supported"),
    ((_t(d=96),) * 3, {}, "head_dim: (qk, v) = (96, 96) is not supported"),
    ((_t(),) * 3, {"softmax_scale": "x"}, "softmax_scale='x': must be None"),
    ((_t(),) * 3, {"causal": 1}, "causal=1: must be a bool"),
    ((_t(),) * 3, {"config": {"tile_m": 64}}, "config: expected kernels.AttnConfig or None, got dict"),
    ((_t(),) * 3, {}, "q: device cpu is not supported; the kernels need a CUDA tensor"),
])
def test_each_error_is_reported_on_a_cpu(args, kw, starts):
    assert _err(*args, **kw).startswith(starts)


def test_order_when_several_are_wrong():
    bad_all = dict(softmax_scale=-1.0, causal="yes")
    assert _err(_t(s=0, d=96, dtype=torch.float32), _t(d=96), _t(d=96), **bad_all).startswith("shape:")
    assert _err(_t(d=96, dtype=torch.float32), _t(d=96), _t(d=96), **bad_all).startswith("q: dtype")
    assert _err(_t(d=96), _t(d=96), _t(d=96), **bad_all).startswith("head_dim:")
    assert _err(_t(), _t(), _t(), **bad_all).startswith("softmax_scale=-1.0")
    assert _err(_t(), _t(), _t(), causal="yes").startswith("causal='yes'")
