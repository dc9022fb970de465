"""AttnConfig.q_prefetch (sm90 persistent forward on a static walk): once the producer warp has issued a tile's last
K/V pair it prefetches the next tile's Q into L2 (kernels/sm90/fwd.py prefetch_q). CPU tests: the field's rules, where
the kernel takes it, and the machine code: the Q tile's TMA prefetches (UTMAPF.L2) added and nothing else of the
kernel's work changed (the same loads, GEMMs and exponentials, no local memory). GPU checks:
tests/test_fwd_q_prefetch_gpu.py."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("q_prefetch")


def test_kernel_takes_it_on_static_persistent_walks():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    hd256 = dict(tile_n=80, q_prefetch=True)
    assert FlashFwdSm90(bf, 256, 256, True, persistent=True, persistent_greedy=True, **hd256).q_prefetch
    assert FlashFwdSm90(bf, 256, 256, True, persistent=True, **hd256).q_prefetch  # the round robin
    assert FlashFwdSm90(bf, 128, 128, False, persistent=True, q_prefetch=True).q_prefetch
    # one tile per CTA (no next tile), tiles claimed at run time (not known ahead), the split tail (pieces first)
    assert not FlashFwdSm90(bf, 256, 256, True, **hd256).q_prefetch
    assert not FlashFwdSm90(bf, 256, 256, True, persistent=True, persistent_dynamic=True, **hd256).q_prefetch
    assert not FlashFwdSm90(bf, 256, 256, False, persistent=True, split_tail=True, **hd256).q_prefetch


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen,extra",
                         [(256, True, 32768, {}), (128, False, 4096, {"split_tail": False})],
                         ids=["256_causal_walk", "128_persistent"])
def test_machine_code_adds_only_the_prefetch(hdim, causal, seqlen, extra, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.sass import count, opcode_counts

    off = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "off"), seqlen=seqlen, **extra))
    on = opcode_counts(spill_free_sass(hdim, causal, str(tmp_path / "on"), seqlen=seqlen, q_prefetch=True, **extra))
    assert count(off, "UTMAPF") == 0
    # one prefetch per TMA box of the Q tile: as many as the Q load's UTMALDG (64-column boxes: hd / 64)
    assert count(on, "UTMAPF.L2") == hdim // 64
    for op in ("UTMALDG", "HGMMA", "MUFU.EX2", "STG", "SYNCS.ARRIVE"):
        assert count(on, op) == count(off, op), op
