"""GPU checks of AttnConfig.q_in_regs (sm90 forward: S = Q K^T with Q in registers; on by default at hd128): the
same products in the same order as the shared-memory operand, so out / lse equal those without it bit for bit; plus
the accuracy bound of tests/test_fwd_gpu.py with the switches it combines with (persistent tiles reload Q per tile)."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import SHAPES_DEFAULT, run_case
from test_fwd_loop_shape_gpu import bitwise as _bitwise

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 4)]
# head dims whose kernels keep Q in registers without spills (tests/test_fwd_q_in_regs.py)
HDIM_PAIRS = [(128, 128), (192, 128)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_q_in_regs_matches_the_default(hdims, causal):
    hdim, hdim_v = hdims
    _bitwise(AttnConfig(q_in_regs=True), AttnConfig(q_in_regs=False), hdim, hdim_v, causal, SHAPES, exact=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"persistent": True}, {"persistent": False}, {"pingpong": False},
                                   {"intra_wg_overlap": False}],
                         ids=["plain", "persistent", "one_tile", "nopp", "serial"])
def test_q_in_regs_accuracy_hd128(extra, causal):
    for shape in SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]:
        for dtype in (torch.bfloat16, torch.float16):
            run_case(AttnConfig(q_in_regs=True, **extra), 128, 128, dtype, causal, shape, check_model=False)
