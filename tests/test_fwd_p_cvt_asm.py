"""AttnConfig.p_cvt_asm (sm90 forward; on by default non-causal and at hd256 causal, DEFAULTS' pair): the P conversion
among the exponentials (notes: /work/notes/fwd_s8.md).

Found by comparing PTX / SASS with official FA4's sm90 forward at hd128 non-causal: LLVM folds the loop-carried phi of
the two identical P casts (before the main loop, end of its body) into one cast in the loop header, so in our plain
loop all 32 F2FP (and, with them, the end of the block) run after the tau-conditional O rescale, after the last
MUFU.EX2: ~46 executed instructions between a warpgroup's last exponential and its next GEMM issue when tau skips the
rescale (official: 7, its in-loop conversion is inline PTX). p_cvt_asm converts P by inline PTX (not folded), pins the
row sums before the rescale decision, and writes the K/V loop with its exit test at the top (a warp vote), because a
bottom-tested (LLVM-rotated) loop makes ptxas keep the pipeline states in vector registers.

These CPU tests check the machine code: F2FP / FADD interleaved with the exponentials, a short tail, pipeline state in
uniform registers, 0 local-memory spills, and the kernel without it (p_cvt_asm=False) unchanged (config hash and SASS).
"""
from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402
from test_fwd_loop_shape import _loops, _sass  # noqa: E402  (one SASS cache for the forward loop-shape files)


# ---- the field (no compile) -----------------------------------------------------------------------------------------
def test_p_cvt_asm_default_pair_and_hashes():
    """None resolves to DEFAULTS' (non-causal, causal) pair (True fills the field, off leaves it None: the hash of
    before the field); an explicit value is its own config."""
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            r = AttnConfig().resolve("sm90", hd, causal)
            want = (not causal) or hd in (64, 256)  # hd64 causal since session 64 (with spec_warp_redo)
            assert r.p_cvt_asm is (True if want else None)
            assert ("p_cvt_asm" in r.to_dict()) is want
            on = AttnConfig(p_cvt_asm=True).resolve("sm90", hd, causal)
            assert on.to_dict()["p_cvt_asm"] is True and (on.config_hash() == r.config_hash()) is want
            off = AttnConfig(p_cvt_asm=False).resolve("sm90", hd, causal)
            assert off.p_cvt_asm is False and off.config_hash() != on.config_hash()
    assert AttnConfig(p_cvt_asm=True).op_string == '{"p_cvt_asm":true}'


# validation (None / bool, sm90 only) and the forward-only compiled config: tests/test_fwd_loop_shape.py FIELDS


def test_kernel_takes_it_with_the_overlapped_loop_only():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, False, p_cvt_asm=True).p_cvt_asm
    assert not FlashFwdSm90(bf, 128, 128, False, p_cvt_asm=True, intra_wg_overlap=False).p_cvt_asm
    assert not FlashFwdSm90(bf, 128, 128, False).p_cvt_asm


# ---- SASS ----------------------------------------------------------------------------------------------------------
needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")


def _main_loop(sass: str):
    """(opcode, operands) of the last steady-state loop (test_fwd_loop_shape._loops; inner loops do not overlap, so
    the last is the mask-free loop of a split causal kernel)."""
    loops = _loops(sass)
    assert loops, "no main loop found"
    return loops[-1]


def _tail_to_rescale_branch(body):
    """Opcodes after the last MUFU.EX2 up to the first branch after it (the tau-skip path's O-rescale branch, or the
    back edge): what a warp still runs after its last exponential before the loop's end."""
    ops = [o for o, _ in body]
    last = max(i for i, o in enumerate(ops) if o == "MUFU.EX2")
    tail = []
    for o in ops[last + 1:]:
        if o.startswith("BRA"):
            break
        tail.append(o)
    return tail


def _spills(sass: str) -> int:
    return len(re.findall(r"\b(?:LDL|STL)\b", sass))


def _vector_state(body) -> int:
    """mbarrier operations addressed through a vector register, plus R2UR: the pipeline state / wgmma descriptors not
    in uniform registers."""
    return sum(1 for o, r in body if (o.startswith("SYNCS") and re.search(r"\[R\d+", r)) or o == "R2UR")


@needs_nvdisasm
@pytest.mark.compile
def test_p_conversion_among_the_exponentials_hd128(tmp_path_factory):
    """hd128 non-causal: without it 32 F2FP after the last MUFU.EX2 (header after the rescale branch); p_cvt_asm <= 2 of
    them and <= 12 instructions before the branch; same HGMMA / EX2 / F2FP counts; uniform pipeline state; 0 LDL/STL."""
    base = _sass(tmp_path_factory, 128, False, p_cvt_asm=False, pv_wait_mid=False)  # (pv_wait_mid: the default since
    on = _sass(tmp_path_factory, 128, False, p_cvt_asm=True, pv_wait_mid=False)  # 2026-12-01, its own loop layout)
    lb, lo = _main_loop(base), _main_loop(on)
    ops_b, ops_o = [o for o, _ in lb], [o for o, _ in lo]
    for name in ("MUFU.EX2", "F2FP"):
        assert sum(o.startswith(name) for o in ops_b) == sum(o.startswith(name) for o in ops_o), name
    assert sum(o.startswith("HGMMA") for o in ops_b) == sum(o.startswith("HGMMA") for o in ops_o) == 16
    last_b = max(i for i, o in enumerate(ops_b) if o == "MUFU.EX2")
    last_o = max(i for i, o in enumerate(ops_o) if o == "MUFU.EX2")
    assert sum(o.startswith("F2FP") for o in ops_b[last_b:]) == 32  # without it: every conversion after them
    assert sum(o.startswith("F2FP") for o in ops_o[last_o:]) <= 2
    tail = _tail_to_rescale_branch(lo)
    assert len(tail) <= 12 and not any(o.startswith("FMUL") for o in tail), tail
    assert _vector_state(lo) == 0 == _vector_state(lb)
    assert len(lo) <= len(lb) + 4  # the same loop size (the vote of the exit test)
    assert _spills(on) == 0 == _spills(base)


@needs_nvdisasm
@pytest.mark.compile
@pytest.mark.parametrize("hdim, causal", [(64, False), (256, False), (192, False), (128, True), (192, True)])
def test_p_cvt_asm_other_head_dims(tmp_path_factory, hdim, causal):
    """The other non-causal head dims with p_cvt_asm: 0 LDL/STL, pipeline state in uniform registers, <= 2 F2FP after
    the last exponential (without it: 32, or 20 at tile_n 80). Causal: 0 LDL/STL only (hd128 causal's one-loop default
    kernel is divergent already, fwd_s7 finding 1, and exp_in_branch leaves the conversions after the branch arms;
    (192, 128) causal's split loops gain 3 vector-register state instructions: not a target)."""
    on = _sass(tmp_path_factory, hdim, causal, p_cvt_asm=True)
    assert _spills(on) == 0
    if causal:
        return
    body = _main_loop(on)
    assert _vector_state(body) == 0
    ops = [o for o, _ in body]
    last = max(i for i, o in enumerate(ops) if o == "MUFU.EX2")
    assert sum(o.startswith("F2FP") for o in ops[last:]) <= 2
