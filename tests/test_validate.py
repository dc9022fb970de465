"""Input errors of the attention API: one line naming the argument and what is supported."""
import pytest
import torch

from kernels import ConfigError, InputError
from kernels.validate import check_qkv, check_scale


def _qkv(b=1, s=8, h=2, d=64, dtype=torch.bfloat16, dv=None):
    return (torch.randn(b, s, h, d, dtype=dtype), torch.randn(b, s, h, d, dtype=dtype),
            torch.randn(b, s, h, dv or d, dtype=dtype))


def _err(fn, *a, **kw):
    with pytest.raises((InputError, ConfigError)) as e:
        fn(*a, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_good_inputs_pass():
    check_qkv(*_qkv())
    check_qkv(*_qkv(d=192, dv=128))


def test_dtype():
    assert "dtype" in _err(check_qkv, *_qkv(dtype=torch.float32)) and "bfloat16" in _err(check_qkv, *_qkv(dtype=torch.float32))


def test_rank():
    q, k, v = _qkv()
    assert "rank 4" in _err(check_qkv, q[0], k, v)


def test_head_dim_unsupported_and_mismatch():
    assert "head_dim" in _err(check_qkv, *_qkv(d=96))
    q, k, v = _qkv()
    assert "head_dim" in _err(check_qkv, q, k[..., :32].contiguous(), v)


def test_mismatched_shapes():
    q, k, v = _qkv()
    assert "batch" in _err(check_qkv, q, torch.cat([k, k]), v)
    assert "seqlen_k" in _err(check_qkv, q, k, v[:, :4])
    assert "heads" in _err(check_qkv, q, k[:, :, :1], v)


def test_non_contiguous_last_dim():
    q, k, v = _qkv()
    strided = torch.randn(1, 8, 2, 128, dtype=torch.bfloat16)[..., ::2]
    assert strided.shape == q.shape and strided.stride(-1) == 2
    assert "contiguous" in _err(check_qkv, strided, k, v)


def test_device():
    assert "CUDA" in _err(check_qkv, *_qkv(), need_cuda=True)


def test_scale():
    assert "softmax_scale" in _err(check_scale, -1.0)
    check_scale(None)
    check_scale(0.125)
