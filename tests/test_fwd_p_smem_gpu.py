"""GPU checks of AttnConfig.p_smem (sm90 forward: P V with P from shared memory; CPU tests: tests/test_fwd_p_smem.py).

On the default tile the P V GEMM reads the same 16-bit P from shared memory instead of registers, so out / lse must
equal the default's up to one rounding (ptxas may fuse a multiply-add in one layout and not in the other). On wider
hd64 key blocks (tile_n 160 / 176 / 192) the blocks and rescale points differ: those are checked against the fp32
reference within the bound of tests/test_fwd_gpu.py."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import SHAPES_DEFAULT, run_case
from test_fwd_loop_shape_gpu import bitwise

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", [64, 128])
def test_p_smem_on_the_default_tile_is_the_default(hdim, causal):
    bitwise(AttnConfig(p_smem=True), AttnConfig(), hdim, hdim, causal, SHAPES)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile_n", [160, 176, 192])
def test_p_smem_wide_key_blocks_hd64(tile_n, causal):
    cfg = AttnConfig(p_smem=True, tile_n=tile_n)
    for i, shape in enumerate(SHAPES_DEFAULT + [(1, 4096, 4096, 2)]):
        run_case(cfg, 64, 64, torch.bfloat16, causal, shape, check_model=False)
    run_case(cfg, 64, 64, torch.float16, causal, SHAPES_DEFAULT[0], check_model=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{"persistent": True}, {"persistent": False}, {"speculative_exp": False},
                                   {"rescale_before_pv": True}, {"pingpong": False}, {"intra_wg_overlap": False},
                                   {"early_desc": True}],
                         ids=["persistent", "one_tile", "eager", "prepv", "no_pingpong", "serial", "early_desc"])
def test_p_smem_with_other_switches(extra, causal):
    for hdim in (64, 128):
        bitwise(AttnConfig(p_smem=True, **extra), AttnConfig(**extra), hdim, hdim, causal, SHAPES[:4])
    run_case(AttnConfig(p_smem=True, tile_n=192, **extra), 64, 64, torch.bfloat16, causal, SHAPES[3],
             check_model=False)
