"""CPU tests of the hd256 two_cta backward (kernels/sm90/bwd_wide_two_cta.py), compiled for sm_90a and disassembled.

The SASS must hold the cluster machinery -- Q / dO (TMA 4D) and LSE / dPsum (TMA 3D) multicast, the dS tile sent to the
peer CTA (one shared::cta -> shared::cluster bulk copy), remote mbarrier arrivals (the peer's multicast stages and dS
buffer handed back), cluster barriers -- no spills, asynchronous wgmma chains (no more WARPGROUP.DEPBAR than the
one-CTA kernel), dQ over both K/V tiles (64 x 64 per warpgroup, K = 128) bulk-reduced by the writer warp in four 8 KB
hand-offs per Q tile, and no fp32 global reductions from registers. Plus the config plumbing (what resolves, what is a
ConfigError) and the shared-memory plan.
"""
from __future__ import annotations

import glob
import os
import re
import textwrap

import pytest

import dsl_subprocess  # tests/dsl_subprocess.py

pytestmark = pytest.mark.compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main_sass(tmp_path, two_cta, causal, deterministic=False, dtype="bfloat16", frac=0.0, det_schedule="spt",
               extra=""):
    """SASS of the hd256 backward main kernel for one config (compiled in a subprocess, DSL cache off); ``extra``:
    more AttnConfig keyword arguments as source text. two_cta: the 64-row pairs (bwd_two_cta_n80=False; the 80-row
    kernel, the non-deterministic default, has tests/test_bwd_two_cta_n80.py)."""
    from kernels.sm90.sass import disassemble, find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    tag = re.sub(r"[^A-Za-z0-9]+", "_", extra)
    dump = tmp_path / f"t{int(two_cta)}_c{int(causal)}_d{int(deterministic)}_{dtype}_{frac}_{det_schedule}{tag}"
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig(two_cta={two_cta}, deterministic={deterministic}, exp2_emu_fraction={frac},
                                    det_schedule={det_schedule!r}, bwd_two_cta_n80=False, {extra}), {dtype!r}, 256,
                         {causal}, hdim_v=256)
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)  # a fork of a warm worker: tests/dsl_subprocess.py
    name = "FlashBwdWideTwoCtaSm90" if two_cta else "FlashBwdWideSm90_"
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if name in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


def _depbar(sass):
    return len(re.findall(r"WARPGROUP\.DEPBAR", sass))


@pytest.mark.parametrize("causal,deterministic,dtype", [(False, False, "bfloat16"), (True, False, "bfloat16"),
                                                         (True, True, "float16"), (False, True, "bfloat16")],
                         ids=["noncausal-bf16", "causal-bf16", "causal-det-fp16", "noncausal-det-bf16"])
def test_two_cta_wide_sass(tmp_path, causal, deterministic, dtype):
    from kernels.sm90.sass import count, opcode_counts

    two = _main_sass(tmp_path, True, causal, deterministic, dtype)
    one = _main_sass(tmp_path, False, causal, deterministic, dtype)
    ops, ops1 = opcode_counts(two), opcode_counts(one)
    tag = f"causal={causal} det={deterministic} {dtype}"
    fp = "F32.BF16" if dtype == "bfloat16" else "F32"
    # registers: no spills; the wgmma chains stay asynchronous (the one-CTA kernel's count as the bound: with the
    # dS send in an `if tidx == 0` branch ptxas serialised every wgmma at causal bf16, 48 WARPGROUP.DEPBAR, C7520)
    assert count(ops, "LDL") == 0 and count(ops, "STL") == 0, f"spills: {tag}"
    assert _depbar(two) <= _depbar(one), f"serialised wgmma: {tag} ({_depbar(two)} vs {_depbar(one)})"
    # GEMMs: S^T / dP^T 64 x 32 over d = 256 (16 + 16), dK / dV 64 x 128 over 64 Q rows (4 + 4), dQ 64 x 64 over the
    # own and the peer's 64 K/V rows (4 + 4): the same 48 HGMMA as the one-CTA kernel (there dQ is 2 x 64 x 64 over 64)
    kinds = {op: n for op, n in ops.items() if op.startswith("HGMMA")}
    assert kinds == {f"HGMMA.64x32x16.{fp}": 32, f"HGMMA.64x128x16.{fp}": 8, f"HGMMA.64x64x16.{fp}": 8}, kinds
    # cluster: Q / dO tiles (4D) and LSE / dPsum (3D) multicast, K / V / the peer's K half plain TMA loads
    assert ops["UTMALDG.4D.MULTICAST"] > 0 and ops["UTMALDG.3D.MULTICAST"] > 0, tag
    assert ops["UTMALDG.4D"] == 4 + 4 + 2, tag  # K, V: 4 boxes of 64 x 64 each; the peer's K half: 2
    assert "MULTICAST" not in one
    # DSMEM: the dS tile to the peer (one bulk copy shared::cta -> shared::cluster), remote mbarrier arrivals
    assert ops["UBLKCP.S.S"] == 1 and "UBLKCP" not in one, tag
    assert count(ops, "SYNCS.ARRIVE.TRANS64.RED") > 0 and count(ops1, "SYNCS.ARRIVE.TRANS64.RED") == 0, tag
    assert ops["UCGABAR_ARV"] > 0 and ops["UCGABAR_WAIT"] > 0 and "UCGABAR" not in one, tag
    # dQ: the writer warp's bulk reductions (2 warpgroups x 2 halves), none from registers; dK / dV by TMA stores
    assert count(ops, "UBLKRED") == 4 and "UBLKRED.G.S.ADD.F32" in two, tag
    assert not re.search(r"\bREDG?\.E\.ADD\.F32", two) and not re.search(r"\bSTG\.E", two), tag
    assert "STSM" in two and "UTMASTG" in two, tag
    # deterministic: the writer warp's acquire spin and release add, only there
    assert bool(re.search(r"LDG\.E\.STRONG\.GPU", two)) == deterministic, tag
    assert bool(re.search(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", two)) == deterministic, tag
    # LSE: loaded while S^T is issued in the 2-CTA kernel (bwd.py p_and_ds; 1.03x on the H200), after the first wgmma
    # wait in the one-CTA kernel and in deterministic calls
    from kernels.sm90.sass import loads_before_first_wgmma_wait

    assert loads_before_first_wgmma_wait(two) == (0 if deterministic else 4), tag
    assert loads_before_first_wgmma_wait(one) == 0, tag


@pytest.mark.parametrize("causal,dtype,frac,det_schedule", [(True, "bfloat16", 0.5, "naive"),
                                                            (False, "float16", 1.0, "spt")],
                         ids=["causal-bf16-exp2half-naive", "noncausal-fp16-exp2all"])
def test_two_cta_wide_switches_sass(tmp_path, causal, dtype, frac, det_schedule):
    """The other switches with two_cta (exp2 emulation, the naive deterministic schedule): no spills, asynchronous
    wgmma (at most the one-CTA kernel's 5 WARPGROUP.DEPBAR), the DSMEM send; the emulated share of a thread's 16
    exponentials per S^T tile off MUFU, in both P loops (masked tiles and the rest)."""
    from kernels.sm90.sass import count, opcode_counts

    sass = _main_sass(tmp_path, True, causal, det_schedule == "naive", dtype, frac, det_schedule)
    ops = opcode_counts(sass)
    assert count(ops, "LDL") == 0 and count(ops, "STL") == 0
    assert _depbar(sass) <= 5 and ops["UBLKCP.S.S"] == 1
    assert sass.count("MUFU.EX2") == round(2 * 16 * (1.0 - frac))


def test_two_cta_wide_plan():
    """hd256 two_cta: Q 2 stages, dO 1, dQ 64 x 64 per warpgroup handed over in two 8 KB halves through one buffer per
    warpgroup; the shared-memory plan of the module docstring (217 KB of tiles) and the cluster fields."""
    import cutlass

    from kernels.sm90.bwd_wide_two_cta import FlashBwdWideTwoCtaSm90

    k = FlashBwdWideTwoCtaSm90(cutlass.BFloat16, 256, True, hdim_v=256)
    assert (k.two_cta, k.cluster, k.stages) == (True, 2, 1)
    assert (k.q_stages, k.do_stages, k.dq_pieces, k.dq_stages) == (2, 1, 2, 1)
    assert k.dq_shape == (64, 64) and k.dq_vals == 16 and k.dq_chunk == 2048
    q_st = 64 * 256 * 2 + 64 * 4
    assert k.smem_bytes == 2 * q_st + q_st + 2 * 32768 + 16384 + 3 * 8192 + 2 * 8192 == 221952
    assert k.smem_bytes + 2048 <= 227 * 1024
    # the postprocess reads the one-CTA hd256 dQaccum layout (four 64 x 64 chunks per Q tile)
    assert k.post_layout() == dict(chunks=4, transposed=False)


def test_two_cta_wide_kernel_rejects():
    import cutlass

    from kernels.sm90.bwd_wide_two_cta import FlashBwdWideTwoCtaSm90

    with pytest.raises(ValueError, match=r"two_cta=True at \(hdim, hdim_v\)=\(192, 128\)"):
        FlashBwdWideTwoCtaSm90(cutlass.BFloat16, 192, False, hdim_v=128)
    with pytest.raises(ValueError, match="two_cta=False"):
        FlashBwdWideTwoCtaSm90(cutlass.BFloat16, 256, False, two_cta=False)
    with pytest.raises(ValueError, match="sliding window or softcap"):
        FlashBwdWideTwoCtaSm90(cutlass.BFloat16, 256, False, softcap=10.0)


def test_two_cta_wide_config_plumbing():
    """two_cta at hd256 resolves (64-row tiles) to the 2-CTA kernel with the one-CTA postprocess layout; (192, 128),
    a window, a softcap, bwd_tile_m != 64 and varlen stay ConfigErrors; the other head dims' defaults are unchanged."""
    import cutlass

    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import _check_supported, _main_kernel, _post_layout, compile_backward
    from kernels.sm90.bwd_wide import FlashBwdWideSm90
    from kernels.sm90.bwd_wide_two_cta import FlashBwdWideTwoCtaSm90

    cfg = AttnConfig(two_cta=True).resolve("sm90", 256, True)
    assert cfg.bwd_tile_m == 64
    _check_supported(cfg, 256, 256)
    main = _main_kernel(cutlass.BFloat16, cfg, 256, 256, True)
    assert type(main) is FlashBwdWideTwoCtaSm90 and main.cluster == 2
    assert _post_layout(main) == dict(chunks=4, transposed=False)
    one = _main_kernel(cutlass.BFloat16, AttnConfig(two_cta=False).resolve("sm90", 256, True), 256, 256, True)
    assert type(one) is FlashBwdWideSm90 and _post_layout(one) == _post_layout(main)
    with pytest.raises(ConfigError, match="two_cta=True at hdim 192"):
        compile_backward(AttnConfig(two_cta=True), "bfloat16", 192, False, hdim_v=128)
    with pytest.raises(ConfigError, match="two_cta=True with window_size/softcap"):
        compile_backward(AttnConfig(two_cta=True), "bfloat16", 256, False, window_left=128)
    with pytest.raises(ConfigError, match="two_cta=True with window_size/softcap"):
        compile_backward(AttnConfig(two_cta=True), "bfloat16", 256, False, softcap=20.0)
    with pytest.raises(ConfigError, match="bwd_tile_m=128 at hdim 256"):
        compile_backward(AttnConfig(two_cta=True, bwd_tile_m=128), "bfloat16", 256, False)
    from kernels.sm90.backward import check_varlen_supported

    with pytest.raises(ConfigError, match="varlen"):
        check_varlen_supported(cfg, 256, 256)
    from kernels.config import DEFAULTS

    # defaults elsewhere untouched: hd64's table value, hd128's 80-row default taken to 64 rows with two_cta
    assert AttnConfig(two_cta=True).resolve("sm90", 64, False).bwd_tile_m == DEFAULTS[("sm90", 64)]["bwd_tile_m"]
    assert AttnConfig(two_cta=True).resolve("sm90", 128, False).bwd_tile_m == 64


def test_two_cta_wide_compiles_distinct():
    """compile_backward builds the three kernels for hd256 two_cta (plain and deterministic), distinct from the
    one-CTA ones; the default config (two_cta=None) gets the 2-CTA kernels (the same compiled objects): the 80-row
    pairs, deterministic too (the 64-row pairs with bwd_two_cta_n80=False)."""
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    two = compile_backward(AttnConfig(two_cta=True, bwd_two_cta_n80=False), "bfloat16", 256, False)
    det = compile_backward(AttnConfig(two_cta=True, deterministic=True, bwd_two_cta_n80=False), "float16", 256, True)
    one = compile_backward(AttnConfig(two_cta=False), "bfloat16", 256, False)
    assert set(two) >= {"pre", "main", "post"} and set(det) >= {"pre", "main", "post"}
    assert two["main"] is not one["main"] and two["tile_m"] == 64 and two["tile_n"] == 64
    n80 = compile_backward(AttnConfig(), "bfloat16", 256, False)
    assert n80["main"] is compile_backward(AttnConfig(two_cta=True), "bfloat16", 256, False)["main"]
    assert n80["main"] is not two["main"] and n80["tile_n"] == 80
    det80 = compile_backward(AttnConfig(deterministic=True), "float16", 256, True)
    assert det80["main"] is not det["main"] and det80["tile_n"] == 80
    assert det80["main"] is compile_backward(AttnConfig(two_cta=True, deterministic=True), "float16", 256, True)["main"]


def test_two_cta_default_kernel_choice():
    """two_cta=None (the default): backward_config decides it per call before the checks and the kernel choice; hd256
    runs FlashBwdWide80TwoCtaSm90 (deterministic too), hd256 with a softcap / window the one-CTA FlashBwdWideSm90, varlen never 2-CTA, the
    other head dims their one-CTA kernels; a forced two_cta=False at hd256 runs the one-CTA kernel."""
    import cutlass

    from kernels import AttnConfig
    from kernels.sm90.backward import _check_supported, _main_kernel, backward_config, check_varlen_supported
    from kernels.sm90.bwd import FlashBwdSm90
    from kernels.sm90.bwd_wide import FlashBwdWideSm90
    from kernels.sm90.bwd_wide192 import FlashBwd192Sm90
    from kernels.sm90.bwd_wide_two_cta import FlashBwdWideTwoCtaSm90
    from kernels.sm90.bwd_wide_two_cta80 import FlashBwdWide80TwoCtaSm90

    bf = cutlass.BFloat16
    for causal in (False, True):
        r = AttnConfig().resolve("sm90", 256, causal)
        cfg = backward_config(r, hdim=256, hdim_v=256)
        assert cfg.two_cta is True and cfg.bwd_tile_m == 64
        _check_supported(cfg, 256, 256)
        assert type(_main_kernel(bf, cfg, 256, 256, causal)) is FlashBwdWide80TwoCtaSm90  # 80-row K/V tiles
        det = backward_config(AttnConfig(deterministic=True).resolve("sm90", 256, causal), hdim=256, hdim_v=256)
        assert type(_main_kernel(bf, det, 256, 256, causal)) is FlashBwdWide80TwoCtaSm90  # deterministic: 80 rows too
        for feats, softcap in ((dict(softcap=20.0), True), (dict(window_left=128), False)):
            f = backward_config(r, softcap, hdim=256, hdim_v=256, features=True)
            assert f.two_cta is False
            _check_supported(f, 256, 256, True, softcap)
            assert type(_main_kernel(bf, f, 256, 256, causal, features=feats)) is FlashBwdWideSm90
        assert backward_config(r, varlen=True, hdim=256, hdim_v=256).two_cta is False
        off = backward_config(AttnConfig(two_cta=False).resolve("sm90", 256, causal), hdim=256, hdim_v=256)
        assert type(_main_kernel(bf, off, 256, 256, causal)) is FlashBwdWideSm90
        for (hd, hv), cls in (((64, 64), FlashBwdSm90), ((128, 128), FlashBwdSm90), ((192, 128), FlashBwd192Sm90)):
            c = backward_config(AttnConfig().resolve("sm90", hd, causal), hdim=hd, hdim_v=hv)
            assert c.two_cta is False
            _check_supported(c, hd, hv)
            assert type(_main_kernel(bf, c, hd, hv, causal)) is cls
    # varlen at hd128 with the default config: no 2-CTA decision to reject
    check_varlen_supported(AttnConfig().resolve("sm90", 128, True), 128, 128)


def test_two_cta_default_compile_keys(monkeypatch):
    """The compile cache keys of the default config at hd64 / 128 / (192, 128) (and varlen, and hd256 with a softcap)
    are exactly those of an explicit two_cta=False (the keys and kernels of before two_cta=None); hd256's default key is
    two_cta=True's."""
    from kernels import AttnConfig
    from kernels.sm90 import backward as B

    monkeypatch.setattr(B, "get_or_compile", lambda key, build: key)  # the key, no compiling
    for causal in (False, True):
        for hd, hv in ((64, 64), (128, 128), (192, 128)):
            k = B.compile_backward(AttnConfig(), "bfloat16", hd, causal, hdim_v=hv)
            assert k == B.compile_backward(AttnConfig(two_cta=False), "bfloat16", hd, causal, hdim_v=hv)
            assert ("two_cta", False) in k[1]
            assert k != B.compile_backward(AttnConfig(deterministic=True), "bfloat16", hd, causal, hdim_v=hv)
        for hd in (64, 128):
            assert (B.compile_backward_varlen(AttnConfig(), "bfloat16", hd, causal)
                    == B.compile_backward_varlen(AttnConfig(two_cta=False), "bfloat16", hd, causal))
        k256 = B.compile_backward(AttnConfig(), "bfloat16", 256, causal)
        assert k256 == B.compile_backward(AttnConfig(two_cta=True), "bfloat16", 256, causal) and ("two_cta", True) in k256[1]
        assert k256 != B.compile_backward(AttnConfig(two_cta=False), "bfloat16", 256, causal)
        assert (B.compile_backward(AttnConfig(), "bfloat16", 256, causal, softcap=20.0)
                == B.compile_backward(AttnConfig(two_cta=False), "bfloat16", 256, causal, softcap=20.0))


def test_two_cta_wide_rotate_sass(tmp_path):
    """det_schedule="rotate" at hd256 in pairs (non-causal): the pair's rotated walk and arrival-order turns are in the
    machine code -- spt's non-causal kernel divides nothing, rotate's in rotate_start (spread starts) and in the
    writer's arrival-order turns (I2F + MUFU.RCP sequences: 4 on the CPU build of 2026-12-02, session 30) -- with the same GEMMs, the same
    semaphore spin / release, no spills and no more WARPGROUP.DEPBAR."""
    from kernels.sm90.sass import count, opcode_counts

    spt = _main_sass(tmp_path, True, False, True, det_schedule="spt")
    rot = _main_sass(tmp_path, True, False, True, det_schedule="rotate")
    o_spt, o_rot = opcode_counts(spt), opcode_counts(rot)
    assert count(o_rot, "LDL") == 0 and count(o_rot, "STL") == 0
    assert _depbar(rot) <= _depbar(spt)
    assert count(o_spt, "MUFU.RCP") == 0 and count(o_rot, "MUFU.RCP") == 4, (count(o_spt, "MUFU.RCP"),
                                                                             count(o_rot, "MUFU.RCP"))
    hg = lambda o: {k: v for k, v in o.items() if k.startswith("HGMMA")}
    assert hg(o_rot) == hg(o_spt)
    for sass in (spt, rot):
        assert re.search(r"LDG\.E\.STRONG\.GPU", sass) and re.search(r"REDG\.E\.ADD\.S32\.STRONG\.GPU", sass)


def test_two_cta_wide_rotate_q_sass(tmp_path):
    """AttnConfig.bwd_rotate_q at hd256 (pairs, non-causal, not deterministic): the rotated walk's start (pair mod M,
    one division: MUFU.RCP) is in the SASS, the default's divides nothing; same GEMMs, no spills, no semaphores."""
    from kernels.sm90.sass import count, opcode_counts

    base = opcode_counts(_main_sass(tmp_path, True, False, False))
    rotq = opcode_counts(_main_sass(tmp_path, True, False, False, extra="bwd_rotate_q=True"))
    assert count(base, "MUFU.RCP") == 0 and count(rotq, "MUFU.RCP") >= 1
    assert count(rotq, "LDL") == 0 and count(rotq, "STL") == 0
    assert {k: v for k, v in rotq.items() if k.startswith("HGMMA")} == {k: v for k, v in base.items()
                                                                          if k.startswith("HGMMA")}
    assert not any(k.startswith("REDG.E.ADD.S32") for k in rotq)

