"""AttnConfig.p_smem (sm90 forward; opt-in, not yet timed): P V with P from shared memory (an SS wgmma) instead of
registers (kernels/sm90/fwd.py make_p / pv_gemm).

Each block's P is stored by stmatrix into an sP tile right after its 16-bit conversion, fenced for the async proxy
and warp-synced; the P V GEMM then reads it through a shared-memory descriptor. P's registers die at the store, not
when the GEMM completes, which is what lets hd64's 192-row tiles (160 registers per consumer thread) take 192-wide
key blocks without spilling -- FA3's C++ choice for hd64 non-causal.

CPU tests: the field's rules, the kernel's argument checks, and the machine code (no local memory at hd64 with
tile_n 160 / 176 / 192; the P V HGMMAs take A from a descriptor, one STSM per 16 columns of P and one proxy fence
per block in the loop; the same MUFU.EX2 count per column; p_smem=False compiles the default's kernel). The GPU
checks (outputs against the reference and the default's) are tests/test_fwd_p_smem_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("p_smem")
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            assert "p_smem" not in AttnConfig().resolve("sm90", hdim, causal).to_dict()  # not a default
    with pytest.raises(ConfigError, match="row_sum_mma"):
        AttnConfig(p_smem=True, row_sum_mma=True)


def test_kernel_arguments():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    k = FlashFwdSm90(bf, 64, 64, False, tile_m=192, tile_n=192, consumer_regs=160, producer_regs=32, p_smem=True)
    assert k.p_smem and not FlashFwdSm90(bf, 64, 64, False).p_smem
    with pytest.raises(ValueError, match="row_sum_mma"):
        FlashFwdSm90(bf, 64, 64, False, p_smem=True, row_sum_mma=True)
    # sP counts against shared memory: hd256's 128 x 80 tiles leave no room for it
    with pytest.raises(ValueError, match="shared memory"):
        FlashFwdSm90(bf, 256, 256, False, tile_n=80, p_smem=True)


def _sass(hdim, causal, tmp_path, **kw):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import steady_state_loops

    sass = spill_free_sass(hdim, causal, str(tmp_path), **kw)
    return steady_state_loops(sass), sass


def _pv_hgmmas(body, hdim_v):
    return [r for o, r in body if o.startswith(f"HGMMA.64x{hdim_v}x16")]


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("tile_n,causal,early", [(192, False, False), (160, False, False), (176, False, False),
                                                 (192, True, False), (144, False, True)])
def test_hd64_wide_key_blocks_compile_without_spills(tile_n, causal, early, tmp_path):
    """Counts on each loop's common path (kernels.sm90.sass.loop_common_path_ops; p_smem_early's redo arm stores P
    again off that path). p_smem_early fits tile_n 144: two 192 x 144 sP tiles, 204 KB in all."""
    from kernels.sm90.sass import loop_common_path_ops

    # 16k: one tile per CTA, where p_smem was timed (non-causal <= 8k runs the persistent kernel since session 61; there
    # tile_n 192 spills)
    _, sass = _sass(64, causal, tmp_path / "p", seqlen=16384, tile_n=tile_n, p_smem=True, p_smem_early=early)
    loops = loop_common_path_ops(sass)
    _, base_sass = _sass(64, causal, tmp_path / "base", seqlen=16384)
    base = loop_common_path_ops(base_sass)
    assert len(loops) == len(base)
    for body, b in zip(loops, base):
        ops = [o for o, _ in body]
        pv = _pv_hgmmas(body, 64)
        assert len(pv) == tile_n // 16
        # A from a shared-memory descriptor: the first operand after the accumulator is gdesc, not a register
        assert all(r.split(",")[1].strip().startswith("gdesc") for r in pv), pv[:2]
        assert all(not r.split(",")[1].strip().startswith("gdesc") for r in _pv_hgmmas(b, 64))  # the default: RS
        assert sum(o.startswith("STSM") for o in ops) == tile_n // 16  # 4 8x8 matrices of 16 bits per thread each
        assert sum(o.startswith("FENCE.VIEW.ASYNC.S") for o in ops) == 1
        # the same exponentials per column as the default's loop
        per_col = sum(o == "MUFU.EX2" for o in ops) / tile_n
        assert per_col == pytest.approx(sum(o == "MUFU.EX2" for o, _ in b) / 128, rel=0.05)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
def test_off_is_the_default_kernel(tmp_path):
    _, off = _sass(64, False, tmp_path / "off", p_smem=False)
    _, base = _sass(64, False, tmp_path / "base")
    assert off == base


def test_early_field_rules():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    check_forward_field("p_smem_early")
    bf = cutlass.BFloat16
    kw = dict(tile_m=192, consumer_regs=160, producer_regs=32, p_smem=True, p_smem_early=True)
    assert FlashFwdSm90(bf, 64, 64, False, **kw).p_smem_early
    assert not FlashFwdSm90(bf, 64, 64, False, **{**kw, "p_smem": False}).p_smem_early  # nothing to place
    assert not FlashFwdSm90(bf, 64, 64, False, **kw, intra_wg_overlap=False).p_smem_early
    assert not FlashFwdSm90(bf, 64, 64, False, **kw, num_stages=1).p_smem_early  # one stage: one sP tile
    with pytest.raises(ValueError, match="shared memory"):  # two 192 x 192 sP tiles: 144 KB
        FlashFwdSm90(bf, 64, 64, False, **{**kw, "tile_n": 192})


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (64, True), (128, False)])
def test_early_store_leaves_the_wait(hdim, causal, tmp_path):
    """On the mask-free loop's common path (kernels.sm90.sass.loop_common_path_ops), single sP tile: every STSM
    follows the last wait for the P V (WARPGROUP.DEPBAR), and the conversions mostly follow the last exponential.
    p_smem_early: every STSM precedes the warpgroup's vote (BAR.RED) and that wait, and more conversions sit among the
    exponentials (hd64 non-causal: 0 -> 16 of 32)."""
    from kernels.sm90.sass import loop_common_path_ops

    _, one = _sass(hdim, causal, tmp_path / "one", p_smem=True)
    _, two = _sass(hdim, causal, tmp_path / "two", p_smem=True, p_smem_early=True)
    ops1, ops2 = ([o for o, _ in loop_common_path_ops(sass)[-1]] for sass in (one, two))

    def last(ops, op):
        return max(i for i, o in enumerate(ops) if o.startswith(op))

    def first(ops, op):
        return min(i for i, o in enumerate(ops) if o.startswith(op))

    def among_exps(ops):  # conversions before the last exponential
        return sum(o.startswith("F2FP") for o in ops[:last(ops, "MUFU.EX2")])

    assert first(ops1, "STSM") > last(ops1, "WARPGROUP.DEPBAR")
    assert last(ops2, "STSM") < first(ops2, "BAR.RED") and last(ops2, "STSM") < last(ops2, "WARPGROUP.DEPBAR")
    assert among_exps(ops2) >= among_exps(ops1) + 8
    for op in ("STSM", "MUFU.EX2", "HGMMA", "FENCE.VIEW.ASYNC.S"):  # moved, none added on the common path
        assert sum(o.startswith(op) for o in ops2) == sum(o.startswith(op) for o in ops1)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("extra", [{"spec_redo_budget": 1}, {"speculative_exp": False}, {"pingpong": False},
                                   {"q_in_regs": True}],
                         ids=["budget1", "eager", "no_pingpong", "q_in_regs"])
def test_early_store_on_every_loop_shape(extra, tmp_path):
    """Every steady-state loop stores a block's P on its common path, tile_n / 16 STSM, whatever arm the loop takes
    (a review helper found the redo-budget loop storing none, session 57: the spec arm and the budget-spent eager arm
    each need their own store). With q_in_regs: hd64's 192-row tiles take Q in registers without a spill once P is
    in shared memory (P in registers: 24 LDL / 12 STL); _sass checks for local memory."""
    from kernels.sm90.sass import loop_common_path_ops

    for causal in (False, True):
        _, sass = _sass(64, causal, tmp_path / f"e{int(causal)}", p_smem=True, p_smem_early=True, **extra)
        for body in loop_common_path_ops(sass):
            assert sum(o.startswith("STSM") for o, _ in body) == 8, (causal, extra)
