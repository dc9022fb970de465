"""GPU checks of AttnConfig.early_desc (sm90 forward: the K / V stages' wgmma descriptors before the block's waits;
CPU tests: tests/test_fwd_early_desc.py): only uniform address arithmetic moves, so out / lse must equal the default's
bit for bit, at every head dim, causal and not, one tile per CTA and persistent, and with the other loop shapes."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT
from test_fwd_loop_shape_gpu import bitwise

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_early_desc_is_bitwise_the_default(hdims, causal):
    hdim, hdim_v = hdims
    bitwise(AttnConfig(early_desc=True), AttnConfig(), hdim, hdim_v, causal, SHAPES, exact=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{"persistent": True}, {"persistent": False}, {"speculative_exp": False},
                                   {"rescale_before_pv": True}, {"pingpong": False}],
                         ids=["persistent", "one_tile", "eager", "prepv", "no_pingpong"])
def test_early_desc_with_other_switches(extra, causal):
    for hdim in (64, 128):
        bitwise(AttnConfig(early_desc=True, **extra), AttnConfig(**extra), hdim, hdim, causal, SHAPES[:4], exact=True)
