"""AttnConfig.p_before_vote (sm90 forward, speculative_exp's steady state; the hd 64 / 128 non-causal default since
session 63, H100: 1.044x at hd64 16k / 32k, 1.018x at hd128 16k; hd64 causal too since session 64, with p_cvt_asm and
spec_warp_redo): the wait for the previous block's P V, its V
release and this block's P conversion to 16 bits before the warpgroup's vote (kernels/sm90/fwd.py softmax_spec
``pv_first``). ptxas does not schedule across the vote's branch, so after it the conversions (F2FP) run alone; before
it they interleave with the MUFU exponentials.

CPU tests: the field's rules and defaults, the kernel switch (only with speculative_exp; not with p_smem, a redo budget
or qk_halves), and the machine code: no local memory, the same HGMMA and MUFU.EX2 counts as without it, and the
steady-state block's F2FP conversions before the vote's barrier (BAR.RED), where without it they follow it. The GPU
checks are tests/test_fwd_p_before_vote_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules_and_defaults():
    check_forward_field("p_before_vote")
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            on = AttnConfig().resolve("sm90", hdim, causal).p_before_vote
            assert bool(on) == (hdim == 64 or (hdim == 128 and not causal)), (hdim, causal)
    # kept out where the kernel drops it (no speculation, qk_halves, P from shared memory, a redo budget)
    for extra in ({"speculative_exp": False}, {"qk_halves": True}, {"p_smem": True}, {"spec_redo_budget": 1},
                  {"rescale_threshold": 0.0}):
        assert not AttnConfig(**extra).resolve("sm90", 64, False).p_before_vote, extra
    assert AttnConfig(p_before_vote=False).resolve("sm90", 64, False).p_before_vote is False


def test_kernel_takes_it_only_on_the_speculative_step():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    h64 = dict(tile_m=192, consumer_regs=160, producer_regs=32)
    assert FlashFwdSm90(bf, 64, 64, False, speculative_exp=True, p_before_vote=True, **h64).p_before_vote
    assert FlashFwdSm90(bf, 128, 128, True, speculative_exp=True, p_before_vote=True).p_before_vote
    assert not FlashFwdSm90(bf, 64, 64, False, p_before_vote=True, **h64).p_before_vote  # eager step
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, p_before_vote=True, p_smem=True).p_before_vote
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, p_before_vote=True,
                            spec_redo_budget=1).p_before_vote
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, p_before_vote=True,
                            qk_halves=True).p_before_vote


def _f2fp_before_vote(body) -> int:
    """F2FP conversions of the steady-state loop body before its first BAR.RED (the speculative vote)."""
    k = next(n for n, (o, _) in enumerate(body) if o.startswith("BAR.RED"))
    return sum(o.startswith("F2FP") for o, _ in body[:k])


# hd64 non-causal 4k: the persistent kernel (the default there), 16k: one tile; hd128 16k: the split tail's persistent
# kernel; hd64 causal (not a default): the mask-free loop, with the inline-PTX conversion (p_cvt_asm; the causal default
# converts through LLVM, which sinks the conversions past the vote's branch: 0 before it, and a common path of 378
# instructions against 326)
@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen,convs,extra", [(64, False, 16384, 32, {}), (64, False, 4096, 32, {}),
                                                            (128, False, 16384, 32, {}),
                                                            (64, True, 16384, 32, {"p_cvt_asm": True})])
def test_machine_code_converts_before_the_vote(hdim, causal, seqlen, convs, extra, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops

    # (the warpgroup vote: spec_warp_redo, hd64's default since session 64, votes per warp)
    off = spill_free_sass(hdim, causal, str(tmp_path / "off"), seqlen=seqlen, p_before_vote=False,
                          spec_warp_redo=False, **extra)
    on = spill_free_sass(hdim, causal, str(tmp_path / "on"), seqlen=seqlen, p_before_vote=True,
                         spec_warp_redo=False, **extra)
    c_off, c_on = opcode_counts(off), opcode_counts(on)
    assert count(c_on, "HGMMA") == count(c_off, "HGMMA") and count(c_on, "MUFU.EX2") == count(c_off, "MUFU.EX2")
    # a thread's 2 rows x tile_n/4 P, in pairs, moved before the vote (the split tail's loop has 2 there either way)
    assert _f2fp_before_vote(steady_state_loops(on)[-1]) - _f2fp_before_vote(steady_state_loops(off)[-1]) >= convs
