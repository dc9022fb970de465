"""AttnConfig.o_direct_wide (sm90 forward, with o_direct): O's stores from registers 16 bytes wide, after the 4 lanes
of each quad transpose their column pairs (kernels/sm90/fwd.py store_o_wide, layout.rotate_by_lane). CPU tests: the
field's rules, where the kernel takes it, the quad transpose's plan (its helper on integers), and the machine code: o_direct's 32-bit
stores replaced by a quarter as many 128-bit ones, 3 shuffles per 4 words, the same GEMMs and exponentials, no local
memory. GPU checks: tests/test_fwd_o_direct_wide_gpu.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("o_direct_wide")


def test_kernel_takes_it_with_o_direct():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, o_direct=True, o_direct_wide=True).o_direct_wide
    assert FlashFwdSm90(bf, 128, 128, False, o_direct=True, o_direct_wide=True).o_direct_wide
    assert not FlashFwdSm90(bf, 256, 256, True, tile_n=80, persistent=True, o_direct_wide=True).o_direct_wide
    assert not FlashFwdSm90(bf, 128, 128, False, varlen=True, o_direct=True, o_direct_wide=True).o_direct_wide


def test_default_at_hd256_persistent_from_2049_tokens():
    """hd256's default since session 68 (H100 A/Bs of sessions 67 / 68) where a call is persistent by its length from
    2049 tokens (non-causal <= 8k, causal <= 32k on the greedy walk); a caller who names an O-path field other than
    o_deferred gets the V stage there."""
    from kernels.config import AttnConfig, call_config

    def path(cfg, causal, seqlen, hdim=256):
        c = call_config(cfg.resolve("sm90", hdim, causal), "sm90", hdim, causal, seqlen)
        return bool(c.persistent), bool(c.o_direct), bool(c.o_direct_wide), bool(c.o_via_v_stage)

    wide, v_stage = (True, True, True, False), (True, False, False, True)
    for causal, longest in ((False, 8192), (True, 32768)):  # causal up to 32k since session 68
        assert path(AttnConfig(), causal, 2048) == v_stage
        assert path(AttnConfig(), causal, 2049) == path(AttnConfig(), causal, longest) == wide
        assert path(AttnConfig(), causal, 2 * longest) == (False,) * 4  # one tile per CTA / the split tail
        for named in (dict(o_via_v_stage=True), dict(o_direct=False), dict(o_direct_wide=False)):
            assert path(AttnConfig(**named), causal, 4096) == v_stage, named
        # o_deferred says when O is stored, not how: the direct stores stay
        assert path(AttnConfig(o_deferred=True), causal, 4096) == wide
        assert path(AttnConfig(o_via_v_stage=False), causal, 4096) == (True, False, False, False)
        assert path(AttnConfig(persistent=True), causal, 4096) == (True, False, False, False)
        own = AttnConfig(consumer_regs=224, producer_regs=56)  # its own register split: no entry
        assert path(own, causal, 4096) == (True, False, False, False)
        assert path(AttnConfig(), causal, 4096, hdim=192) == v_stage  # (192, 128): lost there (0.994-0.998)
    assert call_config(AttnConfig().resolve("sm90", 256, True), "sm90", 256, True, 8192).persistent_greedy


def test_quad_transpose_plan():
    """kernels/sm90/layout.quad_transpose run on plain integers with Python selects and the 4 lanes' shuffles
    simulated: lane q must end with pair p of block q in slot p."""
    from kernels.sm90.layout import quad_transpose, rotate_by_lane

    def pick(cond, a, b):
        return a if cond else b

    held = {q: [(b, q) for b in range(4)] for q in range(4)}  # lane q: its pair q of blocks 0..3

    def shuffle_from(src, k):  # what lane src sends as word k: its words rotated by src
        return rotate_by_lane(held[src], src & 1, src & 2, 1, pick)[k]

    for q in range(4):
        got = quad_transpose(held[q], q, q & 1, q & 2, lambda v, src, k: shuffle_from(src, k), pick)
        assert got == [(q, p) for p in range(4)], q
    assert rotate_by_lane([0, 1, 2, 3], True, True, 1, pick) == [3, 0, 1, 2]  # q = 3
    assert rotate_by_lane([0, 1, 2, 3], False, True, -1, pick) == [2, 3, 0, 1]


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen", [(256, True, 8192), (192, False, 4096), (64, True, 8192)])
def test_machine_code_stores_16_bytes(hdim, causal, seqlen, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    dv = 128 if hdim == 192 else hdim
    kw = dict(seqlen=seqlen, o_direct=True, split_tail=False)
    off = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "off"), **kw))
    on = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "on"), o_direct_wide=True, **kw))
    assert count(on, "HGMMA") == count(off, "HGMMA") and count(on, "MUFU.EX2") == count(off, "MUFU.EX2")
    assert count(off, "STG.E.128") == 0
    # per thread 2 rows x dv/8 column pairs: dv/4 32-bit stores become dv/16 16-byte ones
    narrow = count(off, "STG.E") - count(off, "STG.E.64") - count(off, "STG.E.128")
    narrow_on = count(on, "STG.E") - count(on, "STG.E.64") - count(on, "STG.E.128")
    assert narrow - narrow_on == dv // 4 and count(on, "STG.E.128") == dv // 16
    assert count(on, "SHFL.IDX") - count(off, "SHFL.IDX") == 3 * dv // 16


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
def test_hd256_causal_32k_default_is_the_16k_kernel(tmp_path):
    """Since session 68 the hd256 causal call at 32k runs the greedy walk with the 16-byte stores, as at 16k, where the
    GPU files ran (session 68, part 51): the same machine code as 16k's without skip_diag_wg (16k's default since
    session 71, not 32k's), no local memory, 16 STG.128 per thread and no shared-memory or TMA store of O."""
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    at16k = spill_free_sass(256, True, str(tmp_path / "16k"), seqlen=16384, skip_diag_wg=False)
    at32k = spill_free_sass(256, True, str(tmp_path / "32k"), seqlen=32768)
    assert at32k == at16k
    c = opcode_counts(at32k)
    assert count(c, "STG.E.128") == 16 and count(c, "STSM") == 0 and count(c, "UTMASTG") == 0
