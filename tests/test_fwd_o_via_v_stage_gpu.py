"""GPU checks of AttnConfig.o_via_v_stage (sm90 persistent forward where O shares Q's buffer: O through the last K/V
block's V stage in column chunks, that stage released after the epilogue, Q's buffer after the tile's last Q K^T; CPU
tests: tests/test_fwd_o_via_v_stage.py). Only the store's path changes, so every call must equal the kernel without it
bit for bit, into NaN-poisoned buffers (a row left unwritten stays NaN): hd256 and (192, 128), causal (the greedy walk)
and not (persistent, the split tail), ragged lengths (rows past seqlen_q, a CTA's several tiles), a window and a
softcap."""
from __future__ import annotations

import functools

import pytest

from test_fwd_o_direct_gpu import SHAPES
from test_fwd_o_direct_gpu import _same as same_as_without

pytestmark = pytest.mark.gpu

_same = functools.partial(same_as_without, switch="o_via_v_stage")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", [(256, 256), (192, 128)])
def test_o_via_v_stage_is_bitwise_the_persistent_kernel(hdims, causal):
    _same({"persistent": True}, *hdims, causal, SHAPES)


@pytest.mark.parametrize("causal", [False, True])
def test_o_via_v_stage_default_calls(causal):
    """hd256 runs persistent by default up to 8k non-causal and 16k causal (the greedy walk), with the switch on since
    session 66: the default calls against the same calls with it turned off."""
    _same({}, 256, 256, causal, SHAPES[:4])


def test_o_via_v_stage_split_tail():
    """hd256 non-causal 16k: whole tiles through the V stage, the tail's pieces to the workspace (their stage released
    without an epilogue)."""
    _same({"persistent": True, "split_tail": True}, 256, 256, False, [(1, 16384, 16384, 8)])


@pytest.mark.parametrize("causal", [False, True])
def test_o_via_v_stage_window_softcap(causal):
    _same({"persistent": True}, 256, 256, causal, SHAPES[:4], window_left=300, window_right=-1 if causal else 200)
    _same({"persistent": True}, 256, 256, causal, SHAPES[:4], softcap=30.0)
