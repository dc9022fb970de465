"""The sm90 forward's softmax tail and the causal tile order's L2 budget (notes: /work/notes/fwd_s7b.md).

Tail: the instructions of the mask-free main loop after its last MUFU.EX2, i.e. what a warpgroup still runs between
its last exponential and its next GEMM issue. Official FA4 runs 7 there (ptxas interleaves the P conversion and the O
rescale with the exponentials); our default loop has the P conversion (32 F2FP) and the tau-conditional O rescale
(64 FMUL) after them (~110 static, ~46 executed when tau skips the rescale), with or without causal_split /
exp_in_branch. rescale_before_pv (O rescaled before the next P V issue) leaves ~11; with causal_split the (192, 128)
causal mask-free loop gets the same short tail as the non-causal one (which reached official's speed on the H200 with
the 128 x 128 tile). Recipes only: no new kernel code.

lpt_l2_mb (AttnConfig, host side): the budget that sizes the causal tile order's head groups (kernels/sm90/scheduler.py
lpt_group_size); None = 32 MB, official FA4 uses 50.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, opcode_counts, steady_state_loops  # noqa: E402
from test_fwd_loop_shape import _sass  # noqa: E402  (one SASS cache for both files)
from kernels.sm90.scheduler import L2_BUDGET_BYTES, lpt_group_size  # noqa: E402


# ---- lpt_l2_mb (no compile) -----------------------------------------------------------------------------------------
def test_lpt_l2_mb_default_none_leaves_hashes_unchanged():
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            r = AttnConfig().resolve("sm90", hd, causal)
            assert r.lpt_l2_mb is None and "lpt_l2_mb" not in r.to_dict()
    on = AttnConfig(lpt_l2_mb=50)
    assert on.to_dict()["lpt_l2_mb"] == 50 and on.op_string == '{"lpt_l2_mb":50}'
    assert on.resolve("sm90", 192, True).lpt_l2_mb == 50
    assert on.config_hash() != AttnConfig().config_hash()


@pytest.mark.parametrize("bad", [0, True, 2.0, 1025, "50"])
def test_lpt_l2_mb_refused_out_of_range(bad):
    with pytest.raises(ConfigError, match="lpt_l2_mb="):
        AttnConfig(lpt_l2_mb=bad)


def test_lpt_group_size_with_the_budget():
    """(192, 128) at 16k tokens, hidden 2048 (10 heads): ours groups 2 (16k) / 4 (8k) heads, official's 50 MB 4 / 8."""
    assert L2_BUDGET_BYTES == 32 << 20
    assert lpt_group_size(10, 1, 16384, 192, 128, 2) == 2
    assert lpt_group_size(10, 1, 16384, 192, 128, 2, 50 << 20) == 4
    assert lpt_group_size(10, 2, 8192, 192, 128, 2) == 4
    assert lpt_group_size(10, 2, 8192, 192, 128, 2, 50 << 20) == 8
    assert lpt_group_size(16, 1, 16384, 128, 128, 2) == lpt_group_size(16, 1, 16384, 128, 128, 2, 50 << 20) == 4
    assert lpt_group_size(2, 1, 16384, 128, 128, 2, 1024 << 20) == 2  # never more than the (head, batch) pairs
    assert lpt_group_size(10, 1, 1 << 20, 192, 128, 2, 1 << 20) == 1


def test_lpt_l2_mb_is_forward_only_in_the_backward_compiled_config():
    from kernels.tiles import compiled_config

    bwd = compiled_config(AttnConfig(lpt_l2_mb=50), "sm90", 128, True, "bwd")
    assert "lpt_l2_mb" not in bwd and bwd == compiled_config(None, "sm90", 128, True, "bwd")


# ---- SASS: the tail after the last exponential ----------------------------------------------------------------------
def _mask_free_loop(sass: str):
    """Opcodes of the last steady-state loop (the mask-free one; split: the second)."""
    loops = steady_state_loops(sass)
    assert loops, "no main loop found"
    return [op for op, _ in loops[-1]]


def _tail(ops) -> list:
    last = max(i for i, o in enumerate(ops) if o == "MUFU.EX2")
    return ops[last + 1:]


needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip nvidia-cuda-nvdisasm)")


@pytest.mark.compile
@needs_nvdisasm
def test_default_loop_converts_p_after_the_exponentials(tmp_path_factory):
    """The one-loop / split / exp_in_branch mask-free loops without rescale_before_pv: the 32 F2FP of P (and the rescale's 64 FMUL) after the
    last exponential (official: 7 instructions there, 2 F2FP)."""
    # pv_wait_mid off throughout ((192, 128) causal's default since 2026-12-01: its own loop, tests/test_fwd_pv_wait_mid.py)
    one_loop = dict(causal_split=False, rescale_before_pv=False, pv_wait_mid=False)  # the default before 2026-12-01
    for sw in (one_loop, dict(causal_split=True, rescale_before_pv=False, pv_wait_mid=False),
               dict(causal_split=True, exp_in_branch=True, rescale_before_pv=False, pv_wait_mid=False)):
        tail = _tail(_mask_free_loop(_sass(tmp_path_factory, 192, True, **sw)))
        assert sum(o.startswith("F2FP") for o in tail) == 32 and len(tail) > 100, (sw, len(tail))


@pytest.mark.compile
@needs_nvdisasm
@pytest.mark.parametrize("causal", [False, True])
def test_split_prepv_has_a_short_tail_and_no_spills(tmp_path_factory, causal):
    """(192, 128), 128 x 128 tile: rescale_before_pv (+ causal_split when causal) interleaves the P conversion with the
    exponentials: <= 16 instructions after the last one, at most 4 F2FP, no FMUL; uniform loop, 0 LDL / STL."""
    sw = dict(rescale_before_pv=True, tile_m=128, tile_n=128, consumer_regs=240, producer_regs=24, pv_wait_mid=False)
    if causal:
        sw["causal_split"] = True
    sass = _sass(tmp_path_factory, 192, causal, **sw)
    c = opcode_counts(sass)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    assert count(c, "BSSY") <= 3
    ops = _mask_free_loop(sass)
    tail = _tail(ops)
    assert len(tail) <= 16 and sum(o.startswith("F2FP") for o in tail) <= 4 and not any(o.startswith("FMUL") for o in tail), tail
    assert sum(o.startswith("HGMMA") for o in ops) == 20 and ops.count("MUFU.EX2") == 66 and "BSSY" not in ops


@pytest.mark.compile
@needs_nvdisasm
def test_split_tau0_converts_p_among_the_exponentials(tmp_path_factory):
    """causal_split + rescale_threshold 0 (official's loop: no tau branch): the F2FP among the exponentials (<= 2
    after the last), the O rescale's FMULs partly after; 0 LDL / STL."""
    sass = _sass(tmp_path_factory, 192, True, causal_split=True, rescale_threshold=0.0)
    c = opcode_counts(sass)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    tail = _tail(_mask_free_loop(sass))
    assert sum(o.startswith("F2FP") for o in tail) <= 2, tail
