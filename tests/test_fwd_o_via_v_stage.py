"""AttnConfig.o_via_v_stage (sm90 persistent forward where O shares Q's buffer: hd256, (192, 128)): O leaves through the
last K/V block's V stage in column chunks (stmatrix, then 16-byte row pieces read back and stored by every consumer
thread), that stage released after the epilogue, and Q's buffer released after the tile's last Q K^T
(kernels/sm90/fwd.py store_o_v_stage). CPU tests: the field's rules, where the kernel takes it, and the machine code:
no TMA store, the same stmatrix, one LDS.128 and one STG.128 per 16-byte piece, no local memory. GPU checks:
tests/test_fwd_o_via_v_stage_gpu.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("o_via_v_stage")


@pytest.mark.parametrize("hdim", [256, 192])
def test_default_where_persistent_by_length(hdim):
    """Session 66's default: calls made persistent by their length (non-causal <= 8k, causal <= 16k; hd256 causal <=
    32k since session 68) run it (at hd256 only up to 2k, or where the caller names it); longer calls (one tile per
    CTA, the split tail), persistent=True (an A/B's forced kernel) and a False stay without it."""
    from kernels.config import AttnConfig, call_config

    def on(cfg, causal, seqlen):
        c = call_config(cfg.resolve("sm90", hdim, causal), "sm90", hdim, causal, seqlen)
        return bool(c.persistent), bool(c.o_via_v_stage)

    # hd256 from 2049 tokens: O from registers in 16-byte stores instead (session 67), unless an O-path field is named
    wide_from = 2049 if hdim == 256 else 1 << 30
    for causal, longest in ((False, 8192), (True, 32768 if hdim == 256 else 16384)):  # hd256 causal 32k: session 68
        assert on(AttnConfig(), causal, 1024) == on(AttnConfig(), causal, 2048) == (True, True)
        assert on(AttnConfig(), causal, longest) == (True, longest < wide_from)
        assert on(AttnConfig(o_via_v_stage=True), causal, longest) == (True, True)
        assert on(AttnConfig(), causal, 2 * longest) == (False, False)
        assert on(AttnConfig(persistent=True), causal, 4096) == (True, False)
        assert on(AttnConfig(o_via_v_stage=False), causal, 4096) == (True, False)
    assert on(AttnConfig(), True, 2048) == on(AttnConfig(persistent=True, persistent_greedy=True, o_via_v_stage=True),
                                              True, 2048)


def test_kernel_takes_it_where_o_shares_qs_buffer():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    k = FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, o_via_v_stage=True)
    assert k.o_via_v_stage and k.o_chunks == 2 and k.early_q_release and not k.tma_o_store and not k.separate_o
    k = FlashFwdSm90(bf, 192, 128, True, persistent=True, o_via_v_stage=True)
    assert k.o_via_v_stage and k.o_chunks == 1 and k.early_q_release
    # O has its own buffer (hd128 persistent), one tile per CTA, o_direct, the serial loop, varlen: no effect
    assert not FlashFwdSm90(bf, 128, 128, False, persistent=True, o_via_v_stage=True).o_via_v_stage
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, o_via_v_stage=True).o_via_v_stage
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, o_direct=True,
                            o_via_v_stage=True).o_via_v_stage
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, intra_wg_overlap=False,
                            o_via_v_stage=True).o_via_v_stage
    assert not FlashFwdSm90(bf, 256, 256, False, tile_n=80, varlen=True, o_via_v_stage=True).o_via_v_stage
    k = FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True)
    assert not k.o_via_v_stage and not k.early_q_release and k.tma_o_store


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen,extra", [(256, True, 16384, {}), (256, False, 4096, {"persistent": True}),
                                                      (192, True, 8192, {})],
                         ids=["256_causal_walk", "256_persistent_split", "192_causal_walk"])
def test_machine_code_stores_o_through_the_v_stage(hdim, causal, seqlen, extra, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    # off: turned off by hand (the default at these persistent lengths since session 66)
    off = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "off"), seqlen=seqlen, o_via_v_stage=False,
                                        **extra))
    on = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "on"), seqlen=seqlen, o_via_v_stage=True,
                                       **extra))
    hdim_v = 128 if hdim == 192 else hdim
    assert count(off, "UTMASTG") > 0 and count(on, "UTMASTG") == 0
    assert count(on, "STSM") == count(off, "STSM") > 0  # the same stmatrix, chunk by chunk
    assert count(on, "HGMMA") == count(off, "HGMMA") and count(on, "MUFU.EX2") == count(off, "MUFU.EX2")
    # each of the 256 consumer threads reads and stores tile_m x hdim_v / 256 / 8 16-byte pieces (one store site)
    pieces = 128 * hdim_v // 256 // 8
    assert count(on, "LDS.128") - count(off, "LDS.128") == pieces
    assert count(on, "STG.E.128") - count(off, "STG.E.128") == pieces
    # two barriers over the consumers per chunk (before its stmatrix, before reading it back) against two around
    # the TMA store's stmatrix
    chunks = 2 if hdim == 256 else 1
    assert count(on, "BAR.SYNC") - count(off, "BAR.SYNC") == 2 * chunks - 2


@pytest.mark.compile
def test_chunk_c_holds_the_fragments_values_c_n_to_c_n_plus_n():
    """store_o_v_stage takes chunk c's accumulator values as the full fragment's flat values c * n .. c * n + n - 1: in
    the wgmma C layouts of the (64, 256) and (64, 128) P V tiled MMAs, value c * n + i of a thread is value i of the
    chunk's layout, 128 columns to the right ((64, N) column-major tile index m + 64 n)."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import Float32
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

    pairs = []

    @cute.jit
    def trace():
        mma = [sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K,
                                                 OperandMajorMode.MN, Float32, (2, 1, 1), (64, n),
                                                 warpgroup.OperandSource.RMEM).tv_layout_C for n in (256, 128)]
        for t in cutlass.range_constexpr(0, 128, 5):
            for i in cutlass.range_constexpr(64):
                for c in cutlass.range_constexpr(2):
                    pairs.append((cute.crd2idx((t, c * 64 + i), mma[0]), cute.crd2idx((t, i), mma[1]), c))

    trace()
    assert len(pairs) == 26 * 64 * 2
    assert all(full == chunk + 64 * 128 * c for full, chunk, c in pairs)
