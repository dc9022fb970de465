"""AttnConfig.q_in_regs (sm90 forward: S = Q K^T with Q in registers, kernels/sm90/fwd.py load_q_regs; on by default
at hd128, kernels/config.py DEFAULTS).

Config checks (no compile) and CPU-compiled SASS (CUTE_DSL_ARCH=sm_90a, nvdisasm): with the switch no HGMMA takes
its A operand from a shared-memory descriptor (``HGMMA... R<d>, R<a>, gdesc[..]``), Q is loaded by LDSM once per Q
tile, the HGMMA count is unchanged, the K/V loop has no more instructions than without it, and hd128 / (192, 128) keep
0 LDL / STL; without it no LDSM and QK^T's A from a descriptor. The GPU half (out / lse bitwise those without it;
accuracy with persistent / pingpong off / the serial loop) is tests/test_fwd_q_in_regs_gpu.py.
"""
from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from config_pairs import check_default_pair  # noqa: E402
from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, opcode_counts  # noqa: E402
from test_fwd_loop_shape import _loops, _sass  # noqa: E402  (one SASS cache for the forward loop-shape files)

needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")


def test_q_in_regs_default_at_hd128_table_tile_only():
    """DEFAULTS' q_in_regs (H200: 1.002-1.007x at hd128): filled at hd128 on the table's 128 x 128 tile (not with
    wider / taller tiles or half the exponentials emulated), None (left out of to_dict(): the hash of before the field)
    everywhere else; an explicit value wins."""
    check_default_pair("q_in_regs", ((128, False), (128, True)))
    for causal in (False, True):
        for extra in (dict(tile_n=176), dict(tile_m=192, consumer_regs=160, producer_regs=32),
                      dict(exp2_emu_fraction=0.5)):
            assert AttnConfig(**extra).resolve("sm90", 128, causal).q_in_regs is None
        assert AttnConfig(exp2_emu_fraction=0.375).resolve("sm90", 128, causal).q_in_regs is True
    assert AttnConfig().resolve("sm100", 128, False).q_in_regs is None


def test_q_in_regs_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match="q_in_regs=1: must be None .per-arch default. or a bool"):
        AttnConfig(q_in_regs=1)
    with pytest.raises(ConfigError, match="q_in_regs=True with arch=sm100"):
        AttnConfig(q_in_regs=True).resolve("sm100", 128, False)


def test_q_in_regs_is_forward_only():
    from kernels.tiles import compiled_config

    cfg = AttnConfig(q_in_regs=True)
    assert compiled_config(cfg, "sm90", 128, False, "fwd")["q_in_regs"] is True
    assert compiled_config(cfg, "sm90", 128, False, "bwd") == compiled_config(None, "sm90", 128, False, "bwd")


def _qk_operands(sass: str):
    """(A operand kind, count) of the QK^T HGMMAs: tile_n columns (the P V HGMMAs have head-dim-v columns)."""
    kinds = {}
    for line in sass.splitlines():
        m = re.search(r"HGMMA\.64x(\d+)x16\.F32\.BF16 R\d+, (\w+)", line)
        if m:
            kinds.setdefault((m.group(1), "reg" if re.fullmatch(r"R\d+", m.group(2)) else m.group(2)), 0)
            kinds[(m.group(1), "reg" if re.fullmatch(r"R\d+", m.group(2)) else m.group(2))] += 1
    return kinds


@needs_nvdisasm
@pytest.mark.compile
@pytest.mark.parametrize("hdim,causal", [(128, False), (128, True), (192, False)])
def test_q_from_registers_in_the_sass(tmp_path_factory, hdim, causal):
    base = _sass(tmp_path_factory, hdim, causal, q_in_regs=False)
    on = _sass(tmp_path_factory, hdim, causal, q_in_regs=True)
    cb, co = opcode_counts(base), opcode_counts(on)
    assert count(cb, "LDSM") == 0 and count(co, "LDSM") == hdim // 16  # Q's 64 x hdim per warpgroup: x4 ldmatrix
    assert len(re.findall(r"\b(?:LDL|STL)\b", on)) == 0
    assert count(cb, "HGMMA") == count(co, "HGMMA")
    kb, ko = _qk_operands(base), _qk_operands(on)
    # hd128 the QK^T and P V HGMMAs are both 64x128: the default has every A of QK^T from a descriptor and P V's from
    # registers; with Q in registers every HGMMA reads A from registers
    assert any(kind == "gdesc" for (_, kind) in kb) and not any(kind == "gdesc" for (_, kind) in ko)
    loop_b, loop_o = _loops(base)[-1], _loops(on)[-1]
    assert len(loop_o) <= len(loop_b)  # no per-block Q descriptor arithmetic left in the K/V loop


def test_kernel_keeps_q_in_shared_memory_with_a_window_in_the_serial_loop():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, True, q_in_regs=True).q_in_regs
    assert FlashFwdSm90(bf, 128, 128, True, q_in_regs=True, window_left=64).q_in_regs  # (the overlapped loop)
    assert FlashFwdSm90(bf, 128, 128, True, q_in_regs=True, intra_wg_overlap=False).q_in_regs
    assert not FlashFwdSm90(bf, 128, 128, True, q_in_regs=True, intra_wg_overlap=False, window_left=64).q_in_regs

