"""AttnConfig.speculative_exp (sm90 forward, overlapped loop, tau > 0; the hd 64 / 128 / (192, 128) default since
session 52, measured on an H100): a later block's P
with the kept row maxima and no maxima taken; S computed again and the eager step only when a partial row sum in the
warpgroup comes near 2^tau and a second vote finds a P itself near it (kernels/sm90/fwd.py softmax_spec, softmax.py
exp_kept_max / p_exceeds / warpgroup_any).

CPU tests: the field (dict / hash while off, sm100 refuses it, forward-only), the kernel switch (off at tau 0 and
without the overlap; the PV-wait placements yield to it), and the machine code of the K/V loop: the first exponential
precedes every FMNMX (no maximum before the exponentials), the warpgroup votes are two BAR.RED, the rare arm adds one
QK^T's HGMMAs, no local memory. GPU checks (bitwise the default's output, the rare arm forced):
tests/test_fwd_speculative_exp_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field, loop_ops  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("speculative_exp")
    assert "speculative_exp" not in AttnConfig(rescale_threshold=0.0).resolve("sm90", 256, False).to_dict()


@pytest.mark.parametrize("hdim", [64, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_default_where_measured_and_left_out_where_the_kernel_drops_it(hdim, causal):
    assert AttnConfig().resolve("sm90", hdim, causal).speculative_exp is True
    assert AttnConfig(speculative_exp=False).resolve("sm90", hdim, causal).speculative_exp is False
    # configs whose kernel would drop it resolve without it (their hash is the one from before the default)
    for off in (dict(rescale_threshold=0.0), dict(rescale_threshold=6.0), dict(exp2_emu_fraction=0.25),
                dict(row_sum_mma=True), dict(intra_wg_overlap=False)):
        cfg = AttnConfig(**off).resolve("sm90", hdim, causal)
        assert "speculative_exp" not in cfg.to_dict(), off
    assert AttnConfig(exp2_emu_fraction=0.03).resolve("sm90", hdim, causal).speculative_exp  # rounds to no fragment


def test_kernel_takes_it_in_the_overlapped_loop_at_positive_tau():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    k = FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, pv_wait_mid=True, early_v_release=True)
    assert k.speculative_exp and not k.pv_wait_mid and not k.early_v_release
    k = FlashFwdSm90(bf, 128, 128, True, speculative_exp=True, exp_in_branch=True)
    assert not k.exp_in_branch and k.causal_split  # causal: implied (the diagonal loop runs the eager step)
    assert not FlashFwdSm90(bf, 128, 128, True, speculative_exp=True, window_left=64).causal_split
    # a sliding window: one loop of masked and mask-free blocks (no split to run the masked ones eagerly): off
    assert not FlashFwdSm90(bf, 64, 64, True, speculative_exp=True, window_left=64).speculative_exp
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, window_left=64, window_right=0).speculative_exp
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, rescale_threshold=0.0).speculative_exp
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, intra_wg_overlap=False).speculative_exp
    # the exp2 polynomial (-0.0 past x = 129: no sum sees it), row_sum_mma (no sums), 2^tau < tile_n (ordinary sums)
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, exp2_emu_fraction=0.25).speculative_exp
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, row_sum_mma=True).speculative_exp
    assert not FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, rescale_threshold=6.0).speculative_exp
    assert FlashFwdSm90(bf, 256, 256, False, tile_n=80, speculative_exp=True, rescale_threshold=6.5).speculative_exp
    # pv_wait_mid's inline P conversion (and its split) stay
    k = FlashFwdSm90(bf, 192, 128, True, speculative_exp=True, pv_wait_mid=True)
    assert k.causal_split and k.p_inline_cvt and not k.pv_wait_mid


def _loop(hdim, causal, spec, tmp_path):
    # (the warpgroup's votes: spec_warp_redo, hd64's default since session 64, votes per warp: its own tests)
    cfg = AttnConfig(speculative_exp=spec, spec_warp_redo=False).resolve("sm90", hdim, causal)
    return loop_ops(cfg, hdim, causal, str(tmp_path / f"{hdim}{causal}{spec}"))


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (128, True), (256, False), (192, True)])
def test_exponentials_start_before_any_maximum(hdim, causal, tmp_path):
    base, spec = _loop(hdim, causal, False, tmp_path), _loop(hdim, causal, True, tmp_path)
    assert base.index("FMNMX") < base.index("MUFU.EX2")  # the default: the row maxima come first
    assert spec.index("MUFU.EX2") < spec.index("FMNMX")  # speculative: the exponentials do
    assert sum(o.startswith("BAR.RED") for o in spec) == 2  # the warpgroup's votes: on the sums, then on the P
    hgmma = lambda ops: sum(o.startswith("HGMMA") for o in ops)  # noqa: E731
    assert hgmma(spec) == hgmma(base) + hdim // 16  # the rare arm's QK^T (k16 steps over the head dim)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim", [64, 256])
def test_causal_diagonal_loop_stays_eager(hdim, tmp_path):
    """Causal: the split is implied; the diagonal blocks (where a row can still lack a maximum, which the vote would
    answer with a second QK^T) run the eager step in their own loop, the mask-free blocks speculate. Both loops uniform
    (no R2UR; hd256's one speculative loop had 90), no local memory."""
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops
    from sass_cache import fwd_sass

    sass = fwd_sass(AttnConfig(speculative_exp=True).resolve("sm90", hdim, True), "bfloat16", hdim, hdim, True,
                    str(tmp_path))
    assert count(opcode_counts(sass), "LDL") == 0
    loops = [[o for o, _ in body] for body in steady_state_loops(sass)]
    assert len(loops) == 2
    diag, free = loops
    assert not any(o.startswith("BAR.RED") for o in diag) and diag.index("FMNMX") < diag.index("MUFU.EX2")
    assert free.index("MUFU.EX2") < free.index("FMNMX")
    # the free loop's two votes: over the warpgroup (hd256), or over each warp (hd64's spec_warp_redo since session 64:
    # the diagonal loop's 2 warp votes, its exit test and rescale vote, and 2 more; with p_cvt_asm + p_before_vote but
    # not it, hd64 causal had 2 R2UR per loop)
    warp = hdim == 64
    assert sum(o.startswith("BAR.RED") for o in free) == (0 if warp else 2)
    assert sum(o.startswith("VOTE") for o in free) >= sum(o.startswith("VOTE") for o in diag) + (2 if warp else 0)
    assert not any(o.startswith("R2UR") for o in diag + free)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (128, False), (256, False), (192, True)])
def test_common_path_is_shorter(hdim, causal, tmp_path):
    """The mask-free loop's common path (kernels.sm90.sass.loop_common_paths: every guarded branch on its cheaper
    side, i.e. no rescale, no second QK^T) issues at least 10% fewer instructions than the default's (session 51:
    hd64 324 / 379, hd128 321 / 381, hd256 287 / 326 with the sums pinned, 325 without; (192, 128) causal 366 / 448).
    hd256's default has the lazy row maxima since session 59, whose path is already shorter: 287 / 318, at least 9%."""
    from kernels.sm90.sass import loop_common_paths
    from sass_cache import fwd_sass

    def common(spec):
        cfg = AttnConfig(speculative_exp=spec).resolve("sm90", hdim, causal)
        return loop_common_paths(fwd_sass(cfg, "bfloat16", hdim, 128 if hdim == 192 else hdim, causal,
                                          str(tmp_path / str(spec))))[-1]

    base, spec = common(False), common(True)
    assert spec <= (0.91 if hdim == 256 else 0.9) * base, (spec, base)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen", [(64, True, 1024), (128, False, 32768), (192, True, 4096),
                                                (256, False, 16384), (256, True, 4096)],
                         ids=["hd64_causal_1k_128row_persistent", "hd128_split_tail", "192_causal_greedy",
                              "hd256_split_tail", "hd256_causal_greedy"])
def test_default_calls_speculate_without_spills(hdim, causal, seqlen, tmp_path):
    """The kernels calls run by default (kernels.config.call_config: the persistent tiles and walks of DEFAULTS) compile
    the speculative loop, uniform and spill-free: hd64 causal <= 1k (128-row persistent tiles, not timed with it),
    hd128 non-causal (the persistent split tail), (192, 128) causal (the greedy walk), hd256 both (since session 59;
    non-causal, kernels.interface runs the split tail per call where split_tail_pays: asked for here)."""
    from kernels.config import call_config
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops
    from sass_cache import kernel_sass

    cfg = AttnConfig(persistent=True if hdim == 256 and not causal else None).resolve("sm90", hdim, causal)
    cfg = call_config(cfg, "sm90", hdim, causal, seqlen)
    assert cfg.persistent and (cfg.split_tail or causal)
    kern = make_fwd_kernel(cfg, "bfloat16", hdim, 128 if hdim == 192 else hdim, causal)
    assert kern.speculative_exp
    sass = kernel_sass(kern, str(tmp_path))
    c = opcode_counts(sass)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    loops = [[o for o, _ in body] for body in steady_state_loops(sass)]
    # the speculating (mask-free) loop's two votes: over the warpgroup, or (spec_warp_redo, hd64) over each warp
    votes = sum(o.startswith("BAR.RED") for o in loops[-1])
    assert votes == (0 if kern.spec_warp_redo else 2) and kern.spec_warp_redo == (hdim == 64)
    assert sum(o.startswith("VOTE.ANY") for o in loops[-1]) >= (2 if kern.spec_warp_redo else 0)
    r2ur = [sum(o == "R2UR" for o in body) for body in loops]
    # hd128 non-causal since session 63 (p_before_vote): 3 in the speculating loop (the K pipeline state moved from
    # vector to uniform registers per block) and 1 in the other (CPU SASS); the kernel measured 1.018x the one before
    # with them (H100)
    pbv = hdim == 128 and not causal
    assert r2ur[-1] == (3 if pbv else 0), r2ur
    # hd256's split tail has 5 in its 1014-instruction outer loop with speculative_exp off too (session 59)
    assert sum(r2ur) <= (5 if hdim == 256 and not causal else 4 if pbv else 0), r2ur
