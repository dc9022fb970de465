"""CPU checks of the (hdim 192, hdim_v 128) backward with 64 x 128 tiles (kernels/sm90/bwd_wide192.py, FlashBwd192Sm90):
the plan (tiles, shared memory), backward.py's routing (a softcap stays on bwd_wide.py's 64 x 64 kernel), and the SASS
of every variant (compiled for sm_90a, disassembled with nvdisasm): no spills, the wgmma shapes of the design, four
WARPGROUP.DEPBAR (no serialised wgmma), dQ by the writer warp's bulk reductions, dK / dV by TMA stores."""
from __future__ import annotations

import glob
import os
import re
import textwrap

import pytest

import dsl_subprocess  # tests/dsl_subprocess.py

pytestmark = pytest.mark.compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plan_and_routing():
    cutlass = pytest.importorskip("cutlass")
    from kernels import AttnConfig
    from kernels.sm90 import backward as B
    from kernels.sm90.bwd_wide import FlashBwdWideSm90
    from kernels.sm90.bwd_wide192 import WIDE192_BWD_TILES, FlashBwd192Sm90

    assert WIDE192_BWD_TILES == {(192, 128): (64, 128)}
    k = FlashBwd192Sm90(cutlass.BFloat16, 192, True, hdim_v=128)
    assert (k.tile_m, k.tile_n, k.q_stages, k.do_stages, k.ds_stages, k.dq_stages) == (64, 128, 2, 2, 1, 1)
    assert k.dq_shape == (64, 96) and k.num_mma_wg * k.dq_pieces == 2  # bwd_post's chunks: as the 64 x 64 kernel
    # Q 2 x 24 KB, dO 2 x 16 KB, K 48 KB, V 32 KB, dS^T 16 KB, dQ staging 48 KB, LSE / dPsum 4 x 256 B
    assert k.smem_bytes == 2 * 24576 + 2 * 16384 + 49152 + 32768 + 16384 + 49152 + 1024
    assert k.smem_bytes + 1024 <= 227 * 1024
    for kw, msg in ((dict(two_cta=True), "two_cta"), (dict(softcap=30.0), "softcap"), (dict(tile_m=128), "bwd_tile_m")):
        with pytest.raises(ValueError, match=msg):
            FlashBwd192Sm90(cutlass.BFloat16, 192, False, hdim_v=128, **kw)
    dt = B._cutlass_dtype("bfloat16")
    for causal in (False, True):
        cfg = AttnConfig().resolve("sm90", 192, causal)
        assert type(B._main_kernel(dt, cfg, 192, 128, causal)) is FlashBwd192Sm90
        assert type(B._main_kernel(dt, cfg, 192, 128, causal, features=dict(window_left=64))) is FlashBwd192Sm90
        assert type(B._main_kernel(dt, cfg, 192, 128, causal, features=dict(softcap=30.0))) is FlashBwdWideSm90
        assert type(B._main_kernel(dt, cfg, 192, 128, causal, qhead_per_kvhead=4)) is FlashBwd192Sm90
    det = AttnConfig(deterministic=True, det_schedule="naive").resolve("sm90", 192, True)
    assert type(B._main_kernel(dt, det, 192, 128, True)) is FlashBwd192Sm90


def _sass(tmp_path, name, cfg="", kw="", dtype="bfloat16", causal=True, kernel="FlashBwd192Sm90"):
    from kernels.sm90.sass import disassemble, find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    dump = tmp_path / name
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig({cfg}), {dtype!r}, 192, {causal}, hdim_v=128{', ' + kw if kw else ''})
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)  # a fork of a warm worker: tests/dsl_subprocess.py
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if kernel in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


VARIANTS = [
    ("causal-bf16", "", "", "bfloat16", True),
    ("noncausal-fp16", "", "", "float16", False),
    ("det-causal", "deterministic=True", "", "bfloat16", True),
    ("det-naive-noncausal-fp16", "deterministic=True, det_schedule='naive'", "", "float16", False),
    ("window-noncausal", "", "window_left=128, window_right=128", "bfloat16", False),
    ("window-causal-gqa4", "", "window_left=200, qhead_per_kvhead=4", "float16", True),
    ("emu0.5-noncausal", "exp2_emu_fraction=0.5", "", "bfloat16", False),
]


@pytest.mark.parametrize("name,cfg,kw,dtype,causal", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_sass(tmp_path, name, cfg, kw, dtype, causal):
    from kernels.sm90.sass import count, opcode_counts

    sass = _sass(tmp_path, name, cfg, kw, dtype, causal)
    ops = opcode_counts(sass)
    assert not re.search(r"\b(LDL|STL)\b", sass), f"spills: {name}"
    fp = "F32.BF16" if dtype == "bfloat16" else "F32"
    # per warpgroup and Q tile: S^T 12 + dP^T 8 of 64 x 64 (K = 192 / 128), dV 4 of 64 x 128 and dK 4 of 64 x 192 from
    # registers (K = 64), dQ 8 of 64 x 96 (K = 128)
    hg = {op: n for op, n in ops.items() if op.startswith("HGMMA")}
    assert hg == {f"HGMMA.64x64x16.{fp}": 20, f"HGMMA.64x128x16.{fp}": 4, f"HGMMA.64x192x16.{fp}": 4,
                  f"HGMMA.64x96x16.{fp}": 8}, hg
    assert len(re.findall(r"HGMMA\.64x(128|192)x16\.\S+ R\d+, R\d+, gdesc", sass)) == 8  # dV, dK: A from registers
    # the wgmma chains stay asynchronous (ptxas serialises them all, one DEPBAR per HGMMA, when registers run out)
    assert count(ops, "WARPGROUP.DEPBAR") <= 4
    assert count(ops, "UBLKRED") == 2 and "UBLKRED.G.S.ADD.F32" in sass  # one bulk reduction per warpgroup chunk
    assert not re.search(r"REDG\.E\.ADD\.F32", sass) and not re.search(r"\bSTG\.E", sass)
    assert "STSM" in sass and "UTMASTG" in sass and "MULTICAST" not in sass
    assert bool(re.search(r"LDG\.E\.STRONG\.GPU", sass)) == ("deterministic" in cfg)
    if "exp2_emu" not in cfg:
        assert count(ops, "MUFU.EX2") == 64  # 32 per thread and Q tile, in the masked and the unmasked loop


@pytest.mark.parametrize("causal,kw", [(True, "softcap=30.0"), (False, "window_left=128, window_right=128, softcap=50.0")],
                         ids=["softcap-causal", "softcap-window-noncausal"])
def test_softcap_runs_the_64x64_kernel(tmp_path, causal, kw):
    """(192, 128) with a softcap stays on bwd_wide.py's 64 x 64 kernel: its SASS without spills or serialised wgmma."""
    from kernels.sm90.sass import count, opcode_counts

    sass = _sass(tmp_path, "softcap", "", kw, "bfloat16", causal, kernel="FlashBwdWideSm90")
    ops = opcode_counts(sass)
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert count(ops, "WARPGROUP.DEPBAR") <= 4 and "HGMMA.64x32x16.F32.BF16" in ops
