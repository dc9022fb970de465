"""AttnConfig.qk_halves (sm90 forward, opt-in; session 63, H100: 0.88-0.97x the default): in speculative_exp's steady
state each block's S = Q K^T is issued as two wgmma groups of tile_n/2 key columns, and the first half's exponentials
run before the wait for the second (kernels/sm90/fwd.py qk_gemm_halves, softmax.exp_kept_max ``mid``).

CPU tests: the field's rules, the kernel switch (only with speculative_exp, not with q_regs_k, a softcap or a redo
budget, nor below 32-key blocks), and the machine code: no local memory, no serialized wgmma (ptxas adds a WARPGROUP.DEPBAR after every HGMMA
when it cannot pipeline them: it did while the redo issued S whole into the halves' registers), two more waits than
the default (the first half's, and the NaN arm's), twice the QK^T HGMMAs in the steady state, and the point of it: the
first half's MUFU.EX2 between the first half's wait and the second's (ptxas hoists a plain wait above them; the branch on
the first half's sums keeps it there). The GPU check (out / lse bitwise the default's) is
tests/test_fwd_qk_halves_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("qk_halves")
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            assert "qk_halves" not in AttnConfig().resolve("sm90", hdim, causal).to_dict()  # not a default


def test_kernel_takes_it_only_on_the_speculative_step():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    h64 = dict(tile_m=192, consumer_regs=160, producer_regs=32)
    assert FlashFwdSm90(bf, 64, 64, False, speculative_exp=True, qk_halves=True, **h64).qk_halves
    assert FlashFwdSm90(bf, 256, 256, True, tile_n=80, speculative_exp=True, qk_halves=True).qk_halves
    assert not FlashFwdSm90(bf, 64, 64, False, qk_halves=True, **h64).qk_halves  # eager step
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, qk_halves=True, softcap=30.0).qk_halves
    assert not FlashFwdSm90(bf, 256, 256, False, tile_n=80, speculative_exp=True, qk_halves=True, q_regs_k=2).qk_halves
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, qk_halves=True, spec_redo_budget=1).qk_halves
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, qk_halves=True, tile_n=16).qk_halves


def _first_half_mufu(body) -> tuple[int, int]:
    """MUFU.EX2 of the steady-state loop body between its first 'wait for all but 2 groups' and the next wait, and
    after that next wait up to the speculative vote (BAR.RED)."""
    ops = [(o, rest) for o, rest in body]
    i = next(n for n, (o, rest) in enumerate(ops) if o.startswith("WARPGROUP.DEPBAR") and "0x2" in rest)
    j = next(n for n in range(i + 1, len(ops)) if ops[n][0].startswith("WARPGROUP.DEPBAR"))
    k = next(n for n in range(j, len(ops)) if ops[n][0].startswith("BAR.RED"))
    mufu = lambda a, b: sum(o.startswith("MUFU.EX2") for o, _ in ops[a:b])  # noqa: E731
    return mufu(i, j), mufu(j, k)


# hd64 non-causal 4k: the persistent kernel (the default there), 16k: one tile; causal: the mask-free loop (the last)
@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen,half_exps", [(64, False, 16384, 32), (64, False, 4096, 32),
                                                          (128, True, 16384, 32), (256, False, 16384, 20)])
def test_machine_code_issues_halves_and_exps_between_the_waits(hdim, causal, seqlen, half_exps, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops

    # (the kernel without p_before_vote, which qk_halves drops: as its GPU test compares)
    base = spill_free_sass(hdim, causal, str(tmp_path / "base"), seqlen=seqlen, p_before_vote=False)
    new = spill_free_sass(hdim, causal, str(tmp_path / "halves"), seqlen=seqlen, qk_halves=True)
    cb, cn = opcode_counts(base), opcode_counts(new)
    assert count(cn, "WARPGROUP.DEPBAR") == count(cb, "WARPGROUP.DEPBAR") + 2  # not serialized
    assert count(cn, "MUFU.EX2") == count(cb, "MUFU.EX2")
    k_blocks = hdim // 16  # QK^T's k16 steps: each half issues them again, in the step and in its redo
    assert count(cn, "HGMMA") == count(cb, "HGMMA") + 2 * k_blocks
    loop = steady_state_loops(new)[-1]
    assert _first_half_mufu(loop) == (half_exps, half_exps)
