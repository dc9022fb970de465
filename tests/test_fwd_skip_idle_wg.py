"""AttnConfig.skip_idle_wg (sm90 forward, overlapped loop; opt-in, first timed in session 61): a consumer warpgroup
whose 64 rows of the Q tile all lie past seqlen_q keeps the tile's barrier protocol but issues no GEMM and no softmax
(kernels/sm90/fwd.py idle_loop). At hd64's 192-row tiles the last tile of a 4k / 16k sequence has 64 valid rows (two
warpgroups idle), of an 8k / 32k one 128 (one idle).

CPU tests: the field's rules, the kernel switch (not in the split tail, not on the causal walks, where the branch cost
the mask-free loop 8-42 instructions of its common path), and the machine code: no local memory, the same HGMMA /
MUFU.EX2 counts and mask-free loop common path as the default, and one more loop, the idle one, with the mbarrier waits
and GEMM turns and no HGMMA. The GPU check (out / lse bitwise the default's) is
tests/test_fwd_skip_idle_wg_gpu.py.
"""
from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("skip_idle_wg")
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            assert "skip_idle_wg" not in AttnConfig().resolve("sm90", hdim, causal).to_dict()  # not a default


def test_kernel_takes_it_with_the_overlapped_loop_outside_the_split_tail():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 64, 64, False, tile_m=192, consumer_regs=160, producer_regs=32, skip_idle_wg=True).skip_idle_wg
    assert not FlashFwdSm90(bf, 64, 64, False, skip_idle_wg=True, intra_wg_overlap=False).skip_idle_wg
    assert not FlashFwdSm90(bf, 128, 128, False, skip_idle_wg=True, persistent=True, split_tail=True).skip_idle_wg
    assert not FlashFwdSm90(bf, 64, 64, True, skip_idle_wg=True, persistent=True, persistent_greedy=True).skip_idle_wg
    assert not FlashFwdSm90(bf, 64, 64, False).skip_idle_wg


def _idle_loops(sass: str) -> int:
    """Backward branches before the last EXIT whose body waits on an mbarrier and takes a GEMM turn (BAR.SYNC) with no
    HGMMA: idle_loop's K/V loop."""
    from kernels.sm90.sass import instructions

    ins, labels = instructions(sass)
    last_exit = max(a for a, op, _ in ins if op == "EXIT")
    n = 0
    for a, op, rest in ins:
        m = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if m and labels[m.group(1)] < a < last_exit:
            ops = [o for x, o, _ in ins if labels[m.group(1)] <= x <= a]
            n += (not any(o.startswith("HGMMA") for o in ops) and any(o.startswith("BAR.SYNC") for o in ops)
                  and any(o.startswith("SYNCS") for o in ops))
    return n


# hd64 non-causal 1k / 4k: the persistent kernel (the default up to 8k), 16k: one tile per CTA
@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen,loops", [(64, False, 4096, 1), (64, False, 16384, 1), (64, True, 32768, 1),
                                                       (64, False, 1024, 1), (256, False, 4096, 1),
                                                       (128, False, 32768, 0),  # the split tail: left out
                                                       (64, True, 8192, 0)])  # the causal greedy walk: left out
def test_machine_code_adds_the_idle_loop_only(hdim, causal, seqlen, loops, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, loop_common_paths, opcode_counts

    # p_before_vote (the hd 64 / 128 non-causal default since session 63) off: skip_idle_wg was measured without it, and
    # with it ptxas schedules the two kernels' mask-free loops 1-3 instructions apart; hd64 causal's p_cvt_asm (a
    # default since session 64) off as well, for the same reason
    # hd256 non-causal 4k: one tile per CTA, as measured (persistent with o_via_v_stage since session 66)
    old = dict(p_before_vote=False, p_cvt_asm=False if hdim == 64 and causal else None,
               persistent=False if hdim == 256 else None)
    base = spill_free_sass(hdim, causal, str(tmp_path / "base"), seqlen=seqlen, **old)
    idle = spill_free_sass(hdim, causal, str(tmp_path / "idle"), seqlen=seqlen, skip_idle_wg=True, **old)
    cb, ci = opcode_counts(base), opcode_counts(idle)
    assert count(ci, "HGMMA") == count(cb, "HGMMA") and count(ci, "MUFU.EX2") == count(cb, "MUFU.EX2")
    assert _idle_loops(idle) == _idle_loops(base) + loops
    # the mask-free K/V loop (the last; causal one tile per CTA: the diagonal loop's common path may move by one)
    assert loop_common_paths(idle)[-1] == loop_common_paths(base)[-1]
