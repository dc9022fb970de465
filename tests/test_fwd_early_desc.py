"""AttnConfig.early_desc (sm90 forward, overlapped loop; opt-in, not yet timed): the wgmma descriptors of a block's K
and V stages computed before its waits (kernels/sm90/fwd.py first_block / overlap_block).

Without it the stage slices are taken at the GEMM calls, after the warpgroups' GEMM turn (a named bar.sync), and ptxas
does not schedule across that barrier: between the turn and the first HGMMA stands the shared address's conversion to
descriptor bits (UIADD3 -> USHF -> ULOP3 -> ULOP3 -> ULEA, about six dependent uniform instructions at hd64). With it
the conversion sits before the K stage's mbarrier wait and only register moves follow the turn.

CPU tests: the field's rules, the kernel switch, and the machine code of the steady-state loops (no address shift,
USHF.R, between the turn and the first HGMMA; the same HGMMA / MUFU.EX2 counts; no local memory) with the default's
kernel unchanged. The GPU check (outputs bitwise the default's) is tests/test_fwd_early_desc_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("early_desc")
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            assert "early_desc" not in AttnConfig().resolve("sm90", hdim, causal).to_dict()  # not a default


def test_kernel_takes_it_with_the_overlapped_loop_only():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 64, 64, False, early_desc=True).early_desc
    assert not FlashFwdSm90(bf, 64, 64, False, early_desc=True, intra_wg_overlap=False).early_desc
    assert not FlashFwdSm90(bf, 64, 64, False).early_desc


def _loops(hdim, causal, early, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import steady_state_loops

    # p_before_vote (the hd64 non-causal default since session 63) off: early_desc was measured on the loop before it,
    # and with it ptxas already schedules the descriptor shift before the turn
    sass = spill_free_sass(hdim, causal, str(tmp_path), early_desc=early, p_before_vote=False)
    return [[o for o, _ in body] for body in steady_state_loops(sass)], sass


def _after_turn(ops):
    """The opcodes between a loop's GEMM turn (its first BAR.SYNC) and the first HGMMA after it."""
    t = next(i for i, o in enumerate(ops) if o.startswith("BAR.SYNC"))
    return ops[t + 1:next(i for i in range(t, len(ops)) if ops[i].startswith("HGMMA"))]


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (128, True)])
def test_descriptors_leave_the_turn(hdim, causal, tmp_path):
    """hd64 non-causal (its turn was followed by 18 instructions, 11 of them not moves; with it 11 and 4) and hd128
    causal (both loops 12 / 9 -> 7 / 4)."""
    base, base_sass = _loops(hdim, causal, None, tmp_path / "base")
    early, _ = _loops(hdim, causal, True, tmp_path / "early")
    off, off_sass = _loops(hdim, causal, False, tmp_path / "off")
    assert off_sass == base_sass  # False is the default's kernel (both with p_before_vote off)
    assert len(early) == len(base)
    for b, e in zip(base, early):
        # the shared address -> descriptor shift (addr >> 4) after the turn, and with early_desc before it
        assert any(o.startswith("USHF.R") for o in _after_turn(b))
        assert not any(o.startswith("USHF.R") for o in _after_turn(e))
        moves = ("UMOV", "WARPGROUP")
        assert (sum(not o.startswith(moves) for o in _after_turn(e))
                < sum(not o.startswith(moves) for o in _after_turn(b)))
        for op in ("HGMMA", "MUFU.EX2"):
            assert sum(o.startswith(op) for o in e) == sum(o.startswith(op) for o in b)
