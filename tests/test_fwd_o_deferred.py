"""AttnConfig.o_deferred (sm90 persistent forward on a static walk, with o_via_v_stage or o_direct): a tile's O store
(through the last V stage, or from the kept registers straight to global memory) runs in the next tile's first block,
after its Q K^T is issued and before it is waited for; the CTA's last tile stores after the loop (kernels/sm90/fwd.py
store_deferred). CPU tests: the field's rules, where the kernel takes it, and the machine code: two store sites of the
same pieces, the same GEMMs and exponentials, no local memory, and the first site between an issued Q K^T and its
wait. GPU checks: tests/test_fwd_o_deferred_gpu.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("o_deferred")


def test_kernel_takes_it_on_static_walks_through_the_v_stage():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    on = dict(persistent=True, o_via_v_stage=True, o_deferred=True)
    assert FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent_greedy=True, **on).o_deferred
    assert FlashFwdSm90(bf, 256, 256, False, tile_n=80, **on).o_deferred
    assert FlashFwdSm90(bf, 192, 128, True, **on).o_deferred
    # without o_via_v_stage's store, on the split tail, with tiles claimed at run time, one tile per CTA: no effect
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, o_deferred=True).o_deferred
    assert not FlashFwdSm90(bf, 256, 256, False, tile_n=80, split_tail=True, **on).o_deferred
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent_dynamic=True, **on).o_deferred
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, o_via_v_stage=True, o_deferred=True).o_deferred
    assert not FlashFwdSm90(bf, 128, 128, False, **on).o_deferred  # O has its own buffer at hd128
    # from registers (o_direct, hd256's default where persistent from 2049 tokens): persistent static walks with the
    # overlapped loop and no idle-warpgroup branch (its idle_loop runs no first block to carry the store)
    direct = dict(persistent=True, o_direct=True, o_direct_wide=True, o_deferred=True)
    assert FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent_greedy=True, **direct).o_deferred
    assert FlashFwdSm90(bf, 256, 256, False, tile_n=80, o_direct=True, o_deferred=True, persistent=True).o_deferred
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, o_direct=True, o_deferred=True).o_deferred  # one tile
    assert not FlashFwdSm90(bf, 256, 256, False, tile_n=80, skip_idle_wg=True, **direct).o_deferred
    assert not FlashFwdSm90(bf, 256, 256, False, tile_n=80, intra_wg_overlap=False, **direct).o_deferred
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent_dynamic=True, **direct).o_deferred


def _first_store_under_a_qk(sass: str, qk: str, store: str = "STSM") -> bool:
    """Whether the first ``store`` (an opcode prefix) follows an issued Q K^T wgmma (``qk``: its HGMMA shape) with no
    wgmma wait between."""
    from kernels.sm90.sass import instructions

    ops = [op for _, op, _ in instructions(sass)[0]]
    first = next(i for i, op in enumerate(ops) if op.startswith(store))
    last_mma = max(i for i, op in enumerate(ops[:first]) if op.startswith("HGMMA"))
    return ops[last_mma].startswith(qk) and not any(op.startswith("WARPGROUP.DEPBAR") for op in ops[last_mma:first])


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,extra", [(256, True, {}), (256, False, {"split_tail": False}), (192, True, {})],
                         ids=["256_causal_walk", "256_persistent", "192_causal_walk"])
def test_machine_code_stores_o_under_the_next_qk(hdim, causal, extra, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    # persistent at these lengths (the greedy walk causal) with o_via_v_stage, named (hd256's default there since
    # session 68 stores O from registers; naming an O-path field keeps the V stage)
    seqlen = 8192 if causal else 4096
    off_sass = spill_free_sass(hdim, causal, str(tmp_path / "off"), seqlen=seqlen, o_via_v_stage=True, **extra)
    on_sass = spill_free_sass(hdim, causal, str(tmp_path / "on"), seqlen=seqlen, o_via_v_stage=True, o_deferred=True,
                              **extra)
    off, on = opcode_counts(off_sass), opcode_counts(on_sass)
    assert count(off, "UTMASTG") == count(on, "UTMASTG") == 0  # both through the V stage
    assert count(on, "HGMMA") == count(off, "HGMMA") and count(on, "MUFU.EX2") == count(off, "MUFU.EX2")
    # two store sites (the next tile's first block, after the loop), each the single site's pieces
    for op in ("STSM", "LDS.128", "STG.E.128"):
        assert count(on, op) == 2 * count(off, op) > 0, op
    qk = f"HGMMA.64x{80 if hdim == 256 else 128}x16"
    assert _first_store_under_a_qk(on_sass, qk) and not _first_store_under_a_qk(off_sass, qk)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("seqlen", [16384, 32768])
def test_machine_code_stores_o_from_registers_under_the_next_qk(seqlen, tmp_path):
    """hd256 causal on the greedy walk with its default direct 16-byte stores (16k: with skip_diag_wg, which the
    direct path keeps): the same stores at two sites, the first under the next tile's first Q K^T."""
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    off_sass = spill_free_sass(256, True, str(tmp_path / "off"), seqlen=seqlen)
    on_sass = spill_free_sass(256, True, str(tmp_path / "on"), seqlen=seqlen, o_deferred=True)
    off, on = opcode_counts(off_sass), opcode_counts(on_sass)
    assert count(off, "STSM") == count(on, "STSM") == 0 and count(on, "UTMASTG") == 0  # no shared memory for O
    assert count(on, "HGMMA") == count(off, "HGMMA") and count(on, "MUFU.EX2") == count(off, "MUFU.EX2")
    assert count(on, "STG.E.128") == 2 * count(off, "STG.E.128") > 0
    assert _first_store_under_a_qk(on_sass, "HGMMA.64x80x16", "STG.E.128")
    assert not _first_store_under_a_qk(off_sass, "HGMMA.64x80x16", "STG.E.128")
