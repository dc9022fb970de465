"""FlashFwdSm90(early_v_release=True) (sm90 forward, overlapped loop; opt-in, GPU-untested; notes: /work/notes/fwd_s10.md).

Found by comparing the hd128 non-causal SASS with official FA4's sm90 forward (4.0.0b36, compiled here for sm_90a): both
steady-state loops issue 16 HGMMA and 66 MUFU.EX2, but official releases the V stage of its P V GEMM right after waiting
for it (after 11 of its exponentials), while ours waits before all of its exponentials (ptxas hoists the wait to the
top of the block after the tau decision) and releases the stage after 65 of 66 (ptxas schedules the mbarrier arrive
last in the exponentials' block, even when it is written right after the wait). early_v_release calls the wait and
the release from the softmax step after the row maxima, before the rescale decision, so both stay in that block, before
every exponential; same instructions (the loop's opcode multiset is the default's), same arithmetic.

These CPU tests check the machine code: the V release before every MUFU.EX2 of the loop body (the default: after all
but one), the same opcodes, pipeline state in uniform registers, 0 local-memory spills, and the kernel without it
unchanged (scripts/sass_identity.py for the default SASS).
"""
from __future__ import annotations

import os
from collections import Counter

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402
from test_fwd_p_cvt_asm import _main_loop, _spills, _vector_state  # noqa: E402


# ---- the kernel switch (no compile) ---------------------------------------------------------------------------------
def test_kernel_takes_it_with_the_overlapped_loop_only():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, False, early_v_release=True).early_v_release
    assert FlashFwdSm90(bf, 128, 128, True, early_v_release=True).early_v_release
    assert FlashFwdSm90(bf, 128, 128, False, early_v_release=True, rescale_threshold=0.0).early_v_release  # tau 0 too
    assert not FlashFwdSm90(bf, 128, 128, False, early_v_release=True, intra_wg_overlap=False).early_v_release
    # pv_wait_mid and exp_in_branch place the wait themselves
    assert not FlashFwdSm90(bf, 128, 128, False, early_v_release=True, pv_wait_mid=True).early_v_release
    assert not FlashFwdSm90(bf, 128, 128, True, early_v_release=True, exp_in_branch=True).early_v_release
    assert not FlashFwdSm90(bf, 128, 128, False).early_v_release


# ---- SASS ----------------------------------------------------------------------------------------------------------
needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
_CACHE: dict = {}


def _kernel_sass(tmp_path_factory, hdim, causal, early_v_release, **switches) -> str:
    """SASS of the resolved default config's kernel (plus ``switches``) built directly, with ``early_v_release`` (the
    AttnConfig field does not exist yet: the kernel's constructor argument)."""
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90
    from sass_cache import kernel_sass  # tests/sass_cache.py: one compile per kernel in the session

    key = (hdim, causal, early_v_release, tuple(sorted(switches.items())))
    if key not in _CACHE:
        cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
        kern = FlashFwdSm90(
            cutlass.BFloat16, hdim, 128 if hdim == 192 else hdim, causal, tile_m=cfg.tile_m, tile_n=cfg.tile_n,
            num_stages=cfg.num_stages, rescale_threshold=float(cfg.rescale_threshold),
            exp2_emu_fraction=float(cfg.exp2_emu_fraction), pingpong=cfg.pingpong,
            intra_wg_overlap=cfg.intra_wg_overlap, consumer_regs=cfg.consumer_regs, producer_regs=cfg.producer_regs,
            rescale_before_pv=bool(cfg.rescale_before_pv), causal_split=bool(cfg.causal_split),
            exp_in_branch=bool(cfg.exp_in_branch), p_cvt_asm=bool(cfg.p_cvt_asm), pv_wait_mid=bool(cfg.pv_wait_mid),
            early_v_release=early_v_release)
        _CACHE[key] = kernel_sass(kern, str(tmp_path_factory.mktemp("sass")))
    return _CACHE[key]


def _release_after(body):
    """(MUFU.EX2 before the loop's wait for every wgmma (the in-flight P V), MUFU.EX2 before the V release (the first
    mbarrier arrive after that wait), all MUFU.EX2), in address order."""
    ops = [(o, r.strip()) for o, r in body]
    ex2 = [i for i, (o, _) in enumerate(ops) if o == "MUFU.EX2"]
    wait = next(i for i, (o, r) in enumerate(ops) if o == "WARPGROUP.DEPBAR.LE" and r.endswith("0x0"))
    release = next(i for i in range(wait, len(ops)) if ops[i][0].startswith("SYNCS.ARRIVE"))
    return sum(i < wait for i in ex2), sum(i < release for i in ex2), len(ex2)


@needs_nvdisasm
@pytest.mark.compile
def test_v_released_before_the_exponentials_hd128(tmp_path_factory):
    """hd128 non-causal (the default config: p_cvt_asm's top-tested loop). Default: the wait after the 2 row-scale
    exponentials of the rescale arm, the V release after 65 of the 66. early_v_release: both before every exponential;
    the loop's opcode multiset unchanged (a reordering, no added work); uniform pipeline state; 0 LDL/STL."""
    base = _kernel_sass(tmp_path_factory, 128, False, False, pv_wait_mid=False)  # (pv_wait_mid: hd128's default since
    on = _kernel_sass(tmp_path_factory, 128, False, True, pv_wait_mid=False)  # 2026-12-01; early_v_release yields to it)
    lb, lo = _main_loop(base), _main_loop(on)
    wb, rb, nb = _release_after(lb)
    wo, ro, no = _release_after(lo)
    assert (nb, no) == (66, 66)
    assert wb <= 2 and rb >= 60, (wb, rb)  # the default: waits above the exponentials, releases V after them
    assert wo == 0 and ro == 0, (wo, ro)
    assert Counter(o for o, _ in lo) == Counter(o for o, _ in lb)
    assert _vector_state(lo) == 0 == _vector_state(lb)
    assert not any(o == "BSSY" for o, _ in lo)
    assert _spills(on) == 0 == _spills(base)


@needs_nvdisasm
@pytest.mark.compile
@pytest.mark.parametrize("hdim, causal", [(64, False), (64, True), (192, False), (256, False)],
                         ids=["64nc", "64c", "192nc", "256nc"])
def test_v_released_before_the_exponentials_other_head_dims(tmp_path_factory, hdim, causal):
    """The other defaults where it applies (hd128 causal's exp_in_branch and (192, 128) causal's pv_wait_mid take
    precedence): the V release before every exponential, same opcodes within 4 instructions, 0 LDL/STL. At hd64
    causal (one loop, mask branch) the default waits for P V after all its exponentials: there this moves the wait
    up as well, a different trade (the notes)."""
    base = _kernel_sass(tmp_path_factory, hdim, causal, False)
    on = _kernel_sass(tmp_path_factory, hdim, causal, True)
    lb, lo = _main_loop(base), _main_loop(on)
    _, ro, no = _release_after(lo)
    _, rb, nb = _release_after(lb)
    assert no == nb and ro == 0 and rb >= nb // 2, (ro, rb, nb)
    cb, co = Counter(o for o, _ in lb), Counter(o for o, _ in lo)
    assert sum(((cb - co) + (co - cb)).values()) <= 4, (cb - co, co - cb)
    assert _vector_state(lo) == _vector_state(lb)
    assert _spills(on) == 0
