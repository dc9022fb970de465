"""SASS structure of the sm90 forward kernel, from cubins compiled on the CPU (CUTE_DSL_ARCH=sm_90a).

Checks that the mechanisms are really in the machine code: wgmma (HGMMA), TMA loads/stores (UTMALDG /
UTMASTG), the exp2 split (MUFU.EX2 count falls and FFMA count rises with exp2_emu_fraction; no F2I / FRND,
which would put the software exp2 back on the MUFU pipe; no clamp FMNMX; a pinned instruction cost per emulated
exponential; sixteenths compile exactly at tile_n 128), the tau decision (a warp vote only when tau > 0),
no local-memory spills (LDL / STL) in the default configs, and ``rescale_before_pv``: the O rescale (FMUL) leaves the
main loop's tail after the last exponential (the steady-state loop: the shortest backward branch around HGMMA and
MUFU.EX2), with the same GEMMs, exponentials and tau vote, and no spills.
"""
from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, instructions, opcode_counts  # noqa: E402
from sass_cache import fwd_sass  # noqa: E402  (tests/sass_cache.py: one compile per kernel in the session)


pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip nvidia-cuda-nvdisasm)")]

_CACHE: dict = {}


def sass_text(tmp_path_factory, hdim=128, causal=False, dtype="bfloat16", **switches) -> str:
    """The forward's SASS with these switches, speculative_exp off unless given (``speculative_exp=None``: the
    default's): these tests read the eager step's loop (the exp2 split, the O rescale), to which speculation, the
    hd 64 / 128 / (192, 128) default since session 52, gives way only where they turn it off
    (tests/test_fwd_speculative_exp.py reads its loop)."""
    switches.setdefault("speculative_exp", False)
    key = (hdim, causal, dtype, tuple(sorted(switches.items())))
    if key not in _CACHE:
        cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
        hdim_v = 128 if hdim == 192 else hdim
        workdir = str(tmp_path_factory.mktemp("sass"))
        _CACHE[key] = fwd_sass(cfg, dtype, hdim, hdim_v, causal, workdir)
    return _CACHE[key]


def sass_counts(tmp_path_factory, hdim=128, causal=False, dtype="bfloat16", **switches):
    return opcode_counts(sass_text(tmp_path_factory, hdim, causal, dtype, **switches))


def main_loop(sass: str) -> list[str]:
    """Opcodes of the steady-state main loop: the shortest range closed by a backward branch that holds both HGMMA and
    MUFU.EX2 (the mbarrier retry branches jump further back and span more)."""
    insns, labels = instructions(sass)
    best = None
    for i, (addr, op, args) in enumerate(insns):
        target = re.search(r"\.L_x_\d+", args) if op.startswith("BRA") else None
        if target is None or labels[target.group(0)] > addr:
            continue
        start = next(j for j, x in enumerate(insns) if x[0] == labels[target.group(0)])
        body = [x[1] for x in insns[start:i + 1]]
        if any(o.startswith("HGMMA") for o in body) and "MUFU.EX2" in body and (best is None or len(body) < len(best)):
            best = body
    assert best is not None, "no loop with HGMMA and MUFU.EX2 found"
    return best


def after_last_exp2(body: list[str]) -> list[str]:
    return body[len(body) - body[::-1].index("MUFU.EX2"):]


def test_wgmma_and_tma_present(tmp_path_factory):
    c = sass_counts(tmp_path_factory)
    assert count(c, "HGMMA") > 0
    assert count(c, "UTMALDG") > 0
    assert count(c, "UTMASTG") > 0


def test_exp2_split_moves_work_from_mufu_to_fma(tmp_path_factory):
    fracs = (0.0, 0.25, 1.0)
    cs = [sass_counts(tmp_path_factory, hdim=64, exp2_emu_fraction=f) for f in fracs]
    mufu = [count(c, "MUFU.EX2") for c in cs]
    ffma = [count(c, "FFMA") for c in cs]
    assert mufu[0] > mufu[1] > mufu[2], mufu
    assert ffma[0] < ffma[1] < ffma[2], ffma
    # fully emulated: the only EX2 left are the per-row rescale factors (a handful), not the 64 per block
    assert mufu[2] < mufu[0] / 8, mufu
    for c in cs:
        assert count(c, "F2I") == 0 and count(c, "FRND") == 0, "float->int conversion on the MUFU pipe"


def _emu_cost(c, c0):
    """(MUFU.EX2 removed, extra FFMA+FADD+FMNMX, extra instructions of any kind) of counts c over fraction-0 counts c0."""
    saved = count(c0, "MUFU.EX2") - count(c, "MUFU.EX2")
    fp = sum(count(c, g) - count(c0, g) for g in ("FFMA", "FADD", "FMNMX"))
    return saved, fp, sum(c.values()) - sum(c0.values())


def test_software_exp2_cost_per_emulated_exponential(tmp_path_factory):
    """The clamp-free polynomial with the scale folded in: per MUFU.EX2 removed, exactly one FFMA.SAT (clamp + scale +
    row offset in the FFMA that computed x), no FMNMX (the old clamp), no F2I / FRND, and at most 6 extra FFMA/FADD
    (t, d, f, 3 Horner) plus the per-row offset (one FFMA per row and softmax copy). The old scheme cost 7
    (FMNMX, 3 FADD, 3 FFMA) and ~6.8 instructions in all per exponential; these bounds fail if that comes back."""
    c0 = sass_counts(tmp_path_factory, hdim=64, exp2_emu_fraction=0.0)
    per_thread = count(c0, "MUFU.EX2") - 2  # 2 rows x 32 columns x 2 softmax copies (+2 rescale exps)
    assert count(c0, "FFMA.SAT") == 0  # fraction 0 compiles the emulation out
    for frac in (0.0625, 0.25, 1.0):
        c = sass_counts(tmp_path_factory, hdim=64, exp2_emu_fraction=frac)
        saved, fp, total = _emu_cost(c, c0)
        assert saved == round(frac * per_thread), (frac, saved)
        assert count(c, "F2I") == 0 and count(c, "FRND") == 0, frac
        assert count(c, "FMNMX") == count(c0, "FMNMX"), (frac, "a clamp FMNMX is back in the software exp2")
        assert count(c, "FFMA.SAT") == saved, (frac, "the clamp is no longer folded into one FFMA.SAT")
        assert fp <= 6 * saved + 4, (frac, fp / saved)  # 4 = per-row offset: 2 rows x 2 softmax copies
        if frac == 1.0:  # all instructions, integer bookkeeping included (was 6.83 per exponential)
            assert total <= 6.25 * saved, total / saved


def test_exp2_fraction_in_sixteenths(tmp_path_factory):
    """tile_n 128 (hd64 and hd128 defaults) has 16 fragments per row: 1/16 and 3/16 compile exactly and say so."""
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.exp2 import compiled_fraction

    for frac in (0.0625, 0.1875):
        cfg = AttnConfig(exp2_emu_fraction=frac).resolve("sm90", 64, False)
        k = make_fwd_kernel(cfg, "bfloat16", 64, 64, False)
        assert k.n_frag == 16 and k.exp2_emu_fraction_compiled == frac == compiled_fraction(16, frac)
    c0 = sass_counts(tmp_path_factory, hdim=64, exp2_emu_fraction=0.0)
    c = sass_counts(tmp_path_factory, hdim=64, exp2_emu_fraction=0.1875)
    assert _emu_cost(c, c0)[0] == 3 * 8  # 3 of 16 fragments: 3 x 2 columns x 2 rows x 2 softmax copies


def test_tau_decision_is_a_warp_vote(tmp_path_factory):
    """tau > 0 adds a warp vote (VOTE) per block; with p_cvt_asm (the non-causal default) the K/V loop's exit test is
    one more, so there: more votes with tau than without."""
    on = sass_counts(tmp_path_factory, rescale_threshold=8.0, p_cvt_asm=False)
    off = sass_counts(tmp_path_factory, rescale_threshold=0.0, p_cvt_asm=False)
    assert count(on, "VOTE") > 0
    assert count(off, "VOTE") == 0
    assert on != off
    on_p = sass_counts(tmp_path_factory, rescale_threshold=8.0)
    off_p = sass_counts(tmp_path_factory, rescale_threshold=0.0)
    assert count(on_p, "VOTE") > count(off_p, "VOTE")


@pytest.mark.parametrize("hdim,causal", [(64, False), (128, False), (128, True), (192, False), (192, True), (256, False)])
def test_no_spills_in_default_configs(tmp_path_factory, hdim, causal):
    # the default, speculation included
    c = sass_counts(tmp_path_factory, hdim=hdim, causal=causal, speculative_exp=None)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0, {k: v for k, v in c.items() if k.startswith(("LDL", "STL"))}


HDIMS = [(64, False), (64, True), (128, False), (128, True), (192, False), (192, True), (256, False), (256, True)]


@pytest.mark.parametrize("hdim,causal", HDIMS)
def test_rescale_before_pv_moves_the_o_rescale_out_of_the_tail(tmp_path_factory, hdim, causal):
    """AttnConfig(rescale_before_pv=True): the FMULs that rescale O (hdim_v / 2 per thread) are no longer after the
    last exponential of the main loop but before the next block's P V (H200 / CPU at (192, 128) non-causal: 110
    instructions after the last MUFU.EX2 -> 11); same GEMMs, exponentials and tau vote; no spills (0 LDL / STL).
    The default keeps its rescale after the exponentials (its SASS: scripts/sass_identity.py, 0 differ)."""
    from kernels.config import table_defaults

    # the table's tile (the kernel measured with it), not a conf/tuned/ one: the tuned (192, 128) non-causal tile
    # (tile_m 192 at 160 registers) spills one register with the field on (1 LDL + 1 STL)
    tile = {k: v for k, v in table_defaults("sm90", hdim, causal, tuned=False).items()
            if k in ("tile_m", "tile_n", "num_stages", "consumer_regs", "producer_regs")}
    # p_cvt_asm off (on by default non-causal since 2026-12-01): the field's effect on the plain loop, as measured
    tile["p_cvt_asm"] = False
    base = sass_text(tmp_path_factory, hdim=hdim, causal=causal, rescale_before_pv=False, **tile)  # (192, 128) causal's default: on
    on = sass_text(tmp_path_factory, hdim=hdim, causal=causal, rescale_before_pv=True, **tile)
    cb, co = opcode_counts(base), opcode_counts(on)
    assert count(co, "LDL") == 0 and count(co, "STL") == 0, {k: v for k, v in co.items() if k.startswith(("LDL", "STL"))}
    for op in ("HGMMA", "MUFU.EX2", "VOTE", "UTMALDG"):
        assert count(co, op) == count(cb, op), op
    assert count(co, "VOTE") > 0  # tau > 0 by default: the decision is still a warp vote
    hdim_v = 128 if hdim == 192 else hdim
    lb, lo = main_loop(base), main_loop(on)
    tail_b, tail_o = after_last_exp2(lb), after_last_exp2(lo)
    assert tail_b.count("FMUL") >= hdim_v // 2, (len(tail_b), tail_b.count("FMUL"))
    assert tail_o.count("FMUL") == 0, tail_o
    assert lo.count("FMUL") >= lb.count("FMUL")  # the rescale is still in the loop, earlier
    assert len(tail_o) <= len(tail_b) - hdim_v // 4, (len(tail_b), len(tail_o))  # hd64 causal: 82 -> 51
    assert sum(o.startswith("BRA") for o in lo) < sum(o.startswith("BRA") for o in lb)  # no rescale branch
    if (hdim, causal) == (192, False):  # the candidate's measurement (7f04666): 110 -> 11 after the last MUFU.EX2
        assert len(tail_o) <= 16 and len(tail_b) >= 96, (len(tail_b), len(tail_o))


def test_rescale_before_pv_compiles_with_every_forward_variant(tmp_path_factory):
    """The field with pingpong off, tau 0, the exp2 split, persistent and the cluster: 0 spills, O rescaled before PV."""
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    with pytest.raises(ValueError, match="rescale_before_pv=True with intra_wg_overlap=False"):
        FlashFwdSm90(cutlass.BFloat16, 128, 128, False, intra_wg_overlap=False, rescale_before_pv=True)
    assert not FlashFwdSm90(cutlass.BFloat16, 128, 128, False).rescale_before_pv
    for sw in (dict(pingpong=False), dict(rescale_threshold=0.0), dict(exp2_emu_fraction=0.25), dict(persistent=True),
               dict(cluster_m=2)):
        c = sass_text(tmp_path_factory, hdim=128, causal=False, rescale_before_pv=True, **sw)
        co = opcode_counts(c)
        assert count(co, "LDL") == 0 and count(co, "STL") == 0, sw
        assert after_last_exp2(main_loop(c)).count("FMUL") == 0, sw
