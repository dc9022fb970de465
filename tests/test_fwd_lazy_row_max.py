"""AttnConfig.lazy_row_max (sm90 forward, tau > 0; the hd 64 / 128 default since session 50, hd256 since 59): the
rescale decision on each thread's own row maxima, the quad's max shuffles only in the rescale arm
(kernels/sm90/softmax.py online_softmax_step lazy_max).

CPU tests: the field (dict / hash while off, sm100 refuses it, forward-only), the kernel switch (off at tau 0), and the
machine code: in the K/V loop every SHFL.BFLY follows the warp's VOTE.ANY (the default: before it), with the same
instruction count and no local memory. The GPU checks (bitwise the default's output) are in
tests/test_fwd_lazy_row_max_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field, loop_ops  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("lazy_row_max")
    # a default at hd 64 / 128 (session 50) and hd256 (session 59, with speculative_exp), not at (192, 128) (timed
    # 1.00 alone, session 52) nor at tau 0 (no vote to change)
    for hdim in (64, 128, 256):
        assert all(AttnConfig().resolve("sm90", hdim, causal).lazy_row_max for causal in (False, True))
    assert "lazy_row_max" not in AttnConfig().resolve("sm90", 192, False).to_dict()
    assert "lazy_row_max" not in AttnConfig(rescale_threshold=0.0).resolve("sm90", 128, False).to_dict()
    assert AttnConfig(lazy_row_max=False).resolve("sm90", 128, False).lazy_row_max is False


def test_kernel_takes_it_where_tau_is_positive():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, False, lazy_row_max=True).lazy_row_max
    assert not FlashFwdSm90(bf, 128, 128, False, lazy_row_max=True, rescale_threshold=0.0).lazy_row_max
    assert not FlashFwdSm90(bf, 128, 128, False).lazy_row_max


def _loop(hdim, causal, lazy, tmp_path):
    # (the warpgroup's vote: spec_warp_redo, hd64's default since session 64, votes per warp; measured without it)
    cfg = AttnConfig(lazy_row_max=lazy, spec_warp_redo=False).resolve("sm90", hdim, causal)
    return [(o, None) for o in loop_ops(cfg, hdim, causal, str(tmp_path / f"{hdim}{causal}{lazy}"))]


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (128, True), (256, False), (192, True)])
def test_shuffles_move_behind_the_vote(hdim, causal, tmp_path):
    """Each SHFL.BFLY of the loop: the default's reach a VOTE.ANY (the decision) before any exponential; lazy's follow
    one with no exponential between (the rescale arm). The loop keeps its length: the same instructions, moved."""
    def vote_before_any_exp(ops, i, step):
        j = i + step
        while 0 <= j < len(ops) and ops[j] != "MUFU.EX2":
            if ops[j] == "VOTE.ANY":
                return True
            j += step
        return False

    base, lazy = _loop(hdim, causal, False, tmp_path), _loop(hdim, causal, True, tmp_path)
    for loop, step in ((base, 1), (lazy, -1)):
        ops = [o for o, _ in loop]
        shfl = [i for i, o in enumerate(ops) if o.startswith("SHFL.BFLY")]
        assert shfl and all(vote_before_any_exp(ops, i, step) for i in shfl), (hdim, causal, step)
    assert len(lazy) == len(base)
