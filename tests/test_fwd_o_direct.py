"""AttnConfig.o_direct (sm90 forward): O from the accumulator registers straight to global memory instead of
stmatrix + a TMA store, and Q's buffer released after the tile's last Q K^T (kernels/sm90/fwd.py store_o_direct,
early_q_release). CPU tests: the field's rules, where the kernel takes it (not varlen, packed GQA or a cluster), and the
machine code: no STSM / UTMASTG, nor the epilogue's two barriers, and one 32-bit STG per column pair of a thread's
O rows, no local memory. GPU checks:
tests/test_fwd_o_direct_gpu.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("o_direct")


def test_kernel_takes_it_where_o_is_stored_by_tma():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    k = FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, o_direct=True)
    assert k.o_direct and k.early_q_release and not k.separate_o
    k = FlashFwdSm90(bf, 128, 128, False, persistent=True, o_direct=True)
    assert k.o_direct and k.early_q_release and not k.separate_o  # no sO buffer either
    k = FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True)
    assert not k.o_direct and not k.early_q_release and not k.separate_o  # O shares Q's buffer: released after it
    assert FlashFwdSm90(bf, 128, 128, False, persistent=True).separate_o
    assert not FlashFwdSm90(bf, 128, 128, False, varlen=True, o_direct=True).o_direct
    assert not FlashFwdSm90(bf, 128, 128, False, cluster_m=2, o_direct=True).o_direct
    assert not FlashFwdSm90(bf, 128, 128, False, qhead_per_kvhead=4, pack_gqa=True, o_direct=True).o_direct


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen", [(256, True, 16384), (64, False, 4096)])
def test_machine_code_stores_o_from_registers(hdim, causal, seqlen, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    # o_via_v_stage (hd256's default on the causal walk since session 66) off on both sides: the TMA store's epilogue
    off = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "off"), seqlen=seqlen, o_via_v_stage=False))
    on = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "on"), seqlen=seqlen, o_direct=True,
                                       o_via_v_stage=False))
    assert count(off, "UTMASTG") > 0 and count(off, "STSM") > 0
    assert count(on, "UTMASTG") == 0 and count(on, "STSM") == 0
    assert count(on, "HGMMA") == count(off, "HGMMA") and count(on, "MUFU.EX2") == count(off, "MUFU.EX2")
    # the epilogue's two barriers over the consumer warpgroups (around the stmatrix) are gone
    assert count(on, "BAR.SYNC") == count(off, "BAR.SYNC") - 2
    # per store site a thread's 2 rows x hdim/8 column pairs (tile_m 128 / 192: 64 rows per warpgroup, 4 threads a
    # row): hdim/4 32-bit stores, each kernel with one store site per epilogue (the split tail's pieces aside)
    stores = count(on, "STG.E") - count(on, "STG.E.64") - count(off, "STG.E") + count(off, "STG.E.64")
    assert stores > 0 and stores % (hdim // 4) == 0, stores
