"""GPU checks of AttnConfig.pv_wait_mid (sm90 forward; notes: /work/notes/fwd_s9.md): the same arithmetic laid out
differently (a quarter of each block's exponentials inside both arms of the tau decision, the P V wait and the V
release after them, the rest after; P by inline PTX; causal_split implied at causal), so out / lse equal the default's
up to one rounding (test_fwd_loop_shape_gpu.bitwise), plus the accuracy bound of tests/test_fwd_gpu.py on real shapes
(bf16 and fp16, the emulated exp2 on part of the head columns, persistent, rescale_before_pv)."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT, run_case
from test_fwd_loop_shape_gpu import bitwise as _bitwise

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_pv_wait_mid_matches_the_default(hdims, causal):
    hdim, hdim_v = hdims
    _bitwise(AttnConfig(pv_wait_mid=True), AttnConfig(pv_wait_mid=False), hdim, hdim_v, causal, SHAPES)


@pytest.mark.parametrize("hdims", [(64, 64), (128, 128)])
def test_pv_wait_mid_matches_the_split_kernel(hdims):
    """At hd64 / hd128 causal the default is the one-loop kernel; against the split one too (what it implies)."""
    hdim, hdim_v = hdims
    _bitwise(AttnConfig(pv_wait_mid=True), AttnConfig(causal_split=True), hdim, hdim_v, True, SHAPES)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"persistent": True}, {"rescale_before_pv": True},
                                   {"exp2_emu_fraction": 0.25}, {"rescale_threshold": 2.0}],
                         ids=["plain", "persistent", "prepv", "emu", "tau2"])
@pytest.mark.parametrize("hdims", [(192, 128), (64, 64)])
def test_pv_wait_mid_accuracy(hdims, extra, causal):
    hdim, hdim_v = hdims
    for shape in SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]:
        for dtype in (torch.bfloat16, torch.float16):
            run_case(AttnConfig(pv_wait_mid=True, speculative_exp=False, **extra),
                         hdim, hdim_v, dtype, causal, shape, check_model=False)
