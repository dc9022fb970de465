"""AttnConfig.skip_diag_wg (sm90 forward, causal, persistent, overlapped loop; session 69; hd256's causal default at
2049-16384 tokens since session 71, by DEFAULTS' persistent_tile): a consumer warpgroup whose rows all lie before the
first key of the tile's last K/V block (the diagonal block, visited first) keeps that block's barrier protocol but
issues no GEMM and no softmax, and starts at the block before (kernels/sm90/fwd.py diag_idle_step).

CPU tests: the field's rules, the kernel switch (causal persistent kernels without a window, packed GQA, o_deferred
through the V stage or skip_idle_wg), where the defaults take it, how often the skip applies on the tile grid, and the
machine code on the greedy walk: no local memory, the same HGMMA / MUFU.EX2 counts and K/V loop common paths as
without it. The GPU check (out / lse bitwise the kernel's without it) is tests/test_fwd_skip_diag_wg_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from analysis.waves import skipping_warpgroups  # noqa: E402
from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("skip_diag_wg")
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            assert "skip_diag_wg" not in AttnConfig().resolve("sm90", hdim, causal).to_dict()  # a per-call rule


def test_hd256_causal_calls_take_it_from_4k_to_16k_only():
    from kernels.config import call_config

    def called(cfg, hdim=256, causal=True, seqlen=8192, **kw):
        return call_config(cfg.resolve("sm90", hdim, causal), "sm90", hdim, causal, seqlen, **kw).skip_diag_wg

    assert [bool(called(AttnConfig(), seqlen=s)) for s in (2048, 2049, 4096, 8192, 16384, 16385, 32768)] == [
        False, True, True, True, True, False, False]
    assert not called(AttnConfig(), causal=False)  # non-causal: no diagonal
    for hdim in (64, 128, 192):
        assert not called(AttnConfig(), hdim=hdim)
    assert called(AttnConfig(skip_diag_wg=False)) is False  # the caller's False stays
    assert not called(AttnConfig(), windowed=True)  # the kernel ignores it with a window: one compile key
    assert not called(AttnConfig(persistent=True))  # a forced persistent config is the caller's, not the entry's


def test_kernel_takes_it_on_causal_persistent_kernels_only():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    hd256 = dict(tile_m=128, tile_n=80, consumer_regs=240, producer_regs=24)
    assert FlashFwdSm90(bf, 256, 256, True, persistent=True, persistent_greedy=True, skip_diag_wg=True,
                        **hd256).skip_diag_wg
    assert FlashFwdSm90(bf, 128, 128, True, persistent=True, skip_diag_wg=True).skip_diag_wg
    for why in (dict(persistent=False), dict(persistent=True, window_left=256),
                dict(persistent=True, intra_wg_overlap=False), dict(persistent=True, skip_idle_wg=True)):
        assert not FlashFwdSm90(bf, 128, 128, True, skip_diag_wg=True, **why).skip_diag_wg, why
    assert not FlashFwdSm90(bf, 128, 128, False, persistent=True, skip_diag_wg=True).skip_diag_wg  # not causal
    # o_deferred: through the V stage it finds that stage from the first block's state (which the skip advances); from
    # registers (o_direct) it needs no stage
    greedy = dict(persistent=True, persistent_greedy=True, skip_diag_wg=True, o_deferred=True, **hd256)
    assert not FlashFwdSm90(bf, 256, 256, True, o_via_v_stage=True, **greedy).skip_diag_wg
    assert FlashFwdSm90(bf, 256, 256, True, o_direct=True, o_direct_wide=True, **greedy).skip_diag_wg
    assert not FlashFwdSm90(bf, 128, 128, True, persistent=True).skip_diag_wg


def test_the_skip_applies_where_tile_n_does_not_divide_the_tile():
    # hd256's 128 x 80 tiles: the first warpgroup skips in 4 of every 5 Q tiles (session 68's count), never the second
    wgs = skipping_warpgroups(128, 80, 8192)
    assert wgs == [[] if m % 5 == 4 else [0] for m in range(64)]
    # hd128's 128 x 128: never; hd64's 192 x 128: some warpgroups of some tiles
    assert not any(skipping_warpgroups(128, 128, 8192))
    assert any(skipping_warpgroups(192, 128, 8192))


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,seqlen", [(256, 8192), (64, 8192)])
def test_machine_code_keeps_the_loops_of_the_greedy_walk(hdim, seqlen, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, loop_common_paths, opcode_counts

    base = spill_free_sass(hdim, True, str(tmp_path / "base"), seqlen=seqlen, skip_diag_wg=False)
    skip = spill_free_sass(hdim, True, str(tmp_path / "skip"), seqlen=seqlen, skip_diag_wg=True)
    cb, cs = opcode_counts(base), opcode_counts(skip)
    assert count(cs, "HGMMA") == count(cb, "HGMMA") and count(cs, "MUFU.EX2") == count(cb, "MUFU.EX2")
    assert sum(cs.values()) > sum(cb.values())  # the idle step and its branch are there
    assert loop_common_paths(skip) == loop_common_paths(base)  # the diagonal and mask-free K/V loops untouched
