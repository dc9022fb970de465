"""SASS checks of the sm90 backward main kernel (compiled on the CPU for sm_90a, disassembled with nvdisasm).

deterministic=True must contain the ordering (a strong acquire load in a spin loop, a release add on the
semaphore, a GPU-scope fence) and plain mode must not; every variant issues HGMMA; the exp2 fraction decides
how many MUFU.EX2 the P recomputation keeps.
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


def _main_sass(tmp_path, deterministic, frac, causal=True, hdim=128):
    dump = tmp_path / f"d{int(deterministic)}_{frac}_{int(causal)}_{hdim}"
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig(deterministic={deterministic}, exp2_emu_fraction={frac}), "bfloat16", {hdim}, {causal})
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if "FlashBwdSm90" in c]
    assert len(cubins) == 1, cubins
    return subprocess.run([_nvdisasm(), "-c", cubins[0]], check=True, capture_output=True, text=True).stdout


def test_deterministic_ordering_in_sass(tmp_path):
    det = _main_sass(tmp_path, True, 0.0)
    plain = _main_sass(tmp_path, False, 0.0)
    for sass in (det, plain):
        assert "HGMMA.64x64x16.F32.BF16" in sass and "HGMMA.64x128x16.F32.BF16" in sass
        assert "REDG.E.ADD.F32" in sass  # fp32 dQ accumulation in global memory
    # acquire spin: a strong GPU-scope load of the semaphore, and a backward branch around it
    assert re.search(r"LDG\.E\.STRONG\.GPU", det)
    assert re.search(r"RED(G)?\.E\.ADD(\.S32)?\.STRONG\.GPU", det.replace("REDG.E.ADD.F32", ""))
    assert "MEMBAR" in det or "FENCE" in det
    assert not re.search(r"LDG\.E\.STRONG\.GPU", plain)
    assert "REDG.E.ADD.S32" not in plain


def test_exp2_fraction_in_sass(tmp_path):
    mufu_none = _main_sass(tmp_path, False, 0.0, causal=False, hdim=64).count("MUFU.EX2")
    mufu_half = _main_sass(tmp_path, False, 0.5, causal=False, hdim=64).count("MUFU.EX2")
    mufu_all = _main_sass(tmp_path, False, 1.0, causal=False, hdim=64).count("MUFU.EX2")
    assert mufu_none == 32 and mufu_half == 16 and mufu_all == 0, (mufu_none, mufu_half, mufu_all)
