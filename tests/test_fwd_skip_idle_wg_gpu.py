"""GPU checks of AttnConfig.skip_idle_wg (sm90 forward: a consumer warpgroup whose rows all lie past seqlen_q keeps the
barrier protocol but issues no GEMM or softmax; CPU tests: tests/test_fwd_skip_idle_wg.py): the other warpgroups' rows
run the same arithmetic and the idle rows are never stored, so out / lse must equal the default's bit for bit. Shapes
whose last Q tile leaves one or two warpgroups idle at 192-row tiles (hd64: 40, 17, 64, 65, 128 valid rows) and 128-row
tiles (1 and 17 valid rows), causal and not, one tile per CTA and persistent."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS
from test_fwd_loop_shape_gpu import bitwise

pytestmark = pytest.mark.gpu

SHAPES = [(2, 1000, 1000, 3), (1, 17, 4097, 2), (1, 4096, 4096, 2), (1, 257, 777, 3), (2, 8192, 8192, 2),
          (2, 1025, 1025, 2)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_skip_idle_wg_is_bitwise_the_default(hdims, causal):
    hdim, hdim_v = hdims
    bitwise(AttnConfig(skip_idle_wg=True), AttnConfig(), hdim, hdim_v, causal, SHAPES, exact=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{"persistent": True}, {"persistent": False}, {"speculative_exp": False},
                                   {"pingpong": False}], ids=["persistent", "one_tile", "eager", "no_pingpong"])
def test_skip_idle_wg_with_other_switches(extra, causal):
    for hdim in (64, 128):
        bitwise(AttnConfig(skip_idle_wg=True, **extra), AttnConfig(**extra), hdim, hdim, causal, SHAPES[:4], exact=True)
