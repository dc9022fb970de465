"""GPU checks of AttnConfig.p_before_vote (sm90 forward, speculative_exp's steady state: the wait for the previous P V,
its V release and the block's P conversion before the warpgroup's vote; the hd 64 / 128 non-causal default since
session 63; CPU tests: tests/test_fwd_p_before_vote.py), against the speculative step without it (``OFF``). A block that
keeps its maxima gets the same P, sums and maxima, so non-causal calls on gaussian inputs must equal it bit for bit;
where rows rescale (causal diagonal blocks, the votes' redo inputs: P converted a second time after the eager step)
ptxas may contract a row sum's update differently, so those compare within one rounding, as speculative_exp's own
tests do (tests/test_fwd_speculative_exp_gpu.py). H100, session 63: the gaussian non-causal cases and the
other-switch cases passed; the redo cases differed from ``OFF`` in one element of ~10^6 by one bf16 rounding (as the
speculative step differs from the eager one there)."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT
from test_fwd_loop_shape_gpu import bitwise
from test_fwd_speculative_exp_gpu import redo_and_nan_match

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 2)]
# (test_fwd_loop_shape_gpu._run turns an unset speculative_exp off; spec_warp_redo, hd64's default since session 64,
# pinned off: its own tests are tests/test_fwd_spec_warp_redo_gpu.py)
ON = dict(speculative_exp=True, p_before_vote=True, spec_warp_redo=False)
OFF = dict(speculative_exp=True, p_before_vote=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_p_before_vote_is_bitwise_the_speculative_step(hdims, causal):
    bitwise(AttnConfig(**ON), AttnConfig(**OFF), *hdims, causal, SHAPES, exact=not causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{"persistent": True}, {"persistent": False}, {"pingpong": False},
                                   {"q_in_regs": False}, {"tile_n": 112}],
                         ids=["persistent", "one_tile", "no_pingpong", "q_smem", "tile_n112"])
def test_p_before_vote_with_other_switches(extra, causal):
    for hdim in (64, 128):
        bitwise(AttnConfig(**ON, **extra), AttnConfig(**OFF, **extra), hdim, hdim, causal, SHAPES[:4],
                exact=not causal)


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_p_before_vote_redo_and_nan(hdim, causal):
    """The rare arm's inputs (keys near the start scaled up: the votes redo S from the held K stage), then the same with
    one query row NaN (NaN sums: the block is redone)."""
    redo_and_nan_match(AttnConfig(**ON), AttnConfig(**OFF), hdim, causal)
