"""GPU checks of AttnConfig.p_cvt_asm (sm90 forward; notes: /work/notes/fwd_s8.md): the same arithmetic laid out
differently (inline-PTX P conversion, pinned row sums, top-tested K/V loop), so out / lse equal the default's up to one
rounding (test_fwd_loop_shape_gpu.bitwise), plus the accuracy bound of tests/test_fwd_gpu.py on real shapes."""
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
def test_p_cvt_asm_matches_the_default(hdims, causal):
    hdim, hdim_v = hdims
    _bitwise(AttnConfig(p_cvt_asm=True), AttnConfig(p_cvt_asm=False), hdim, hdim_v, causal, SHAPES)  # (on by default somewhere)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"persistent": True}, {"rescale_threshold": 0.0}, {"rescale_before_pv": True},
                                   {"causal_split": True}],
                         ids=["plain", "persistent", "tau0", "prepv", "split"])
def test_p_cvt_asm_accuracy_hd128(extra, causal):
    for shape in SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]:
        run_case(AttnConfig(p_cvt_asm=True, speculative_exp=False, **extra),
                     128, 128, torch.bfloat16, causal, shape, check_model=False)
        run_case(AttnConfig(p_cvt_asm=True, speculative_exp=False, **extra),
                     128, 128, torch.float16, causal, shape, check_model=False)
