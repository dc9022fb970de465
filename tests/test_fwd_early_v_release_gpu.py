"""GPU checks of early_v_release (sm90 forward; notes: /work/notes/fwd_s10.md): the P V wait and the V-stage release
moved before the rescale decision; the same floating-point instructions (CPU SASS, tests/test_fwd_early_v_release.py),
so out / lse must equal the default's bit for bit, plus the accuracy bound of tests/test_fwd_gpu.py (bf16 and fp16,
tau 0, the emulated exp2, persistent). Needs the AttnConfig field (skipped until the config carries it)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT, run_case
from test_fwd_loop_shape_gpu import bitwise as _bitwise

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("early_v_release" not in {f.name for f in dataclasses.fields(AttnConfig)},
                                 reason="AttnConfig.early_v_release not wired yet")]

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_early_v_release_is_bitwise_the_default(hdims, causal):
    hdim, hdim_v = hdims
    # pv_wait_mid off on both sides (the default at hd128 non-causal and (192, 128) causal: early_v_release yields to it)
    _bitwise(AttnConfig(early_v_release=True, pv_wait_mid=False), AttnConfig(pv_wait_mid=False), hdim, hdim_v, causal,
             SHAPES, exact=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"persistent": True}, {"rescale_threshold": 0.0}, {"exp2_emu_fraction": 0.25},
                                   {"exp_in_branch": False}],
                         ids=["plain", "persistent", "tau0", "emu", "no_exb"])
@pytest.mark.parametrize("hdims", [(128, 128), (64, 64)])
def test_early_v_release_accuracy(hdims, extra, causal):
    hdim, hdim_v = hdims
    for shape in SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]:
        for dtype in (torch.bfloat16, torch.float16):
            run_case(AttnConfig(early_v_release=True, speculative_exp=False, **extra),
                         hdim, hdim_v, dtype, causal, shape, check_model=False)
