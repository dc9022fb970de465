"""AttnConfig.q_regs_k (sm90 forward; opt-in, not yet timed): Q K^T takes its first q_regs_k k-blocks (16 head-dim
columns each) of Q from registers and the rest from shared memory, in one wgmma group (kernels/sm90/gemm.py
wgmma_split_a). Q in registers in part where all of it does not fit: hd256's consumer warpgroups hold O (128
registers), S, P and addresses in 212 of their 240; all of Q would add 64, four k-blocks add 16.

Why: in the roofline model (analysis/roofline.py --tma-fill) hd256's 128 x 80 tile moves ~95% as many shared-memory
bytes per clock as its tensor clocks allow; Q is the one operand a warpgroup re-reads every K/V block (64 KB of
~304 KB), so every k-block of it in registers takes 4 KB off each block.

CPU tests: the field's rules, the kernel's width rule (a column slice of sQ: its width divides the 64-column swizzle
atom or is a multiple of it), and the machine code (hd256: the first q_regs_k QK^T HGMMAs read A from registers, the
rest from descriptors; no local memory at hd256 and (192, 128); 0 compiles the default's kernel). These cannot tell
whether the registers hold the right columns of Q (a review helper moved the slice to columns 64-127 and they still
passed): the GPU check, outputs against the default's, is tests/test_fwd_q_regs_k_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    from kernels.tiles import compiled_config

    assert "q_regs_k" not in AttnConfig().to_dict() and "q_regs_k" not in AttnConfig(q_regs_k=0).to_dict()
    assert AttnConfig(q_regs_k=4).to_dict()["q_regs_k"] == 4
    assert AttnConfig(q_regs_k=4).config_hash() != AttnConfig().config_hash()
    for bad in (True, -1, 16, 2.0, "4"):
        with pytest.raises(ConfigError, match="q_regs_k"):
            AttnConfig(q_regs_k=bad)
    with pytest.raises(ConfigError, match="q_regs_k"):
        AttnConfig(q_regs_k=4).resolve("sm100", 256, False)
    with pytest.raises(ConfigError, match="k-blocks"):
        AttnConfig(q_regs_k=4).resolve("sm90", 64, False)  # hd64 has 4
    assert (compiled_config(AttnConfig(q_regs_k=4), "sm90", 256, False, mode="bwd")
            == compiled_config(AttnConfig(), "sm90", 256, False, mode="bwd"))
    for hdim in (64, 128, 192, 256):
        assert "q_regs_k" not in AttnConfig().resolve("sm90", hdim, False).to_dict()  # not a default


def test_kernel_width_rule():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    ok = {}
    for hd, hv, tn in ((256, 256, 80), (192, 128, 128), (64, 64, 128)):
        ok[hd] = []
        for k in range(17):
            try:
                FlashFwdSm90(bf, hd, hv, False, tile_n=tn, q_regs_k=k)
                ok[hd].append(k)
            except ValueError as e:
                assert "q_regs_k" in str(e)
    assert ok == {256: [0, 1, 2, 4, 8], 192: [0, 1, 2, 4], 64: [0, 1, 2]}
    assert FlashFwdSm90(bf, 128, 128, False, q_in_regs=True, q_regs_k=4).q_regs_k == 0  # all of Q wins
    assert FlashFwdSm90(bf, 128, 128, False, q_in_regs=True, q_regs_k=3).q_regs_k == 0  # (no width rule then)


def _sass(hdim, causal, tmp_path, **kw):
    from fwd_switch_checks import spill_free_sass

    return spill_free_sass(hdim, causal, str(tmp_path), **kw)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,k", [(256, False, 4), (256, True, 2), (192, True, 4)])
def test_first_k_blocks_from_registers(hdim, causal, k, tmp_path):
    from kernels.sm90.sass import loop_common_path_ops

    # non-causal: one tile per CTA (the hd256 default at 8k until session 66 made it persistent with o_via_v_stage,
    # whose epilogue adds loops without GEMMs); causal: the persistent walk
    sass = _sass(hdim, causal, tmp_path / "k", q_regs_k=k, **({} if causal else {"persistent": False}))
    tn = 80 if hdim == 256 else 128
    for body in loop_common_path_ops(sass):
        # (P V's HGMMAs read V transposed, .tnspB; at (192, 128) they have Q K^T's shape)
        qk = [r.split(",")[1].strip() for o, r in body if o.startswith(f"HGMMA.64x{tn}x16") and "tnspB" not in r]
        assert len(qk) == hdim // 16
        assert all(a.startswith("R") for a in qk[:k]) and all(a.startswith("gdesc") for a in qk[k:]), qk


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
def test_zero_is_the_default_kernel(tmp_path):
    assert _sass(256, False, tmp_path / "zero", q_regs_k=0) == _sass(256, False, tmp_path / "base")
