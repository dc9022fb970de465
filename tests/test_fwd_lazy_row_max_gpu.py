"""GPU checks of lazy_row_max (sm90 forward; CPU SASS: tests/test_fwd_lazy_row_max.py): the rescale decision on each
thread's own maxima and the quad's shuffles only in the rescale arm give the same values, so out / lse must equal the
default's bit for bit, at every head dim, causal both, and with the switches the decision interacts with (exp_in_branch,
pv_wait_mid, early_v_release, persistent, a window, tau 0 where it is off)."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT
from test_fwd_loop_shape_gpu import bitwise

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 2)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_lazy_row_max_is_bitwise_the_default(hdims, causal):
    bitwise(AttnConfig(lazy_row_max=True), AttnConfig(lazy_row_max=False), *hdims, causal, SHAPES, exact=True)


@pytest.mark.parametrize("extra", [{"exp_in_branch": True}, {"exp_in_branch": False}, {"pv_wait_mid": True},
                                   {"early_v_release": True, "pv_wait_mid": False}, {"persistent": True},
                                   {"rescale_threshold": 0.0}, {"pingpong": False}, {"intra_wg_overlap": False}],
                         ids=["exb", "no_exb", "pv_mid", "evr", "persistent", "tau0", "no_pingpong", "serial"])
@pytest.mark.parametrize("causal", [False, True])
def test_lazy_row_max_with_the_other_switches(extra, causal):
    bitwise(AttnConfig(lazy_row_max=True, **extra), AttnConfig(lazy_row_max=False, **extra), 128, 128, causal, SHAPES[:4],
            exact=True)
