"""SASS structure of the sm90 forward kernel, from cubins compiled on the CPU (CUTE_DSL_ARCH=sm_90a).

Checks that the mechanisms are really in the machine code: wgmma (HGMMA), TMA loads/stores (UTMALDG /
UTMASTG), the exp2 split (MUFU.EX2 count falls and FFMA count rises with exp2_emu_fraction; no F2I / FRND,
which would put the software exp2 back on the MUFU pipe; no clamp FMNMX; a pinned instruction cost per emulated
exponential; sixteenths compile exactly at tile_n 128), the tau decision (a warp vote only when tau > 0),
no local-memory spills (LDL / STL) in the default configs, and a main loop without mask decisions (causal: a loop
over the diagonal key blocks, then a steady-state loop with no mask code).
"""
from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, fwd_sass, opcode_counts  # noqa: E402

pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip nvidia-cuda-nvdisasm)")]

_CACHE: dict = {}


def sass_counts(tmp_path_factory, hdim=128, causal=False, dtype="bfloat16", **switches):
    key = (hdim, causal, dtype, tuple(sorted(switches.items())))
    if key not in _CACHE:
        cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
        hdim_v = 128 if hdim == 192 else hdim
        workdir = str(tmp_path_factory.mktemp("sass"))
        _CACHE[key] = opcode_counts(fwd_sass(cfg, dtype, hdim, hdim_v, causal, workdir))
    return _CACHE[key]


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
    on = sass_counts(tmp_path_factory, rescale_threshold=8.0)
    off = sass_counts(tmp_path_factory, rescale_threshold=0.0)
    assert count(on, "VOTE") > 0
    assert count(off, "VOTE") == 0
    assert on != off


@pytest.mark.parametrize("hdim,causal", [(64, False), (128, False), (128, True), (256, False)])
def test_no_spills_in_default_configs(tmp_path_factory, hdim, causal):
    c = sass_counts(tmp_path_factory, hdim=hdim, causal=causal)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0, {k: v for k, v in c.items() if k.startswith(("LDL", "STL"))}


# ---- main-loop structure: key blocks walked in separate masked / unmasked loops (issue 11 point 3) ----------------
_SASS_TEXT: dict = {}
_INSN_AT = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)([^;]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")


def sass_text(tmp_path_factory, hdim=128, causal=False, **switches):
    key = (hdim, causal, tuple(sorted(switches.items())))
    if key not in _SASS_TEXT:
        cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
        hdim_v = 128 if hdim == 192 else hdim
        _SASS_TEXT[key] = fwd_sass(cfg, "bfloat16", hdim, hdim_v, causal, str(tmp_path_factory.mktemp("sass")))
    return _SASS_TEXT[key]


def gemm_loops(sass: str) -> list[list[tuple[str, str]]]:
    """Bodies (lists of (opcode, operands)) of the innermost loops that issue wgmma (the key-block loops; not the
    persistent kernel's tile loop around them), in code order. A loop is a predicated backward BRA (not .U.ANY, whose
    tiny loops are elect/retry idioms; the out-of-line mbarrier retry stubs branch back unpredicated)."""
    insns, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = _INSN_AT.search(line)
        if m:
            insns.append((m.group(2), m.group(3), m.group(4)))
    spans = []
    for i, (pred, op, rest) in enumerate(insns):
        t = re.search(r"\((\.L_x_\d+)\)", rest)
        if op == "BRA" and pred and t and labels.get(t.group(1), len(insns)) <= i:
            spans.append((labels[t.group(1)], i))
    def has_gemm(span):
        return any(op.startswith("HGMMA") for _, op, _ in insns[span[0]:span[1] + 1])

    gemm = [sp for sp in spans if has_gemm(sp)]
    inner = [sp for sp in gemm if not any(o != sp and sp[0] <= o[0] and o[1] <= sp[1] for o in gemm)]
    return [[(op, rest) for _, op, rest in insns[a:b + 1]] for a, b in sorted(set(inner))]


def _mask_ops(body) -> int:
    """Instructions that select -inf (the mask, and the softmax's guards for rows that saw no key yet)."""
    return sum(1 for op, rest in body if "-INF" in rest or op.startswith("FSEL"))


@pytest.mark.parametrize("hdim,causal,switches", [
    (128, False, {}), (128, True, {}), (64, True, {}), (256, True, {}), (192, True, {}),
    (128, True, {"intra_wg_overlap": False}), (64, True, {"exp2_emu_fraction": 0.25}), (64, False, {"pingpong": False}),
    (128, True, {"persistent": True}), (128, False, {"persistent": True}), (64, True, {"persistent": True})])
def test_steady_state_loop_has_no_mask_code(tmp_path_factory, hdim, causal, switches):
    """Non-causal: one main loop, mask-free (the ragged last key block is the first one walked, outside the loop).
    Causal: two, the diagonal blocks' loop (mask selects, one per S element) then a mask-free steady-state loop
    with the same GEMMs and exponentials and no per-iteration decision."""
    loops = gemm_loops(sass_text(tmp_path_factory, hdim, causal, **switches))
    assert len(loops) == (2 if causal else 1), [len(b) for b in loops]
    steady = loops[-1]
    assert _mask_ops(steady) == 0, [(op, r) for op, r in steady if "-INF" in r or op.startswith("FSEL")][:8]
    if causal:
        masked = loops[0]
        n_s = 2 * AttnConfig(**switches).resolve("sm90", hdim, causal).tile_n // 4  # S elements per thread
        assert _mask_ops(masked) >= n_s
        hg = lambda b: sum(op.startswith("HGMMA") for op, _ in b)  # noqa: E731
        ex2 = lambda b: sum(op == "MUFU.EX2" for op, _ in b)  # noqa: E731
        assert hg(masked) == hg(steady) and ex2(masked) == ex2(steady)
        assert len(steady) < len(masked)


def outer_gemm_loops(sass: str) -> list[list[str]]:
    """Opcodes of the outermost loops that issue wgmma (persistent: the tile loop)."""
    insns, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = _INSN_AT.search(line)
        if m:
            insns.append((m.group(2), m.group(3), m.group(4)))
    spans = []
    for i, (pred, op, rest) in enumerate(insns):
        t = re.search(r"\((\.L_x_\d+)\)", rest)
        if op == "BRA" and pred and t and labels.get(t.group(1), len(insns)) <= i:
            spans.append((labels[t.group(1)], i))
    gemm = [sp for sp in spans if any(op.startswith("HGMMA") for _, op, _ in insns[sp[0]:sp[1] + 1])]
    outer = [sp for sp in gemm if not any(o != sp and o[0] <= sp[0] and sp[1] <= o[1] for o in gemm)]
    return [[op for _, op, _ in insns[a:b + 1]] for a, b in sorted(set(outer))]


@pytest.mark.parametrize("hdim,causal", [(128, False), (128, True), (64, True)])
def test_persistent_kernel_walks_tiles(tmp_path_factory, hdim, causal):
    """persistent=True wraps the key-block loops, the Q load wait and the epilogue's O store in one tile loop, with the
    same key-block loops inside and no spills; the default (persistent off) has no loop around the key-block loops."""
    off = sass_text(tmp_path_factory, hdim, causal)
    on = sass_text(tmp_path_factory, hdim, causal, persistent=True)
    assert len(gemm_loops(on)) == len(gemm_loops(off)) == (2 if causal else 1)
    assert all(not any(op.startswith("UTMASTG") for op in body) for body in outer_gemm_loops(off))
    tile_loops = [body for body in outer_gemm_loops(on) if any(op.startswith("UTMASTG") for op in body)]
    assert len(tile_loops) == 1
    c_on = opcode_counts(on)
    assert count(c_on, "LDL") == 0 and count(c_on, "STL") == 0
