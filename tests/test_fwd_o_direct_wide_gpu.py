"""GPU checks of AttnConfig.o_direct_wide (o_direct's stores 16 bytes wide after a transpose within each quad of
lanes; CPU tests: tests/test_fwd_o_direct_wide.py). Only how O is written changes, so every call must equal o_direct's
(itself bitwise the default's) bit for bit, into NaN-poisoned buffers (a row or column piece left unwritten stays NaN,
a piece written to the wrong columns breaks the equality): every head dim, causal or not, the call's own kernel and
one tile per CTA, ragged lengths (rows past seqlen_q in a warp's rows), the split tail, a window and a softcap."""
from __future__ import annotations

import functools

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS
from test_fwd_o_direct_gpu import SHAPES
from test_fwd_o_direct_gpu import _same as same_as_without

pytestmark = pytest.mark.gpu

_same = functools.partial(same_as_without, switch="o_direct_wide")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
@pytest.mark.parametrize("extra", [{}, {"persistent": False}], ids=["default", "one_tile"])
def test_o_direct_wide_is_bitwise_o_direct(extra, hdims, causal):
    _same({"o_direct": True, **extra}, *hdims, causal, SHAPES)


def test_o_direct_wide_split_tail():
    """hd256 non-causal 16k: the split tail (whole tiles stored by the wide stores, tail pieces to the workspace)."""
    _same({"o_direct": True, "persistent": True, "split_tail": True}, 256, 256, False, [(1, 16384, 16384, 8)])


@pytest.mark.parametrize("causal", [False, True])
def test_o_direct_wide_window_softcap(causal):
    _same({"o_direct": True}, 256, 256, causal, SHAPES[:4], window_left=300, window_right=-1 if causal else 200)
    _same({"o_direct": True}, 128, 128, causal, SHAPES[:4], softcap=30.0)


def test_hd256_causal_32k_default_is_bitwise_one_tile():
    """Since session 68 hd256 causal 32k is persistent by its length (the greedy walk, O in 16-byte stores from
    registers; before: one tile per CTA). Every tile is computed with the same products in the same order, so the
    default's out and lse must equal the one-tile kernel's bit for bit, into NaN-poisoned buffers."""
    from kernels.interface import forward_config, resolve_config
    from test_fwd_o_direct_gpu import _run

    cfg = forward_config(resolve_config(AttnConfig(), 256, True), 256, True, 32768)
    assert cfg.persistent and cfg.persistent_greedy and cfg.o_direct_wide
    q, k, v = (torch.randn(1, 32768, 4, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = _run(AttnConfig(persistent=False), q, k, v, True)
    got = _run(AttnConfig(), q, k, v, True)
    torch.cuda.synchronize()
    assert not ref[0].isnan().any() and not ref[1].isnan().any()
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
