"""Roofline model: reproduces the FA4 paper's Tables 1 and 3 from operand sources; switches move cycles
where they should; predictions, calibration and the `run.py roofline` entry behave."""
import json
from dataclasses import fields

import pytest

from analysis import roofline as rl
from kernels.hardware import GPUS, get_gpu

B200 = GPUS["b200"]
PAPER = ("mma", "smem", "mufu")


def _paper_cols(tc):
    return tuple(tc.cycles[k] for k in PAPER)


@pytest.mark.parametrize("m, expect", [(128, (1024, 768, 1024)), (256, (2048, 1536, 2048))])
def test_table1_forward_b200(m, expect):
    tc = rl.tile_cost(B200, "fwd", m, 128, 128)
    assert _paper_cols(tc) == expect
    # and the paper's closed forms for these shapes: 4MNd/8192, 3MNd/8192, MN/16
    n = d = 128
    assert _paper_cols(tc) == (4 * m * n * d / 8192, 3 * m * n * d / 8192, m * n / 16)


@pytest.mark.parametrize("two_cta, expect", [(False, (2560, 3328, 1024)), (True, (2560, 2688, 1024))])
def test_table3_backward_b200(two_cta, expect):
    tc = rl.tile_cost(B200, "bwd", 128, 128, 128, two_cta=two_cta)
    assert _paper_cols(tc) == expect


def test_backward_smem_comes_from_operands():
    gemms, extra = rl.tile_gemms("sm100", "bwd", 128, 128, 128, 128)
    tile = 128 * 128 * 2  # one bf16 128x128 tile
    assert [g.smem_bytes / tile for g in gemms] == [2, 2, 1, 1, 2]  # P^T, dS^T from TMEM
    assert extra / tile == 5  # dS store (1) + fp32 dQ written (2) and read by the TMA (2)
    gemms2, _ = rl.tile_gemms("sm100", "bwd", 128, 128, 128, 128, two_cta=True)
    assert [g.smem_bytes / tile for g in gemms2] == [1.5, 1.5, 0.5, 0.5, 1.5]


def test_hopper_operand_sources():
    gemms, _ = rl.tile_gemms("sm90", "fwd", 128, 128, 128, 128)
    qk, pv = gemms
    assert qk.a_src == "smem" and pv.a_src == "reg"  # SS for QK^T, RS for PV
    assert qk.b_reads == 2 and pv.b_reads == 2  # two m64 warpgroups each read K / V
    h = GPUS["h200"]
    tc = rl.tile_cost(h, "fwd", 128, 128, 128)
    assert tc.cycles["mma"] == 4 * 128 ** 3 / 4096 == 2048  # wgmma: half of B200's rate per SM
    assert h.mufu_ex2_per_clk == B200.mufu_ex2_per_clk == 16
    assert tc.cycles["mufu"] == 1024


def test_hopper_forward_operand_switches_and_tma_fill():
    """q_in_regs: Q K^T takes A from registers; p_smem: P V takes P from shared memory after the threads stored it;
    tma_fill: the K / V blocks TMA writes each step. hd256's 128 x 80 tile: operand reads 224 KB (70% of the tensor
    clocks at 128 B/clk), with the fill 304 KB (95%)."""
    kb = 1024
    g, extra = rl.tile_gemms("sm90", "fwd", 128, 80, 256, 256)
    assert (sum(x.smem_bytes for x in g) + extra) / kb == 64 + 80 + 80 and extra == 0
    g, extra = rl.tile_gemms("sm90", "fwd", 128, 80, 256, 256, tma_fill=True)
    assert extra / kb == 80
    h = GPUS["h200"]
    tc = rl.tile_cost(h, "fwd", 128, 80, 256, tma_fill=True)
    assert tc.cycles["mma"] == 2560 and tc.cycles["smem"] == 304 * kb / h.smem_bytes_per_clk
    g, _ = rl.tile_gemms("sm90", "fwd", 192, 128, 64, 64, q_in_regs=True)
    assert g[0].a_src == "reg" and g[0].smem_bytes == 128 * 64 * 2 * 3  # K only, once per warpgroup
    g, _ = rl.tile_gemms("sm90", "fwd", 128, 80, 256, 256, q_regs_k=4)  # hd256: 64 of Q's 256 columns in registers
    assert [x.a_src for x in g] == ["reg", "smem", "reg"] and [x.k for x in g[:2]] == [64, 192]
    assert sum(x.smem_bytes for x in g) / kb == 64 + 80 + 80 - 16 and sum(x.flops for x in g) == 4 * 128 * 80 * 256
    g, extra = rl.tile_gemms("sm90", "fwd", 192, 128, 64, 64, p_smem=True)
    assert g[1].a_src == "smem" and extra == 192 * 128 * 2  # P stored, then read as the SS GEMM's A
    assert g[1].smem_bytes == 192 * 128 * 2 + 128 * 64 * 2 * 3
    with pytest.raises(ValueError, match="sm90 forward"):
        rl.tile_gemms("sm100", "fwd", 128, 128, 128, 128, q_in_regs=True)
    g, extra = rl.tile_gemms("sm90", "bwd", 64, 128, 128, 128, tma_fill=True)
    g0, extra0 = rl.tile_gemms("sm90", "bwd", 64, 128, 128, 128)
    assert extra - extra0 == 64 * 256 * 2  # the step's Q and dO blocks


def test_predict_follows_the_compiled_operand_sources():
    """hd128's default takes Q in registers (kernels/config.py DEFAULTS): fewer shared-memory bytes than with it
    off; p_smem at hd64 makes the forward bound by shared memory in the model (P stored and read, N = 64 GEMMs)."""
    on = rl.predict("h200", 128, False, use_measured=False)
    off = rl.predict("h200", 128, False, {"q_in_regs": False}, use_measured=False)
    assert on.tile_cycles["smem"] < off.tile_cycles["smem"] and on.tile_cycles["mma"] == off.tile_cycles["mma"]
    p = rl.predict("h200", 64, False, {"p_smem": True}, use_measured=False)
    assert p.bound == "smem" and p.tflops < rl.predict("h200", 64, False, use_measured=False).tflops
    fill = rl.predict("h200", 256, False, use_measured=False, tma_fill=True)
    assert fill.tile_cycles["smem"] > rl.predict("h200", 256, False, use_measured=False).tile_cycles["smem"]
    rows = rl.table(gpus=("h200", "b200"), modes=("fwd",), variants=["p_smem"], use_measured=False)
    assert {(r["gpu"], r["hdim"]) for r in rows} == {("H200", "64"), ("H200", "128")}  # no room at 192 / 256


def test_two_cta_rejected_on_hopper():
    with pytest.raises(ValueError, match="two_cta"):
        rl.tile_gemms("sm90", "bwd", 64, 128, 128, 128, two_cta=True)


def test_exp2_split_moves_work_from_mufu_to_fma():
    base = rl.tile_cost(B200, "fwd", 128, 128, 128)
    for f in (0.125, 0.25, 0.375, 0.5):
        tc = rl.tile_cost(B200, "fwd", 128, 128, 128, exp2_emu_fraction=f)
        assert tc.cycles["mufu"] == pytest.approx(base.cycles["mufu"] * (1 - f))
        assert tc.cycles["fma"] - base.cycles["fma"] == pytest.approx(f * rl.POLY_FMA_OPS * 128 * 128 / 128)
        assert tc.cycles["alu"] > base.cycles["alu"]
    with pytest.raises(ValueError, match="exp2_emu_fraction"):
        rl.tile_cost(B200, "fwd", 128, 128, 128, exp2_emu_fraction=1.5)


def test_tau_removes_rescale_multiplies():
    always = rl.tile_cost(B200, "fwd", 128, 128, 128, rescale_share=1.0)
    never = rl.tile_cost(B200, "fwd", 128, 128, 128, rescale_share=0.0)
    assert always.cycles["fma"] - never.cycles["fma"] == pytest.approx(128 * 128 / 128)  # dv muls per row
    assert always.cycles["mma"] == never.cycles["mma"]


def test_overlap_is_max_and_serial_is_sum():
    on = rl.tile_cost(GPUS["h200"], "fwd", 128, 128, 128, overlap=True)
    off = rl.tile_cost(GPUS["h200"], "fwd", 128, 128, 128, overlap=False)
    assert on.total == max(on.cycles.values())
    assert off.total == max(off.cycles["mma"], off.cycles["smem"]) + max(
        off.cycles[k] for k in ("mufu", "fma", "alu", "issue"))
    assert off.total > on.total and "+" in off.bound


def test_count_tiles_causal():
    assert rl.count_tiles(256, 256, 128, 128, causal=False) == 4
    assert rl.count_tiles(256, 256, 128, 128, causal=True) == 3
    # bottom-right alignment: a short query block sees every key block
    assert rl.count_tiles(128, 512, 128, 128, causal=True) == 4
    assert rl.count_tiles(512, 128, 128, 128, causal=True) == 1


def test_predict_bounds_and_switches():
    p = rl.predict("h200", 128, False, None, None, calib={})
    peak = GPUS["h200"].peak_tflops
    assert 0 < p.tflops <= peak * 1.0001 and p.bound in rl.RESOURCES
    serial = rl.predict("h200", 128, False, {"pingpong": False, "intra_wg_overlap": False}, None, calib={})
    assert serial.tflops < p.tflops
    b = rl.predict("b200", 128, False, {"two_cta": False}, None, mode="bwd", calib={})
    b2 = rl.predict("b200", 128, False, {"two_cta": True}, None, mode="bwd", calib={})
    assert b.bound == "smem" and b2.tflops > b.tflops
    # B300's doubled MUFU halves the exp cycles
    e0 = rl.predict("b200", 128, False, {"exp2_emu_fraction": 0.0}, None, calib={})
    e3 = rl.predict("b300", 128, False, {"exp2_emu_fraction": 0.0}, None, calib={})
    assert e3.tile_cycles["mufu"] == e0.tile_cycles["mufu"] / 2
    assert p.values_used["mufu_ex2_per_clk"] == "hardware table"
    with pytest.raises(ValueError, match="arch="):
        rl.predict("a100", 128)


def test_calibration_from_microbench_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    h200 = dict(unit="exp/clk/SM", gpu_name="NVIDIA H200", status="ok")
    rows = [
        dict(h200, metric="mufu_ex2_per_clk_sm", value=15.0, method="triton ex2.approx"),
        dict(h200, metric="poly_exp2_per_clk_sm", value=16.0, method="triton poly"),
        dict(h200, metric="mix_exp2_per_clk_sm", value=20.0, method="mix", fraction=0.5),
        dict(h200, metric="smem_bytes_per_clk_sm", value=None, unit="B/clk/SM", method="x", status="fail"),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calib = rl.load_calibration([path])
    assert set(calib) == {"mufu_ex2_per_clk_sm", "poly_exp2_per_clk_sm", "mix_exp2_per_clk_sm"}  # no failed row
    p = rl.predict("h200", 128, False, {"exp2_emu_fraction": 0.0}, None, calib=calib)
    assert p.values_used["mufu_ex2_per_clk"].startswith("measured")
    assert p.values_used["smem_bytes_per_clk"] == "hardware table"
    assert p.tile_cycles["mufu"] == 128 * 128 / 15.0
    assert "measured" in p.values_used["poly_exp2"]
    # measured on an H200: leaves the B200 alone
    q = rl.predict("b200", 128, False, None, None, calib=calib)
    assert q.values_used["mufu_ex2_per_clk"] == "hardware table"


def test_hardware_table_has_a_source_for_every_number():
    for g in GPUS.values():
        for f in fields(g):
            if f.name in ("name", "arch", "sources"):
                continue
            assert f.name in g.sources, (g.name, f.name)
    assert get_gpu("sm90").name == "H200" and get_gpu("H100 SXM").name == "H100 SXM"
    assert GPUS["b200"].peak_tflops == pytest.approx(2250, rel=1e-6)
    assert GPUS["h100"].peak_tflops == pytest.approx(989.4, rel=1e-3)


def test_main_prints_table(capsys):
    assert rl.main(["--gpu", "h200", "--hdim", "64", "--mode", "fwd", "--datasheet"]) == 0
    capsys.readouterr()
    rows = rl.report(["--gpu", "h200", "b200", "--hdim", "128", "--datasheet"])
    out = capsys.readouterr().out
    assert "H200" in out and "B200" in out and "values used" in out
    assert {r["variant"] for r in rows} >= {"default", "tau=0", "emu=0", "no-overlap"}
    assert any(r["variant"] == "2cta" for r in rows) and all(
        r["gpu"] == "B200" for r in rows if r["variant"] == "2cta")
    with pytest.raises(SystemExit):
        rl.main(["--variant", "nope"])
    # a Hydra-style mapping works too
    assert len(rl.report({"gpu": "b200", "hdim": [128], "mode": ("bwd",), "datasheet": True})) == 2 * 7
    capsys.readouterr()
    base = rl.report(["--gpu", "h200", "--hdim", "256", "--mode", "fwd", "--variant", "default", "--datasheet"])
    fill = rl.report(["--gpu", "h200", "--hdim", "256", "--mode", "fwd", "--variant", "default", "--datasheet",
                      "--tma-fill"])
    assert "counts the TMA writes" in capsys.readouterr().out
    assert [r["cyc_smem"] > b["cyc_smem"] for r, b in zip(fill, base)] == [True, True]  # causal both
    assert rl.report({"gpu": "h200", "hdim": [256], "mode": ["fwd"], "variant": ["default"], "datasheet": True,
                      "tma_fill": True})[0]["cyc_smem"] == fill[0]["cyc_smem"]


# ---- the calibration microbenchmarks (experiments/microbench): CPU-side checks -------------------------
def test_microbench_skips_cleanly_without_cuda(tmp_path, capsys):
    import torch

    from experiments.microbench.__main__ import main as mb_main

    if torch.cuda.is_available():
        pytest.skip("has CUDA: the skip path is for CPU machines")
    out = tmp_path / "rows.jsonl"
    assert mb_main(["--out", str(out)]) == 0
    assert "skipped" in capsys.readouterr().out and not out.exists()


@pytest.mark.compile
def test_microbench_exp2_variants_stay_off_mufu_when_emulated():
    pytest.importorskip("triton")
    from experiments.microbench import exp2_triton as e

    mufu = e.sass_counts(e.compile_for(0))
    poly = e.sass_counts(e.compile_for(8))
    half = e.sass_counts(e.compile_for(4))
    for c in (mufu, poly, half):
        assert c["F2I"] == 0 and c["FRND"] == 0, c
    assert mufu["MUFU"] > 0 and poly["MUFU"] == 0 and 0 < half["MUFU"] < mufu["MUFU"]
    if poly["source"] == "sass":
        assert poly["FFMA"] >= 3 * 16  # 3 Horner FFMA per exp, 16 chains per thread


@pytest.mark.compile
def test_microbench_gemm_uses_wgmma():
    pytest.importorskip("triton")
    from experiments.microbench import exp2_triton as e
    from experiments.microbench import gemm_bench as g

    c = g.compile_for(90)
    try:
        sass = c.asm["sass"]
    except Exception:
        sass = e._disassemble(c.asm["cubin"])
    if not sass:
        pytest.skip("no SASS disassembler here")
    assert "HGMMA" in e._opcodes(sass)


@pytest.mark.compile
def test_microbench_smem_kernel_compiles_to_vector_loads(tmp_path):
    pytest.importorskip("cutlass")
    import os
    import subprocess
    import sys
    from pathlib import Path

    from experiments.microbench import exp2_triton as e
    from experiments.microbench import smem_cute as s

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(tmp_path), CUTE_DSL_ARCH="sm_90a",
               PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", "from experiments.microbench import smem_cute as s; s.compile_for()"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cubins = list(tmp_path.rglob("*.cubin"))
    assert cubins, "CuTe DSL kept no cubin"
    sass = e._disassemble(cubins[0].read_bytes())
    if not sass:
        pytest.skip("no SASS disassembler here")
    ops = e._opcodes(sass)
    assert ops.count("LDS") >= s.UNROLL  # one 16-byte load per unrolled step inside the loop


def test_peaks_come_from_the_one_hardware_table():
    """Timing rows' peak_tflops and the roofline read one table: the datasheet dense rates follow from per-SM rates."""
    from kernels.hardware import gpu_for_device, peak_tflops

    assert peak_tflops("NVIDIA H200") == pytest.approx(989.4, rel=1e-3)
    assert peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4, rel=1e-3)
    assert peak_tflops("NVIDIA B200") == pytest.approx(2250.0, rel=1e-3)
    assert gpu_for_device("NVIDIA GB300") is GPUS["b300"] and gpu_for_device("NVIDIA H100 PCIe") is None
    assert peak_tflops(None) is None and peak_tflops("NVIDIA A100-SXM4-80GB") is None


def test_backward_tiles_are_the_kernels():
    """The roofline's backward tile is whatever kernels/tiles.py reads from the kernel package (no copy here)."""
    from analysis import roofline as rl
    from kernels import AttnConfig
    from kernels.tiles import bwd_tile

    for hd in (64, 128, 256, 192):
        p = rl.predict("h200", hd, False, None, dict(hdim_v=128 if hd == 192 else hd), mode="bwd", calib={})
        assert p.tile == bwd_tile("sm90", hd, False)
    assert bwd_tile("sm90", 256, True) == (64, 80)  # the 2-CTA pairs' 80-row K/V tiles (bwd_wide_two_cta80.py)
    assert bwd_tile("sm90", 256, True, AttnConfig(deterministic=True)) == (64, 80)  # deterministic too
    assert bwd_tile("sm90", 256, True, AttnConfig(bwd_two_cta_n80=False)) == (64, 64)  # the 64-row pairs
    assert bwd_tile("sm90", 256, True, AttnConfig(two_cta=False)) == (64, 64)  # kernels/sm90/bwd_wide.py
    hdims = {r["hdim"] for r in rl.table(gpus=("h200",), modes=("bwd",), calib={})}
    assert hdims == {"64", "128", "192/128", "256"}


def test_microbench_one_failure_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    import json

    import experiments.microbench as mb
    from experiments.microbench import common, exp2_triton, gemm_bench, smem_cute

    monkeypatch.setattr(common, "cuda_ok", lambda: (True, ""))
    monkeypatch.setattr(common, "gpu_facts", lambda: dict(gpu_name="NVIDIA H200", sms=132))

    def boom(w, facts, **kw):
        raise RuntimeError("no triton here")

    def ok(w, facts, **kw):
        w.add(metric="smem_bytes_per_clk_sm", value=120.0, unit="B/clk/SM", method="fake")

    monkeypatch.setattr(exp2_triton, "run", boom)
    monkeypatch.setattr(gemm_bench, "run", boom)
    monkeypatch.setattr(smem_cute, "run", ok)
    out = tmp_path / "rows.jsonl"
    rows = mb.run_all(str(out), quick=True)
    assert [(r["metric"], r["status"]) for r in rows] == [
        ("exp2_bench", "fail"), ("gemm_bench", "fail"), ("smem_bytes_per_clk_sm", "ok")]
    on_disk = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(on_disk) == 3 and all(r["gpu_name"] == "NVIDIA H200" and r["kind"] == "microbench" for r in on_disk)
    assert "no triton here" in on_disk[0]["reason"]
    with pytest.raises(ValueError, match="only="):
        mb.run_all(str(out), only=["nope"])


def test_a_measured_rate_far_below_the_peak_is_not_used_as_a_ceiling():
    """A GEMM benchmark at 66% of the tensor peak measured itself: the bound keeps the table's peak."""
    from analysis import roofline as rl
    from kernels.hardware import get_gpu

    gpu = get_gpu("H200")
    calib = {"mma_bf16_flops_per_clk_sm": (0.66 * gpu.mma_flops_per_clk, "test gemm", "NVIDIA H200"),
             "mufu_ex2_per_clk_sm": (0.95 * gpu.mufu_ex2_per_clk, "test mufu", "NVIDIA H200")}
    g, _, used = rl.calibrated_gpu(gpu, calib)
    assert g.mma_flops_per_clk == gpu.mma_flops_per_clk and "lower bound" in used["mma_flops_per_clk"]
    assert g.mufu_ex2_per_clk == 0.95 * gpu.mufu_ex2_per_clk and used["mufu_ex2_per_clk"].startswith("measured")


@pytest.mark.parametrize("overrides", [{}, {"two_cta": True}, {"deterministic": True}])
def test_backward_tiles_match_the_kernel_objects(overrides):
    """kernels/tiles.py (which the roofline reads) agrees with the tiles of the backward kernel object that
    kernels/sm90/backward.py builds for the same config (e.g. hd128's 80-row Q tiles, 64 with two_cta)."""
    pytest.importorskip("cutlass")
    from kernels import AttnConfig, ConfigError
    import itertools

    from kernels.sm90 import backward as B
    from kernels.tiles import bwd_tile, compiled_config

    from analysis import roofline as rl

    for (hd, hv), causal in itertools.product(((64, 64), (128, 128), (256, 256), (192, 128)), (False, True)):
        cfg = AttnConfig(**overrides)
        r = B.backward_config(cfg.resolve("sm90", hd, causal), hdim=hd, hdim_v=hv)  # hd256: 2-CTA by default
        try:
            B._check_supported(r, hd, hv)
        except ConfigError:  # e.g. two_cta at the wide head dims
            continue
        main = B._main_kernel(B._cutlass_dtype("bfloat16"), r, hd, hv, causal)
        assert bwd_tile("sm90", hd, causal, cfg) == (main.tile_m, main.tile_n), (hd, causal, overrides)
        assert compiled_config(cfg, "sm90", hd, causal, "bwd")["tile_m"] == main.tile_m
        p = rl.predict("h200", hd, causal, cfg, dict(hdim_v=hv), mode="bwd", calib={})
        assert p.tile == (main.tile_m, main.tile_n)
    assert bwd_tile("sm90", 128, False) == (80, 128)  # today's hd128 default (kernels/config.py DEFAULTS)
