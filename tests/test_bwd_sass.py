"""SASS checks of the sm90 backward main kernel (compiled on the CPU for sm_90a, disassembled with nvdisasm).

deterministic=True must contain the ordering (a strong acquire load in a spin loop, a release add on the
semaphore, a GPU-scope fence) and plain mode must not; two_cta=True must contain the cluster machinery
(multicast TMA, the shared::cta -> shared::cluster bulk copy of dS, cluster barriers) and, as the one-CTA kernel,
bulk-reduce dQ from the writer warp, without spills or serialised wgmma; every variant issues HGMMA; the exp2 fraction decides how many MUFU.EX2 the P recomputation keeps.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import dsl_subprocess  # tests/dsl_subprocess.py

pytestmark = pytest.mark.compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nvdisasm():
    exe = shutil.which("nvdisasm")
    if exe:
        return exe
    try:
        import nvidia  # namespace package of pip nvidia-cuda-nvdisasm

        for base in nvidia.__path__:
            cand = glob.glob(os.path.join(base, "*", "bin", "nvdisasm"))
            if cand:
                return cand[0]
    except ImportError:
        pass
    for c in glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "*", "bin", "nvdisasm")):
        return c
    pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")


def _main_sass(tmp_path, deterministic, frac, causal=True, hdim=128, two_cta=False, det_schedule="spt", tile_m=None,
               hdim_v=None, dtype="bfloat16", extra=""):
    """``extra``: more AttnConfig keyword arguments, as source text (e.g. ``"bwd_lpt_heads=4"``)."""
    tag = re.sub(r"[^A-Za-z0-9]+", "_", extra)
    dump = tmp_path / f"d{int(deterministic)}_{frac}_{int(causal)}_{hdim}_{hdim_v}_{int(two_cta)}_{det_schedule}_{tile_m}_{dtype}{tag}"
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig(deterministic={deterministic}, exp2_emu_fraction={frac}, two_cta={two_cta},
                                    det_schedule={det_schedule!r}, bwd_tile_m={tile_m}, {extra}), {dtype!r}, {hdim},
                         {causal},
                         hdim_v={hdim_v})
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)  # a fork of a warm worker: tests/dsl_subprocess.py
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if "FlashBwdSm90" in c or "FlashBwdWideSm90" in c]
    assert len(cubins) == 1, cubins
    return subprocess.run([_nvdisasm(), "-c", cubins[0]], check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("tile_m,dq_gemm", [(None, "64x80x16"), (64, "64x64x16")])
def test_deterministic_ordering_in_sass(tmp_path, tile_m, dq_gemm):
    """hd128 causal at its default 80-row Q tiles (dQ^T = K^T dS^T: N = 80) and at 64 rows (dQ = dS K)."""
    det = _main_sass(tmp_path, True, 0.0, tile_m=tile_m)
    plain = _main_sass(tmp_path, False, 0.0, tile_m=tile_m, extra="bwd_stream_post=False")  # (no stream counts)
    for sass in (det, plain):
        assert f"HGMMA.{dq_gemm}.F32.BF16" in sass and "HGMMA.64x128x16.F32.BF16" in sass
        assert "UBLKRED.G.S.ADD.F32" in sass  # dQ chunks bulk-reduced into global fp32 by the writer warp
        assert "REDG.E.ADD.F32" not in sass
    # acquire spin: a strong GPU-scope load of the semaphore; release add; fence before it
    assert re.search(r"LDG\.E\.STRONG\.GPU", det)
    assert re.search(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", det)
    assert "MEMBAR.ALL.GPU" in det
    # one GPU fence per release: the fence.acq_rel + relaxed add pattern (a red.release after the fence compiled to
    # a second MEMBAR.ALL.GPU + ERRBAR per Q tile on the writer warp's critical path)
    assert len(re.findall(r"MEMBAR\.ALL\.GPU", det)) == len(re.findall(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", det))
    assert not re.search(r"LDG\.E\.STRONG\.GPU", plain)
    assert "REDG.E.ADD.S32" not in plain


@pytest.mark.parametrize("hdim,causal,tile_m", [(64, True, None), (128, False, None), (128, True, None),
                                                (64, False, 64), (128, True, 64)])
def test_default_configs_have_no_spills(tmp_path, hdim, causal, tile_m):
    """Every default backward config (and the deterministic one, and 64-row tiles: hd64's option, hd128's softcap /
    varlen tile) keeps its working
    set in registers, and the MMA warps store dS with stmatrix, issue no global reduction (the writer warp
    bulk-reduces dQ) and write dK / dV with TMA stores."""
    for det in (False, True):
        sass = _main_sass(tmp_path, det, 0.0, causal=causal, hdim=hdim, tile_m=tile_m)
        assert not re.search(r"\b(LDL|STL)\b", sass), f"spills in hd{hdim} causal={causal} det={det}"
        assert "STSM" in sass and "UBLKRED.G.S.ADD.F32" in sass
        assert not re.search(r"REDG\.E\.ADD\.F32", sass)
        # dK / dV leave by TMA stores from shared memory, never element by element
        assert "UTMASTG" in sass and not re.search(r"\bSTG\.E", sass)
        # the wgmma chains stay asynchronous: ptxas serialises every wgmma (a WARPGROUP.DEPBAR after each HGMMA, 32
        # instead of 4; 20% slower on the H200) when it cannot prove a wait pattern safe
        assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) <= 8, f"serialised wgmma: hd{hdim} causal={causal} det={det}"


@pytest.mark.parametrize("hdim,hdim_v,causal,dtype", [(256, 256, False, "bfloat16"), (256, 256, True, "float16")],
                         ids=["hd256-noncausal-bf16", "hd256-causal-fp16"])
def test_wide_default_configs_have_no_spills(tmp_path, hdim, hdim_v, causal, dtype):
    """hd256 (kernels/sm90/bwd_wide.py; default and deterministic): no spills; P^T and dS^T go to shared memory with
    stmatrix and every dK / dV / dQ GEMM is SS (64 x d/2 per warpgroup); dQ leaves by the writer warp's bulk reductions
    and dK / dV by TMA stores. (192, 128) runs kernels/sm90/bwd_wide192.py: tests/test_bwd_wide192.py."""
    from kernels.sm90.sass import count, opcode_counts

    fp = "F32.BF16" if dtype == "bfloat16" else "F32"
    for det in (False, True):
        sass = _main_sass(tmp_path, det, 0.0, causal=causal, hdim=hdim, hdim_v=hdim_v, dtype=dtype)
        assert not re.search(r"\b(LDL|STL)\b", sass), f"spills in hd({hdim},{hdim_v}) causal={causal} det={det}"
        ops = opcode_counts(sass)
        # S^T / dP^T: 64 K/V rows x 32 Q rows per warpgroup over the head dims; dK: 64 x hdim/2; dV: 64 x hdim_v/2;
        # dQ: 64 x hdim/2 in one GEMM per warpgroup, or two of 64 x 64 at hd256 (each bulk-reduced by the writer)
        pieces = 2 if hdim == 256 else 1
        kinds = {op for op in ops if op.startswith("HGMMA")}
        assert kinds == {f"HGMMA.64x{n}x16.{fp}" for n in (32, hdim // 2, hdim_v // 2, hdim // 2 // pieces)}, kinds
        assert count(ops, "HGMMA") == (hdim + hdim_v) // 16 + (2 + pieces) * 64 // 16
        assert count(ops, "UBLKRED") == 2 * pieces
        assert "STSM" in sass and "UBLKRED.G.S.ADD.F32" in sass and "UTMASTG" in sass
        assert not re.search(r"REDG\.E\.ADD\.F32", sass) and not re.search(r"\bSTG\.E", sass)
        assert "MULTICAST" not in sass
        assert bool(re.search(r"LDG\.E\.STRONG\.GPU", sass)) == det  # the writer warp's acquire spin
        assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) <= count(ops, "HGMMA") // 4, "serialised wgmma"


def test_exp2_fraction_in_sass(tmp_path):
    mufu_none = _main_sass(tmp_path, False, 0.0, causal=False, hdim=64, tile_m=64).count("MUFU.EX2")
    mufu_half = _main_sass(tmp_path, False, 0.5, causal=False, hdim=64, tile_m=64).count("MUFU.EX2")
    mufu_all = _main_sass(tmp_path, False, 1.0, causal=False, hdim=64, tile_m=64).count("MUFU.EX2")
    # the P loop exists twice (masked boundary tiles / unmasked tiles), 32 exponentials per thread in each
    assert mufu_none == 64 and mufu_half == 32 and mufu_all == 0, (mufu_none, mufu_half, mufu_all)


def test_two_cta_cluster_in_sass(tmp_path):
    two = _main_sass(tmp_path, False, 0.0, causal=False, hdim=128, two_cta=True)
    one = _main_sass(tmp_path, False, 0.0, causal=False, hdim=128, two_cta=False)
    assert "UTMALDG.4D.MULTICAST" in two and "MULTICAST" not in one  # Q/dO (+LSE, dPsum) multicast
    assert re.search(r"UBLKCP\.S\.S", two) and "UBLKCP" not in one  # dS half -> peer's shared memory
    assert "UCGABAR_ARV" in two and "UCGABAR_WAIT" in two  # cluster barriers
    assert "HGMMA.64x32x16.F32.BF16" in two  # dQ^T = K^T dS^T, 32 Q rows per CTA
    # dQ: both kernels hand each warpgroup's fp32 chunk to the writer warp, which bulk-reduces it (one
    # cp.reduce.async.bulk per warpgroup); no fp32 global reductions from registers
    for sass in (two, one):
        assert sass.count("UBLKRED.G.S.ADD.F32") == 2 and not re.search(r"\bREDG?\.E\.ADD\.F32", sass)


# (hdim, causal, deterministic): a pairwise cover of the three factors (every pair of their values in some row) instead
# of the 8-row product; (128, False, False) is also test_two_cta_cluster_in_sass's kernel (compiled once)
TWO_CTA_SASS = [(128, False, False), (128, True, True), (64, False, True), (64, True, False)]


def test_two_cta_sass_cover_is_pairwise():
    import itertools

    levels = [(64, 128), (False, True), (False, True)]
    for a, b in itertools.combinations(range(3), 2):
        assert {(r[a], r[b]) for r in TWO_CTA_SASS} == set(itertools.product(levels[a], levels[b])), (a, b)


@pytest.mark.parametrize("hdim,causal,det", TWO_CTA_SASS)
def test_two_cta_sass_no_spills_async_wgmma_bulk_dq(tmp_path, hdim, causal, det):
    """two_cta (default and deterministic): no spills, the wgmma chains stay asynchronous (ptxas serialised every
    wgmma at hd64 while the dS send sat among in-flight wgmma: 40 WARPGROUP.DEPBAR), and dQ leaves through the
    writer warp's bulk reductions (the MMA warps issue no fp32 global reduction; with deterministic only the writer
    spins on the semaphore)."""
    from kernels.sm90.sass import count, opcode_counts

    sass = _main_sass(tmp_path, det, 0.0, causal=causal, hdim=hdim, two_cta=True)
    ops = opcode_counts(sass)
    tag = f"two_cta hd{hdim} causal={causal} det={det}"
    assert count(ops, "LDL") == 0 and count(ops, "STL") == 0, f"spills: {tag}"
    assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) <= 8, f"serialised wgmma: {tag}"
    assert not re.search(r"\bREDG?\.E\.ADD\.F32", sass), f"fp32 global reductions from registers: {tag}"
    assert count(ops, "UBLKRED") == 2 and "UBLKRED.G.S.ADD.F32" in sass, tag
    assert re.search(r"UBLKCP\.S\.S", sass) and "UTMALDG.4D.MULTICAST" in sass, tag
    # dQ^T 64 x 32 per warpgroup, K = 128 over the own and the peer's K/V tile
    assert ops["HGMMA.64x32x16.F32.BF16"] == 16, tag
    assert bool(re.search(r"LDG\.E\.STRONG\.GPU", sass)) == det, tag  # the writer warp's acquire spin
    assert bool(re.search(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", sass)) == det, tag  # its release


def test_two_cta_tile_m_64_sass(tmp_path):
    """hd64 two_cta with 64-row Q tiles: dQ^T is 64 x 16 per warpgroup (2 staging buffers fit there); no spills."""
    from kernels.sm90.sass import count, opcode_counts

    sass = _main_sass(tmp_path, True, 0.0, causal=True, hdim=64, two_cta=True, tile_m=64)
    ops = opcode_counts(sass)
    assert count(ops, "LDL") == 0 and count(ops, "STL") == 0
    assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) <= 8
    assert ops["HGMMA.64x16x16.F32.BF16"] == 16 and count(ops, "UBLKRED") == 2
    assert not re.search(r"\bREDG?\.E\.ADD\.F32", sass)


def test_det_schedule_changes_the_kernel(tmp_path):
    """det_schedule reaches the machine code of the deterministic causal kernel (grid order and dQ turns)."""
    spt = _main_sass(tmp_path, True, 0.0, causal=True, hdim=64, det_schedule="spt")
    naive = _main_sass(tmp_path, True, 0.0, causal=True, hdim=64, det_schedule="naive")
    strip = lambda s: re.sub(r"/\*[0-9a-f]{4}\*/", "", s)
    assert strip(spt) != strip(naive)
    assert re.search(r"LDG\.E\.STRONG\.GPU", naive) and re.search(r"LDG\.E\.STRONG\.GPU", spt)


@pytest.mark.parametrize("causal", [False, True])
def test_tile_m_80_sass(tmp_path, causal):
    """hd128 with 80-row Q tiles (opt-in): S^T / dP^T and dQ^T = K^T dS^T are 64 x 80 wgmma per warpgroup (8 each),
    dV / dK 64 x 128 RS over K = 80 (5 each); no spills; the chains stay asynchronous; dQ by the writer warp."""
    from kernels.sm90.sass import count, opcode_counts

    for det in (False, True):
        sass = _main_sass(tmp_path, det, 0.0, causal=causal, hdim=128, tile_m=80)
        ops = opcode_counts(sass)
        assert count(ops, "LDL") == 0 and count(ops, "STL") == 0, f"spills at tile 80 causal={causal} det={det}"
        kinds = {op: n for op, n in ops.items() if op.startswith("HGMMA")}
        assert kinds == {"HGMMA.64x80x16.F32.BF16": 24, "HGMMA.64x128x16.F32.BF16": 10}, kinds
        assert count(ops, "UBLKRED") == 2 and "STSM" in sass and "UTMASTG" in sass
        assert not re.search(r"REDG\.E\.ADD\.F32", sass) and not re.search(r"\bSTG\.E", sass)
        assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) <= 8, f"serialised wgmma: tile 80 causal={causal} det={det}"
        assert bool(re.search(r"LDG\.E\.STRONG\.GPU", sass)) == det
        # the 20 LSE values of a Q tile are loaded (10 LDS.64) while its S^T wgmma is issued, before the first wgmma
        # wait, not after it next to the exponentials (bwd.py lse_preload; 1.02-1.05x non-causal on the H200), causal
        # without spills through lse_views_fresh (deterministic, two dQ writers by default at hd128: 5 of its 10
        # LDS.64 before that wait, causal and not)
        from kernels.sm90.sass import loads_before_first_wgmma_wait

        early = loads_before_first_wgmma_wait(sass)
        assert early == (5 if det else 10), (causal, det, early)


@pytest.mark.parametrize("hdim", [64, 128, 256])  # 256: the one-CTA wide kernel (two_cta=False)
def test_det_schedule_rotate_in_sass(tmp_path, hdim):
    """det_schedule="rotate" (non-causal, deterministic; GPU-untested candidate): the rotated walk and the arrival-order
    turns are in the machine code -- the deterministic default's non-causal kernel divides nothing, the rotate one has
    five I2F + MUFU.RCP reciprocal sequences (divisions by M and N, divisions by one divisor sharing one: cta_work's
    m_rot = rotate_start, n mod M or n M // N; the writer's rotate_turn_base and first turn; and, in the writer's
    loop, the next step's turn ceil((r + 1) N / M), computed while the step's reductions are in flight) -- with the
    same acquire spin / release add, no spills and no more WARPGROUP.DEPBAR
    than the default's (hd64: 0 LDL/STL, 4 DEPBAR both; hd128 (80-row tiles) likewise on the CPU build of
    2026-12-01)."""
    from kernels.sm90.sass import count, opcode_counts

    one = "bwd_det_two_writers=False"  # the one-writer loop (dq_writer; hd128's default has two: dq_writer_pair)
    spt = _main_sass(tmp_path, True, 0.0, causal=False, hdim=hdim, extra=one)
    rot = _main_sass(tmp_path, True, 0.0, causal=False, hdim=hdim, det_schedule="rotate", extra=one)
    ops_spt, ops_rot = opcode_counts(spt), opcode_counts(rot)
    assert count(ops_rot, "LDL") == 0 and count(ops_rot, "STL") == 0
    depbar = lambda s: len(re.findall(r"WARPGROUP\.DEPBAR", s))
    assert depbar(rot) <= depbar(spt) <= 8
    assert count(ops_spt, "MUFU.RCP") == 0 and count(ops_rot, "MUFU.RCP") == 5
    # the next turn's division sits between the step's bulk reductions and the wait for their completion
    lines = rot.splitlines()
    last_red = max(i for i, l in enumerate(lines) if "UBLKRED.G.S.ADD.F32" in l)
    release = next(i for i in range(last_red, len(lines)) if "REDG.E.ADD.S32.STRONG.GPU" in lines[i])
    assert any("MUFU.RCP" in l for l in lines[last_red:release])
    for sass in (spt, rot):
        assert re.search(r"LDG\.E\.STRONG\.GPU", sass) and re.search(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", sass)
        assert "UBLKRED.G.S.ADD.F32" in sass and not re.search(r"REDG\.E\.ADD\.F32", sass)
    assert {k: v for k, v in ops_rot.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_spt.items() if k.startswith("HGMMA")}


@pytest.mark.parametrize("hdim,causal,extra", [(64, True, "bwd_lpt_heads=1"), (64, True, "bwd_lpt_heads=4"),
                                               (128, True, "bwd_lpt_heads=1"), (128, True, "bwd_lpt_heads=4"),
                                               (128, False, "bwd_rotate_q=True")])
def test_schedule_candidates_in_sass(tmp_path, hdim, causal, extra):
    """The opt-in schedule switches (AttnConfig.bwd_lpt_heads: causal grid longest first, g heads interleaved;
    bwd_rotate_q: hd128 non-causal rotated Q-tile walks) change only index arithmetic: a different kernel from the
    default's with the same HGMMA, no spills and no more WARPGROUP.DEPBAR; lpt_heads > 1 divides (the launch rank's
    regrouping by the grid size), so does the rotated walk (n mod M): MUFU.RCP reciprocal sequences."""
    from kernels.sm90.sass import count, opcode_counts

    # base: the shortest-first grid (bwd_lpt_heads=0; the causal default is longest first since 2026-12-01)
    base = _main_sass(tmp_path, False, 0.0, causal=causal, hdim=hdim, extra="bwd_lpt_heads=0" if causal else "")
    cand = _main_sass(tmp_path, False, 0.0, causal=causal, hdim=hdim, extra=extra)
    strip = lambda s: re.sub(r"/\*[0-9a-f]{4}\*/", "", s)
    assert strip(base) != strip(cand)
    ops_b, ops_c = opcode_counts(base), opcode_counts(cand)
    assert count(ops_c, "LDL") == 0 and count(ops_c, "STL") == 0
    depbar = lambda s: len(re.findall(r"WARPGROUP\.DEPBAR", s))
    assert depbar(cand) <= depbar(base) <= 8
    assert {k: v for k, v in ops_c.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_b.items() if k.startswith("HGMMA")}
    if extra in ("bwd_rotate_q=True", "bwd_lpt_heads=4"):
        assert count(ops_c, "MUFU.RCP") > count(ops_b, "MUFU.RCP")


def _bwd_kernels_sass(tmp_path, extra, hdim, causal):
    """{"pre" | "main" | "post": (SASS, host IR)} of the three backward kernels compiled for AttnConfig(<extra>) (host
    IR: the *_clean.mlir CUTE_DSL_KEEP=ir writes, holding the launch configuration)."""
    tag = re.sub(r"[^A-Za-z0-9]+", "_", extra)
    dump = tmp_path / f"k{hdim}_{int(causal)}_{tag}"
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig({extra}), "bfloat16", {hdim}, {causal})
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin,ir", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)  # a fork of a warm worker: tests/dsl_subprocess.py
    out = {}
    for kind, cls in (("pre", "FlashBwdPreSm90"), ("main", "FlashBwdSm90"), ("post", "FlashBwdPostSm90")):
        cubins = [c for c in glob.glob(str(dump / "*.cubin")) if f"bwd{cls}" in c or f"bwd_{kind}{cls}" in c]
        irs = [c for c in glob.glob(str(dump / "*_clean.mlir")) if f"bwd{cls}" in c or f"bwd_{kind}{cls}" in c]
        assert len(cubins) == 1 and len(irs) == 1, (kind, cubins, irs)
        sass = subprocess.run([_nvdisasm(), "-c", cubins[0]], check=True, capture_output=True, text=True).stdout
        out[kind] = (sass, open(irs[0]).read())
    return out


@pytest.mark.parametrize("hdim,causal,extra", [(64, True, ""), (128, False, ""), (128, True, "deterministic=True"),
                                               (128, False, "two_cta=True")])
def test_bwd_pdl_in_sass(tmp_path, hdim, causal, extra):
    """AttnConfig.bwd_pdl (the hd 64 / 128 default since 2026-12-04): all three kernels launch with the programmaticStreamSerialization attribute (host
    IR: ``programmatic_stream_serialization_allowed`` with 1, 0 without the field). SASS: griddepcontrol.wait is
    ACQBULK, griddepcontrol.launch_dependents PREEXIT. The preprocess waits before its first global load, then signals;
    the main kernel signals first thing, and its producer waits after the first K / V / Q TMA loads (4-D) and before
    the first LSE / dPsum load (3-D), plus once after its loop (a CTA without Q tiles); the postprocess waits before
    its first global load. No spills, the main kernel's HGMMA unchanged; bwd_pdl=False has none of it."""
    from kernels.sm90.sass import count, opcode_counts

    sep = ", " if extra else ""
    # (bwd_stream_post, on with PDL by default, pinned off: its postprocess waits for the main grid at its end)
    cand = _bwd_kernels_sass(tmp_path, extra + sep + "bwd_pdl=True, bwd_stream_post=False", hdim, causal)
    base = _bwd_kernels_sass(tmp_path, extra + sep + "bwd_pdl=False", hdim, causal)
    attr = r"programmatic_stream_serialization_allowed\[%\w+\] %c(\d)_i32"
    first = lambda sass, pat: next((i for i, l in enumerate(sass.splitlines()) if re.search(pat, l)), None)
    for kind in ("pre", "main", "post"):
        (sass_c, ir_c), (sass_b, ir_b) = cand[kind], base[kind]
        assert re.findall(attr, ir_c) == ["1"] and re.findall(attr, ir_b) == ["0"], kind
        assert "ACQBULK" not in sass_b and "PREEXIT" not in sass_b, kind
        ops = opcode_counts(sass_c)
        assert count(ops, "LDL") == 0 and count(ops, "STL") == 0, kind
    pre, main, post = (cand[k][0] for k in ("pre", "main", "post"))
    assert pre.count("ACQBULK") == 1 and pre.count("PREEXIT") == 1
    assert first(pre, "ACQBULK") < first(pre, "PREEXIT") < first(pre, r"\bLDG\b")
    assert post.count("ACQBULK") == 1 and "PREEXIT" not in post
    assert first(post, "ACQBULK") < first(post, r"\bLDG\b")
    assert main.count("PREEXIT") == 1 and main.count("ACQBULK") == 2
    assert first(main, "PREEXIT") < first(main, r"UTMALDG\.4D") < first(main, "ACQBULK") < first(main, r"UTMALDG\.3D")
    ops_c, ops_b = opcode_counts(main), opcode_counts(base["main"][0])
    assert {k: v for k, v in ops_c.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_b.items() if k.startswith("HGMMA")}


def _writer_release_waits(sass):
    """The bulk-read wait (DEPBAR.LE SB0, n) the dQ writer executes before each dQ-empty arrive (BAR.ARV on
    Bar.BWD_DQ_EMPTY + w), in program order, for the first of each barrier id."""
    from kernels.sm90.barriers import Bar

    empty = {int(Bar.BWD_DQ_EMPTY) + w for w in range(2)}
    waits, last = {}, None
    for line in sass.splitlines():
        m = re.search(r"DEPBAR\.LE SB0, 0x([0-9a-f]+)", line)
        if m:
            last = int(m.group(1), 16)
        m = re.search(r"BAR\.ARV 0x([0-9a-f]+), 0xa0", line)
        if m and int(m.group(1), 16) in empty:
            waits.setdefault(int(m.group(1), 16) - int(Bar.BWD_DQ_EMPTY), last)
    return waits


@pytest.mark.parametrize("hdim,causal,tile_m", [(128, False, None), (128, True, None), (64, False, None),
                                                (128, False, 64)])
def test_bwd_dq_chunk_release_in_sass(tmp_path, hdim, causal, tile_m):
    """AttnConfig.bwd_dq_chunk_release (opt-in): the dQ writer frees warpgroup 0's staging chunk after its own bulk read
    (cp.async.bulk.wait_group.read W*(S-1) + 1, S staging buffers, W = 2 chunks) instead of after both chunks' reads
    (W*(S-1), the default, before both arrives): at hd128's 80-row tiles (one buffer) DEPBAR.LE SB0, 0x1 then 0x0, as
    official FA4's writer. The MMA loop is unchanged (same HGMMA), no spills."""
    from kernels.sm90.sass import count, opcode_counts

    base = _main_sass(tmp_path, False, 0.0, causal=causal, hdim=hdim, tile_m=tile_m)
    cand = _main_sass(tmp_path, False, 0.0, causal=causal, hdim=hdim, tile_m=tile_m, extra="bwd_dq_chunk_release=True")
    wb, wc = _writer_release_waits(base), _writer_release_waits(cand)
    assert wb[0] == wb[1] and wb[0] in (0, 2), wb
    assert wc == {0: wb[0] + 1, 1: wb[1]}, (wb, wc)
    ops_b, ops_c = opcode_counts(base), opcode_counts(cand)
    assert count(ops_c, "LDL") == 0 and count(ops_c, "STL") == 0
    assert {k: v for k, v in ops_c.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_b.items() if k.startswith("HGMMA")}
