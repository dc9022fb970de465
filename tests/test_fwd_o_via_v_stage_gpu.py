"""GPU checks of AttnConfig.o_via_v_stage (sm90 persistent forward where O shares Q's buffer: O through the last K/V
block's V stage in column chunks, that stage released after the epilogue, Q's buffer after the tile's last Q K^T; CPU
tests: tests/test_fwd_o_via_v_stage.py). Only the store's path changes, so every call must equal the kernel without it
bit for bit, into NaN-poisoned buffers (a row left unwritten stays NaN): hd256 and (192, 128), causal (the greedy walk)
and not (persistent, the split tail), ragged lengths (rows past seqlen_q, a CTA's several tiles), a window and a
softcap."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import SHAPES_DEFAULT

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 2)]


def _run(cfg, q, k, v, causal, **kw):
    from kernels.interface import attention_forward, resolve_config

    b, sq, h, hdim = q.shape
    out = torch.full((b, sq, h, v.shape[3]), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal, hdim ** -0.5, resolve_config(cfg, hdim, causal), out=out, lse=lse, **kw)
    return out, lse


def _same(extra, hdim, hdim_v, causal, shapes, **kw):
    for b, sq, sk, h in shapes:
        q = torch.randn(b, sq, h, hdim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, h, hdim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, h, hdim_v, device="cuda", dtype=torch.bfloat16)
        ref = _run(AttnConfig(**extra), q, k, v, causal, **kw)
        got = _run(AttnConfig(o_via_v_stage=True, **extra), q, k, v, causal, **kw)
        torch.cuda.synchronize()
        what = (extra, hdim, causal, (b, sq, sk, h), kw)
        assert not ref[0].isnan().any(), what
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), what


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", [(256, 256), (192, 128)])
def test_o_via_v_stage_is_bitwise_the_persistent_kernel(hdims, causal):
    _same({"persistent": True}, *hdims, causal, SHAPES)


def test_o_via_v_stage_default_calls():
    """hd256 causal up to 16k runs persistent by default (the greedy walk): the switch alone takes it there."""
    _same({}, 256, 256, True, SHAPES[:4])


def test_o_via_v_stage_split_tail():
    """hd256 non-causal 16k: whole tiles through the V stage, the tail's pieces to the workspace (their stage released
    without an epilogue)."""
    _same({"persistent": True, "split_tail": True}, 256, 256, False, [(1, 16384, 16384, 8)])


@pytest.mark.parametrize("causal", [False, True])
def test_o_via_v_stage_window_softcap(causal):
    _same({"persistent": True}, 256, 256, causal, SHAPES[:4], window_left=300, window_right=-1 if causal else 200)
    _same({"persistent": True}, 256, 256, causal, SHAPES[:4], softcap=30.0)
