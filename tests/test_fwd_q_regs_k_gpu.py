"""GPU checks of AttnConfig.q_regs_k (sm90 forward: Q K^T's first k-blocks of Q from registers; CPU tests:
tests/test_fwd_q_regs_k.py). The same products in the same wgmma group, so out / lse equal the default's up to a
rounding (ptxas may fuse differently in another layout), at hd256 and (192, 128), causal and not, one tile per CTA and
persistent, with the overlapped loop and without."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig
from test_fwd_gpu import SHAPES_DEFAULT
from test_fwd_loop_shape_gpu import bitwise

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims,k", [((256, 256), 4), ((256, 256), 8), ((256, 256), 1), ((192, 128), 4)])
def test_q_regs_k_is_the_default(hdims, k, causal):
    bitwise(AttnConfig(q_regs_k=k), AttnConfig(), *hdims, causal, SHAPES)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{"persistent": True}, {"intra_wg_overlap": False}, {"pingpong": False}],
                         ids=["persistent", "serial", "no_pingpong"])
def test_q_regs_k_with_other_switches(extra, causal, monkeypatch):
    """(persistent: the SM count patched down so each CTA walks several tiles and reloads Q's registers per tile)"""
    import kernels.interface as itf

    monkeypatch.setattr(itf, "_sm_count", lambda index: 3)
    bitwise(AttnConfig(q_regs_k=4, **extra), AttnConfig(**extra), 256, 256, causal, SHAPES)


@pytest.mark.parametrize("causal", [False, True])
def test_q_regs_k_with_speculative_exp(causal):
    """(192, 128)'s default speculates (the bitwise helper's runs turn it off): the redo arm's second QK^T too."""
    from test_fwd_speculative_exp_gpu import rare_arm_inputs

    bitwise(AttnConfig(q_regs_k=4, speculative_exp=True), AttnConfig(speculative_exp=True), 192, 128, causal, SHAPES)
    from test_fwd_loop_shape_gpu import _run, same_up_to_rounding

    q, k, v = rare_arm_inputs(192)
    v = v[..., :128].contiguous()
    ref = _run(AttnConfig(speculative_exp=True), q, k, v, causal, 192, 128)
    got = _run(AttnConfig(q_regs_k=4, speculative_exp=True), q, k, v, causal, 192, 128)
    same_up_to_rounding(got, ref, f"rare arm (192, 128) causal={causal}")
