"""AttnConfig.pv_wait_mid (sm90 forward, overlapped loop, tau > 0; opt-in, GPU-untested; notes: /work/notes/fwd_s9.md).

Found by comparing the (192, 128) causal SASS with official FA4's sm90 forward (4.0.0b36, compiled here for sm_90a):
both mask-free loops issue the same 12 + 8 HGMMA and 66 MUFU.EX2, but official waits for its in-flight P V GEMM after 11
of the exponentials and releases the V stage right there, while ours (causal_split + rescale_before_pv, the default)
waits before all of them (ptxas hoists the wait to the top of the block after the tau decision) and releases V after
65 of 66. pv_wait_mid computes the first quarter of every row's exponentials inside both arms of the tau decision, so
the wait lands in the block after them, writes the V release right after the wait, and converts P by inline PTX
(p_cvt_asm's conversion) so the conversions interleave with the remaining exponentials.

These CPU tests check the machine code: the P V wait and the V release among the exponentials (not above or below all
of them), <= 4 F2FP after the last exponential, pipeline state in uniform registers, 0 local-memory spills, and the
kernel without it unchanged (config hash; tests/test_fwd_loop_shape.py and scripts/sass_identity.py for the SASS).
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402
from test_fwd_loop_shape import _sass  # noqa: E402  (one SASS cache for the forward loop-shape files)
from config_pairs import check_default_pair  # noqa: E402
from test_fwd_p_cvt_asm import _main_loop, _spills, _vector_state  # noqa: E402


# ---- the field (no compile) -----------------------------------------------------------------------------------------
def test_pv_wait_mid_default_only_at_192_causal_and_hashes():
    """None resolves to DEFAULTS' (on at (192, 128) causal and hd128 non-causal); None and False leave it out of to_dict (the hash of
    before the field); True is its own config."""
    check_default_pair("pv_wait_mid", ((192, True), (128, False)))  # DEFAULTS' pairs


# validation (None / bool, sm90 only) and the forward-only compiled config: tests/test_fwd_loop_shape.py FIELDS


def test_kernel_takes_it_with_the_overlapped_loop_and_tau_only():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    k = FlashFwdSm90(bf, 192, 128, True, pv_wait_mid=True, exp_in_branch=True)
    assert k.pv_wait_mid and k.p_inline_cvt and not k.p_cvt_asm and not k.exp_in_branch  # exp_in_branch yields
    assert k.pv_head_cols == 8 and k.causal_split  # a quarter of a row's 32 columns at tile_n 128; split implied
    assert not FlashFwdSm90(bf, 192, 128, False, pv_wait_mid=True).causal_split  # (causal only)
    assert FlashFwdSm90(bf, 256, 256, False, tile_n=80, pv_wait_mid=True).pv_head_cols == 4
    assert not FlashFwdSm90(bf, 128, 128, False, pv_wait_mid=True, intra_wg_overlap=False).pv_wait_mid
    assert not FlashFwdSm90(bf, 128, 128, False, pv_wait_mid=True, rescale_threshold=0.0).pv_wait_mid
    plain = FlashFwdSm90(bf, 128, 128, False)
    assert not plain.pv_wait_mid and not plain.p_inline_cvt


# ---- SASS ----------------------------------------------------------------------------------------------------------
needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")


def _wait_and_release(body):
    """(MUFU.EX2 before the loop's wait for every wgmma (the in-flight P V), MUFU.EX2 after the V release (the last
    mbarrier arrive of the body), all MUFU.EX2) in address order; the branch arms of the tau decision both count."""
    ops = [(o, r.strip()) for o, r in body]
    ex2 = [i for i, (o, _) in enumerate(ops) if o == "MUFU.EX2"]
    wait = next(i for i, (o, r) in enumerate(ops) if o == "WARPGROUP.DEPBAR.LE" and r.endswith("0x0"))
    release = max(i for i, (o, _) in enumerate(ops) if o.startswith("SYNCS.ARRIVE"))
    return sum(i < wait for i in ex2), sum(i > release for i in ex2), len(ex2)


def _f2fp_after_last_ex2(body) -> int:
    ops = [o for o, _ in body]
    last = max(i for i, o in enumerate(ops) if o == "MUFU.EX2")
    return sum(o.startswith("F2FP") for o in ops[last:])


@needs_nvdisasm
@pytest.mark.compile
def test_pv_wait_among_the_exponentials_192_causal(tmp_path_factory):
    """(192, 128) causal with causal_split + rescale_before_pv (the default from 2026-12-01 to 2026-12-03; the default
    since runs without rescale_before_pv: test_pv_wait_mid_192_causal_default), mask-free loop. pv_wait_mid=False
    (the default before 2026-12-01): the P V wait after the 2 row-scale exponentials of the rescale arm, i.e. before
    all 64 of the block, and the V stage released after all but one. pv_wait_mid (the default since): 16 more static
    EX2 (the head quarter of both rows in both arms), the wait after both arms' head exponentials and before >= 32 of
    the rest, the V release before >= 32 as well; P's conversions among the exponentials (<= 4 F2FP after the last);
    same HGMMA; uniform pipeline state; 0 LDL/STL."""
    base = _sass(tmp_path_factory, 192, True, pv_wait_mid=False, rescale_before_pv=True)
    on = _sass(tmp_path_factory, 192, True, rescale_before_pv=True)  # resolves to pv_wait_mid=True (the hash test above)
    lb, lo = _main_loop(base), _main_loop(on)
    wb, rb, nb = _wait_and_release(lb)
    wo, ro, no = _wait_and_release(lo)
    assert (nb, no) == (66, 82)
    assert wb <= 2 and rb <= 2  # default: waits above the block's exponentials, releases V after them
    assert wo >= 34 and no - wo >= 32, (wo, no)  # 2 + 2 x 16 in the arms (+ a few ptxas moves up), >= half after
    assert ro >= 32, ro  # V released right after the wait, not after the exponentials
    assert sum(o.startswith("HGMMA") for o, _ in lo) == sum(o.startswith("HGMMA") for o, _ in lb) == 20
    assert _f2fp_after_last_ex2(lo) <= 4
    assert _vector_state(lo) == 0 == _vector_state(lb)
    assert _spills(on) == 0 == _spills(base)


@needs_nvdisasm
@pytest.mark.compile
@pytest.mark.parametrize("hdim, causal, extra", [(64, True, {}), (64, False, {}),
                                                 (128, False, {}), (192, False, {}), (256, False, {})],
                         ids=["64c", "64nc", "128nc", "192nc", "256nc"])
def test_pv_wait_mid_other_head_dims(tmp_path_factory, hdim, causal, extra):
    """hd64 causal (split: pv_wait_mid implies causal_split, the one-loop causal kernels turn divergent with it,
    pipeline state in vector registers), the non-causal defaults (hd64 192 x 128 tiles at 160 registers, (192, 128)
    128 x 128, hd256 tile_n 80; p_cvt_asm's top-tested loop): the wait and the V release among the exponentials,
    <= 4 F2FP after the last, uniform pipeline state, 0 LDL/STL."""
    on = _sass(tmp_path_factory, hdim, causal, pv_wait_mid=True, **extra)
    assert _spills(on) == 0
    body = _main_loop(on)
    cols = AttnConfig(pv_wait_mid=True, **extra).resolve("sm90", hdim, causal).tile_n // 4  # a thread's row
    head = cols // 4 // 2 * 2
    w, r, n = _wait_and_release(body)
    assert n == 2 + 2 * cols + 2 * head  # the row scales, the block, the head quarter again (both arms)
    assert w >= 2 + 4 * head and n - w >= cols - head and r >= cols - head, (w, r, n)
    assert _f2fp_after_last_ex2(body) <= 4
    assert _vector_state(body) == 0
    assert not any(o == "BSSY" for o, _ in body)


@needs_nvdisasm
@pytest.mark.compile
def test_pv_wait_mid_192_causal_default(tmp_path_factory):
    """The (192, 128) causal default since 2026-12-03 (causal_split + pv_wait_mid, no rescale_before_pv: 1.03-1.04x the
    kernel with it on the H200), mask-free loop: the P V wait among the exponentials as with rescale_before_pv, but
    ptxas sinks the V release below all but a few of them (with rescale_before_pv it came before >= 32: the test
    above). Pinned so that a change of either shows here; 0 LDL/STL, uniform pipeline state."""
    on = _sass(tmp_path_factory, 192, True)
    assert AttnConfig().resolve("sm90", 192, True).rescale_before_pv is False
    body = _main_loop(on)
    w, r, n = _wait_and_release(body)
    assert n == 82 and w >= 34 and n - w >= 24, (w, r, n)
    assert r <= 8, (w, r, n)  # V released after the exponentials (a measured default: early release untried here)
    assert _f2fp_after_last_ex2(body) <= 4
    assert _vector_state(body) == 0
    assert _spills(on) == 0
