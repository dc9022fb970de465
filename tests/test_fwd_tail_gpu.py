"""GPU checks of the forward recipes of /work/notes/fwd_s7b.md (H100 / H200).

``lpt_l2_mb`` only reorders the causal tiles (each tile's arithmetic is unchanged): out / lse bit for bit the default's.
``causal_split`` and ``rescale_before_pv`` lay the same arithmetic out differently: equal up to one rounding
(test_fwd_loop_shape_gpu.bitwise). ``rescale_threshold``
0 (always rescale) is a different rounding: the accuracy bound of tests/test_fwd_gpu.py.
"""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT, run_case
from test_fwd_loop_shape_gpu import bitwise as _bitwise

pytestmark = pytest.mark.gpu


# several (head, batch) groups at either budget: 10 heads at 16k / 2 x 8k ((192, 128): groups of 2 / 4 vs 4 / 8)
L2_SHAPES = [(1, 16384, 16384, 10), (2, 8192, 8192, 10), (3, 1000, 1000, 5), (2, 2048, 3000, 4)]


@pytest.mark.parametrize("hdims", HDIM_PAIRS)
@pytest.mark.parametrize("l2", [1, 50, 1024])
def test_lpt_l2_mb_is_bitwise_the_default(hdims, l2):
    hdim, hdim_v = hdims
    _bitwise(AttnConfig(lpt_l2_mb=l2), AttnConfig(), hdim, hdim_v, True, L2_SHAPES, exact=True)
    _bitwise(AttnConfig(lpt_l2_mb=l2, persistent=True), AttnConfig(persistent=True), hdim, hdim_v, True,
             L2_SHAPES[2:], exact=True)


@pytest.mark.parametrize("causal", [False, True])
def test_split_prepv_192_matches_the_one_loop_kernel(causal):
    """(192, 128): the split loop with rescale_before_pv (causal's default from 2026-12-01 to 2026-12-03, when
    rescale_before_pv went off; pv_wait_mid, which implies the split, off on both sides here) against the one-loop
    kernel it replaced. It differs from today's causal default (without pv_wait_mid) in rescale_before_pv alone."""
    import dataclasses

    cfg = AttnConfig(causal_split=True, rescale_before_pv=True, pv_wait_mid=False)
    today = AttnConfig(pv_wait_mid=False).resolve("sm90", 192, True)
    assert cfg.resolve("sm90", 192, True) == dataclasses.replace(today, rescale_before_pv=True)
    _bitwise(cfg, AttnConfig(causal_split=False, rescale_before_pv=False, pv_wait_mid=False), 192, 128, causal,
             SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)])


@pytest.mark.parametrize("hdims", [(192, 128), (128, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_split_tau0_accuracy(hdims, causal):
    hdim, hdim_v = hdims
    cfg = AttnConfig(causal_split=True, rescale_threshold=0.0)
    for shape in SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]:
        run_case(cfg, hdim, hdim_v, torch.bfloat16, causal, shape, check_model=False)
