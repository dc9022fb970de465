"""AttnConfig.spec_warp_redo (sm90 forward, with p_before_vote): speculative_exp's exponentials on a copy of the
block's S, the K stage released right after S, the votes over each warp (vote.any) instead of the warpgroup's named
barrier, and a warp whose vote fires runs the eager step on the kept S (kernels/sm90/fwd.py softmax_spec_warp;
softmax.s_exceeds). CPU tests: the field's rules, where the kernel takes it, and the machine code: no local memory, no
BAR.RED, one Q K^T fewer (the redo's), as many MUFU.EX2 per block. GPU checks: tests/test_fwd_spec_warp_redo_gpu.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    from kernels.config import AttnConfig

    check_forward_field("spec_warp_redo")
    assert all(AttnConfig().resolve("sm90", 64, causal).spec_warp_redo for causal in (False, True))
    for extra in ({"p_before_vote": False}, {"speculative_exp": False},
                  {"tile_m": 256, "consumer_regs": 112, "pingpong": False}):  # (the last: 3 LDL with it)
        assert not AttnConfig(**extra).resolve("sm90", 64, False).spec_warp_redo, extra
    assert not AttnConfig().resolve("sm90", 128, False).spec_warp_redo


def test_kernel_takes_it_only_with_p_before_vote():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    on = dict(speculative_exp=True, p_before_vote=True, spec_warp_redo=True)
    assert FlashFwdSm90(bf, 128, 128, False, **on).spec_warp_redo
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, spec_warp_redo=True).spec_warp_redo
    assert not FlashFwdSm90(bf, 128, 128, False, p_before_vote=True, spec_warp_redo=True).spec_warp_redo  # eager
    assert not FlashFwdSm90(bf, 128, 128, False, spec_redo_budget=1, **on).spec_warp_redo


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,seqlen", [(64, 16384), (128, 16384)])
def test_machine_code_votes_per_warp(hdim, seqlen, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    off = opcode_counts(spill_free_sass(hdim, False, str(tmp_path / "off"), seqlen=seqlen, spec_warp_redo=False))
    on = opcode_counts(spill_free_sass(hdim, False, str(tmp_path / "on"), seqlen=seqlen, spec_warp_redo=True))
    assert count(off, "BAR.RED") == 2 and count(on, "BAR.RED") == 0
    # the redo's Q K^T: hdim/16 wgmmas of k16 (hd128 with Q in registers: the same count)
    assert count(off, "HGMMA") - count(on, "HGMMA") == hdim // 16
    assert count(on, "MUFU.EX2") == count(off, "MUFU.EX2")
