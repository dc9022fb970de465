"""GPU checks of AttnConfig.qk_halves (sm90 forward, speculative_exp's steady state: each block's S = Q K^T as two
wgmma groups of tile_n/2 key columns, the first half's exponentials before the wait for the second; CPU tests:
tests/test_fwd_qk_halves.py). The products, exponentials and partial sums are the speculative step's, in the same order,
so out / lse must equal the default's bit for bit: on gaussian inputs, on inputs whose later blocks make the votes redo
S (the halves issued again from the held K stage), and with NaN in a query row (the first half's NaN branch)."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT
from test_fwd_loop_shape_gpu import _run, bitwise
from test_fwd_speculative_exp_gpu import rare_arm_inputs

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 2)]
# (test_fwd_loop_shape_gpu._run turns an unset speculative_exp off; p_before_vote, the hd 64 / 128 non-causal default
# since session 63, pinned off: these cases were measured against the speculative step without it)
SPEC = dict(speculative_exp=True, p_before_vote=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_qk_halves_is_bitwise_the_default(hdims, causal):
    bitwise(AttnConfig(qk_halves=True, **SPEC), AttnConfig(**SPEC), *hdims, causal, SHAPES, exact=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{"persistent": True}, {"persistent": False}, {"pingpong": False},
                                   {"q_in_regs": False}, {"tile_n": 112}],
                         ids=["persistent", "one_tile", "no_pingpong", "q_smem", "tile_n112"])
def test_qk_halves_with_other_switches(extra, causal):
    for hdim in (64, 128):
        bitwise(AttnConfig(qk_halves=True, **SPEC, **extra), AttnConfig(**SPEC, **extra), hdim, hdim, causal,
                SHAPES[:4], exact=True)


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_qk_halves_redo_and_nan(hdim, causal):
    """The rare arm's inputs (keys near the start scaled up: the votes redo S from the held K stage), then the same with
    one query row NaN (its first half's sums are NaN: the branch that waits for everything and redoes the block)."""
    q, k, v = rare_arm_inputs(hdim)
    for nan_row in (False, True):
        if nan_row:
            q[0, 1000, 0, 3] = float("nan")
        ref = _run(AttnConfig(**SPEC), q, k, v, causal, hdim, hdim)
        got = _run(AttnConfig(qk_halves=True, **SPEC), q, k, v, causal, hdim, hdim)
        torch.cuda.synchronize()
        for g, r in zip(got, ref):
            assert torch.equal(g.isnan(), r.isnan()), (hdim, causal, nan_row)
            assert torch.equal(g.nan_to_num(), r.nan_to_num()), (hdim, causal, nan_row)
        assert got[0].isnan().any() == nan_row
