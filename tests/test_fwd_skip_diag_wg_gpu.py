"""GPU checks of AttnConfig.skip_diag_wg (sm90 forward, causal, persistent: a consumer warpgroup whose rows all lie
before the tile's last K/V block skips it; hd256's causal default at 2049-16384 tokens; CPU tests:
tests/test_fwd_skip_diag_wg.py): every key of the skipped block is masked for those rows, so out / lse must equal those
of the kernel without it (skip_diag_wg=False) bit for bit (where the rows keep their first maxima, as the other
loop-shape checks; else up to one rounding). Causal shapes on the persistent kernels -- hd256 on the greedy walk (2k-32k
by default) and with the V stage (<= 2k), hd 64 / 128 / (192, 128) with persistent=True -- square and with more keys
than queries (bottom-right aligned), lengths that leave partial tiles."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS
from test_fwd_loop_shape_gpu import bitwise

pytestmark = pytest.mark.gpu

SHAPES = [(2, 4096, 4096, 2), (1, 1000, 1000, 3), (1, 777, 1500, 2), (2, 2048, 2048, 2), (1, 8192, 8192, 2),
          (1, 2000, 2100, 2)]


@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_skip_diag_wg_is_bitwise_the_default(hdims):
    hdim, hdim_v = hdims
    extra = {} if hdim == 256 else {"persistent": True}  # hd256 causal is persistent by default up to 32k
    bitwise(AttnConfig(skip_diag_wg=True, **extra), AttnConfig(skip_diag_wg=False, **extra), hdim, hdim_v, True, SHAPES,
            exact=True)


@pytest.mark.parametrize("extra", [{"speculative_exp": False, "lazy_row_max": False}, {"pingpong": False},
                                   {"o_via_v_stage": True}, {"persistent_greedy": False}],
                         ids=["eager", "no_pingpong", "v_stage", "round_robin"])
def test_skip_diag_wg_with_other_switches_at_hd256(extra):
    bitwise(AttnConfig(skip_diag_wg=True, **extra), AttnConfig(skip_diag_wg=False, **extra), 256, 256, True, SHAPES[:4],
            exact=True)


def test_hd256_causal_32k_with_skip_diag_wg_is_bitwise_the_default():
    bitwise(AttnConfig(skip_diag_wg=True), AttnConfig(skip_diag_wg=False), 256, 256, True, [(1, 32768, 32768, 1)],
            exact=True)


def test_hd256_causal_default_is_bitwise_without_the_skip():
    # the default takes it at 2049-16384 tokens (DEFAULTS' persistent_tile): the same out / lse as the kernel without
    bitwise(AttnConfig(), AttnConfig(skip_diag_wg=False), 256, 256, True, SHAPES, exact=True)
