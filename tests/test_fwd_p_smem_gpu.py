"""GPU checks of AttnConfig.p_smem (sm90 forward: P V with P from shared memory; CPU tests: tests/test_fwd_p_smem.py).

On the default tile the P V GEMM reads the same 16-bit P from shared memory instead of registers, so out / lse must
equal the default's up to one rounding (ptxas may fuse a multiply-add in one layout and not in the other). On wider
hd64 key blocks (tile_n 160 / 176 / 192) the blocks and rescale points differ: those are checked against the fp32
reference within the bound of tests/test_fwd_gpu.py. p_smem_early (one sP tile per K/V stage, P stored before the
wait for the previous P V, and again after speculative_exp's redo) against the default, also where the votes fire."""
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
@pytest.mark.parametrize("spec", [True, False], ids=["spec", "eager"])
def test_p_smem_on_the_default_tile_is_the_default(hdim, causal, spec):
    """(speculative_exp set either way: the bitwise helper's runs leave it off unless a config sets it)"""
    bitwise(AttnConfig(p_smem=True, speculative_exp=spec), AttnConfig(speculative_exp=spec), hdim, hdim, causal,
            SHAPES)


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
def test_p_smem_with_other_switches(extra, causal, monkeypatch):
    """(persistent: the SM count patched down, so each CTA walks several tiles and reuses sP across them)"""
    import kernels.interface as itf

    monkeypatch.setattr(itf, "_sm_count", lambda index: 3)
    for hdim in (64, 128):
        bitwise(AttnConfig(p_smem=True, **extra), AttnConfig(**extra), hdim, hdim, causal, SHAPES[:4])
    run_case(AttnConfig(p_smem=True, tile_n=192, **extra), 64, 64, torch.bfloat16, causal, SHAPES[3],
             check_model=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"persistent": True}, {"speculative_exp": False}, {"spec_redo_budget": 1},
                                   {"pingpong": False}, {"q_in_regs": True}],
                         ids=["default", "persistent", "eager", "budget1", "no_pingpong", "q_in_regs"])
def test_p_smem_early_is_the_default(extra, causal, monkeypatch):
    """p_smem_early (one sP tile per K/V stage, P stored before the wait for the previous P V) on hd64 / hd128's
    default tiles: the default's output up to a rounding. speculative_exp on unless the case turns it off (its store
    sits before the vote); persistent with the SM count patched down, so each CTA walks several tiles."""
    import kernels.interface as itf

    monkeypatch.setattr(itf, "_sm_count", lambda index: 3)
    extra = {"speculative_exp": True, **extra}
    for hdim in (64, 128):
        bitwise(AttnConfig(p_smem=True, p_smem_early=True, **extra), AttnConfig(**extra), hdim, hdim, causal,
                SHAPES[:4])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", [64, 128])
def test_p_smem_early_redo_arm(hdim, causal):
    """speculative_exp's rare arm stores P again after its second QK^T: keys 0..1023 (visited last) scaled up so the
    votes fire (as tests/test_fwd_speculative_exp_gpu.py test_speculative_exp_rare_arm)."""
    from test_fwd_loop_shape_gpu import _run, same_up_to_rounding
    from test_fwd_speculative_exp_gpu import rare_arm_inputs

    q, k, v = rare_arm_inputs(hdim)
    ref = _run(AttnConfig(speculative_exp=True), q, k, v, causal, hdim, hdim)
    for cfg in (AttnConfig(p_smem=True, p_smem_early=True, speculative_exp=True),
                AttnConfig(p_smem=True, p_smem_early=True, speculative_exp=True, spec_redo_budget=1),
                AttnConfig(p_smem=True, speculative_exp=True)):
        got = _run(cfg, q, k, v, causal, hdim, hdim)
        torch.cuda.synchronize()
        assert torch.isfinite(got[0]).all()
        same_up_to_rounding(got, ref, f"rare arm hd{hdim} causal={causal} {cfg}")
