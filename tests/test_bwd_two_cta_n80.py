"""CPU tests of the hd256 2-CTA backward with 80-row K/V tiles (``bwd_two_cta_n80``, kernels/sm90/bwd_wide_two_cta80.py),
compiled for sm_90a and disassembled: the swapped GEMM shapes (S / dP 64 x 40 per warpgroup, dK^T / dV^T 64 x 80 with a
transposed A operand, dQ^T 64 x 64 over both K/V tiles), dQ added from registers with 16-byte reductions (8 per thread
and Q tile, no bulk reduction, no writer warp), the dS tile sent to the peer, no spills and no serialised wgmma; the
deterministic turns; plus the config plumbing and the shared-memory plan."""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import textwrap

import pytest

import dsl_subprocess  # tests/dsl_subprocess.py

pytestmark = pytest.mark.compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sass(tmp_path, causal, dtype, deterministic=False):
    from kernels.sm90.sass import disassemble, find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    dump = tmp_path / f"n80_c{int(causal)}_{dtype}_d{int(deterministic)}"
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig(two_cta=True, bwd_two_cta_n80=True, deterministic={deterministic}), {dtype!r}, 256,
                         {causal}, hdim_v=256)
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if "FlashBwdWide80TwoCtaSm90" in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


@pytest.mark.parametrize("causal,dtype", [(False, "bfloat16"), (True, "float16")], ids=["noncausal-bf16", "causal-fp16"])
def test_n80_sass(tmp_path, causal, dtype):
    from kernels.sm90.sass import opcode_counts

    oc = opcode_counts(_sass(tmp_path, causal, dtype))
    hg = lambda shape: sum(v for k, v in oc.items() if k.startswith(f"HGMMA.{shape}.F32"))
    # S, dP: 64 x 40 over K = 256 (16 each); dV^T, dK^T: two 64-row atoms x K = 64 (8 each); dQ^T: K = 80 + 80 (5 + 5)
    assert (hg("64x40x16"), hg("64x80x16"), hg("64x64x16")) == (32, 16, 10), oc
    assert sum(v for k, v in oc.items() if k.startswith(("LDL", "STL"))) == 0, "spills"
    assert sum(v for k, v in oc.items() if k.startswith("REDG.E.ADD.F32x4")) == 8  # 32 dQ values per thread
    assert not any(k.startswith(("UBLKRED", "RED.E.ADD.F32.", "REDG.E.ADD.F32.")) for k in oc), oc  # no other dQ path
    assert oc.get("UBLKCP.S.S", 0) == 1  # this CTA's dS tile to the peer
    assert sum(v for k, v in oc.items() if k.startswith("STSM.16.MT88.2")) == 10  # P and dS: 5 x2 stores each
    assert oc.get("WARPGROUP.DEPBAR.LE", 0) <= 4  # asynchronous wgmma chains (no per-wgmma waits)
    assert sum(v for k, v in oc.items() if k.startswith("MUFU.EX2")) == 40  # 20 per thread, masked and plain paths
    assert not any(k.startswith(("REDG.E.ADD.S32", "LDG.E.STRONG")) for k in oc), oc  # no semaphore without determinism


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_n80_deterministic_sass(tmp_path, causal):
    """deterministic: the same 8 fp32 reductions per thread, one semaphore release (red.release.gpu after a GPU fence)
    and acquire polls (warp 1's dq_turns), wgmma chains still asynchronous, no spills."""
    from kernels.sm90.sass import opcode_counts

    plain = opcode_counts(_sass(tmp_path, causal, "bfloat16"))
    det = opcode_counts(_sass(tmp_path, causal, "bfloat16", deterministic=True))
    assert sum(v for k, v in det.items() if k.startswith("REDG.E.ADD.F32x4")) == 8
    assert det.get("REDG.E.ADD.S32.STRONG.GPU", 0) == 1 and det.get("LDG.E.STRONG.GPU", 0) >= 1, det
    assert det.get("MEMBAR.ALL.GPU", 0) > plain.get("MEMBAR.ALL.GPU", 0)
    assert sum(v for k, v in det.items() if k.startswith(("LDL", "STL"))) == 0, "spills"
    assert det.get("WARPGROUP.DEPBAR.LE", 0) <= 4
    hg = lambda oc: {k: v for k, v in oc.items() if k.startswith("HGMMA")}
    assert hg(det) == hg(plain)


def test_n80_config_plumbing():
    from kernels import AttnConfig
    from kernels.config import ConfigError
    from kernels.sm90.backward import _check_supported, _main_kernel, backward_config
    from kernels.sm90.bwd_wide_two_cta import FlashBwdWideTwoCtaSm90
    from kernels.sm90.bwd_wide_two_cta80 import FlashBwdWide80TwoCtaSm90

    import cutlass

    def resolved(**kw):
        return backward_config(AttnConfig(**kw).resolve("sm90", 256, False), hdim=256, hdim_v=256)

    on = resolved(bwd_two_cta_n80=True)  # two_cta None -> the per-call default (on at hd256)
    assert on.two_cta is True
    _check_supported(on, 256, 256)
    main = _main_kernel(cutlass.BFloat16, on, 256, 256, False)
    assert type(main) is FlashBwdWide80TwoCtaSm90 and main.tile_n == 80 and main.tile_m == 64
    assert main.post_layout() == dict(chunks=4, transposed=True, dq_shape=(64, 64))
    # the default: 80-row tiles for 2-CTA calls, deterministic ones too; the 64-row pairs with bwd_rotate_q or
    # bwd_two_cta_n80=False; one CTA (window / softcap / varlen: two_cta off) never
    for kw in (dict(), dict(deterministic=True)):
        assert resolved(**kw).bwd_two_cta_n80 is True, kw
        assert type(_main_kernel(cutlass.BFloat16, resolved(**kw), 256, 256, False)) is FlashBwdWide80TwoCtaSm90, kw
    for kw in (dict(bwd_rotate_q=True), dict(bwd_two_cta_n80=False), dict(bwd_two_cta_n80=False, deterministic=True)):
        cfg = resolved(**kw)
        assert not cfg.bwd_two_cta_n80, kw
        assert type(_main_kernel(cutlass.BFloat16, cfg, 256, 256, False)) is FlashBwdWideTwoCtaSm90, kw
    for kw in (dict(softcap=True), dict(varlen=True), dict(features=True)):
        assert not backward_config(AttnConfig().resolve("sm90", 256, False), hdim=256, hdim_v=256,
                                   **kw).bwd_two_cta_n80, kw
    assert not backward_config(AttnConfig().resolve("sm90", 128, False), hdim=128, hdim_v=128).bwd_two_cta_n80
    with pytest.raises(ConfigError, match="bwd_rotate_q"):
        _check_supported(resolved(bwd_two_cta_n80=True, bwd_rotate_q=True), 256, 256)
    det = resolved(bwd_two_cta_n80=True, deterministic=True)
    _check_supported(det, 256, 256)
    det_main = _main_kernel(cutlass.BFloat16, det, 256, 256, True)
    assert det_main.deterministic and det_main.dq_turn_warp and det_main.spt  # causal: spt turns and launch
    assert not det_main.m_rotate and not det_main.det_rotate
    rot_main = _main_kernel(cutlass.BFloat16, dataclasses.replace(det, det_schedule="rotate"), 256, 256, False)
    assert rot_main.det_rotate and rot_main.m_rotate  # non-causal "rotate": the pairs' rotated walks
    assert not main.dq_turn_warp and not FlashBwdWideTwoCtaSm90.dq_turn_warp and not main.m_rotate
    with pytest.raises(ConfigError, match="bwd_two_cta_n80"):
        _check_supported(resolved(bwd_two_cta_n80=True, two_cta=False), 256, 256)
    with pytest.raises(ConfigError, match="bwd_two_cta_n80"):
        _check_supported(backward_config(AttnConfig(two_cta=True, bwd_two_cta_n80=True).resolve("sm90", 256, False),
                                         hdim=256, hdim_v=256), 256, 256, features=True)
    cfg128 = backward_config(AttnConfig(bwd_two_cta_n80=True).resolve("sm90", 128, False), hdim=128, hdim_v=128)
    with pytest.raises(ConfigError, match="bwd_two_cta_n80"):
        _check_supported(cfg128, 128, 128)
    # off: left out of the dict (hashes and compile keys of every other config unchanged); on: a key of its own
    assert "bwd_two_cta_n80" not in AttnConfig(bwd_two_cta_n80=False).to_dict()
    assert AttnConfig(bwd_two_cta_n80=True).to_dict()["bwd_two_cta_n80"] is True


def test_n80_shared_memory_plan():
    """Q 2 stages + dO 1 stage (with LSE / dPsum), K + V + the peer's K half at 80 rows, P + dS + the received dS: the
    tiles alone are 226 KB, and the kernel's struct (mbarriers, 1 KB-aligned tiles) fits the 227 KB opt-in limit."""
    import cutlass

    from kernels import AttnConfig
    from kernels.sm90.backward import _main_kernel, backward_config
    from kernels.sm90.bwd import SMEM_BYTES

    cfg = backward_config(AttnConfig(bwd_two_cta_n80=True).resolve("sm90", 256, True), hdim=256, hdim_v=256)
    main = _main_kernel(cutlass.Float16, cfg, 256, 256, True)
    tiles = 2 * 64 * 256 * 2 + 64 * 256 * 2 + 80 * 512 * 2 + 80 * 128 * 2 + 3 * 64 * 80 * 2
    assert tiles == 231424 and main.smem_bytes == tiles + 3 * 64 * 4
    assert main.smem_bytes + 256 <= SMEM_BYTES == 232448
    with pytest.raises(ValueError, match="two_cta"):
        type(main)(cutlass.Float16, 256, True, two_cta=False)
