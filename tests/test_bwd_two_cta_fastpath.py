"""FlashBwdSm90 two_cta switches (CPU, SASS): ``ds_cta_release`` and ``two_cta_dv_first`` (docs/BWD_TWO_CTA.md),
set through AttnConfig.bwd_two_cta_cta_release / bwd_two_cta_dv_first.

- ``ds_cta_release`` (the two_cta default since 2026-12-02; ``bwd_two_cta_cta_release=False`` turns it off): the
  received dS half goes back to the peer (dsempty) with the CTA-scope remote arrive of the pipelines'
  consumer_release. The cluster-scope ``mbarrier.arrive.release.cluster`` compiles to MEMBAR.ALL.CTA + MEMBAR.ALL.GPU +
  ERRBAR in every MMA thread once per Q tile; with the switch the only MEMBAR.ALL.GPU left is the kernel-end cluster
  barrier's (right before UCGABAR_ARV).
- ``two_cta_dv_first`` (hd 128, opt-in): the dV wgmma (HGMMA.64x128, register A) is issued before the dS^T stmatrix,
  the PdS barrier and the DSMEM send (UBLKCP.S.S), as the one-CTA kernel does; the default issues it after the send.

Both: the same HGMMA shapes and counts as the fenced two_cta kernel, 4 WARPGROUP.DEPBAR (no serialised wgmma), 0
LDL / STL.
"""
from __future__ import annotations

import glob
import os
import re
import textwrap

import pytest

import dsl_subprocess  # tests/dsl_subprocess.py

bwd = pytest.importorskip("kernels.sm90.bwd")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sass(tmp_path, name, hd, causal, fields):
    """SASS of the two_cta FlashBwdSm90 main kernel at head dim ``hd`` with the AttnConfig ``fields``."""
    from kernels.sm90.sass import disassemble, find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    dump = tmp_path / name
    dump.mkdir()
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig(two_cta=True, **{fields!r}), "bfloat16", {hd}, {causal})
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=900)  # a fork of a warm worker: tests/dsl_subprocess.py
    cubins = [c for c in glob.glob(str(dump / "*.cubin")) if "bwdFlashBwdSm90" in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


def _ops(sass):
    from kernels.sm90.sass import instructions

    return [op for _, op, _ in instructions(sass)[0]]


def _gpu_membars_outside_cluster_barrier(ops):
    """MEMBAR.ALL.GPU not followed within 4 instructions by the kernel-end cluster barrier (UCGABAR_ARV)."""
    return [i for i, op in enumerate(ops) if op == "MEMBAR.ALL.GPU" and "UCGABAR_ARV" not in ops[i + 1:i + 5]]


def _first(ops, prefix, start=0):
    return next(i for i in range(start, len(ops)) if ops[i].startswith(prefix))


def test_switches_resolve():
    """Both switches are two_cta-only (ignored, False, elsewhere); two_cta_dv_first only at hd 128."""
    import cutlass

    bf16 = cutlass.BFloat16
    k = bwd.FlashBwdSm90(bf16, 128, True, two_cta=True, ds_cta_release=True, two_cta_dv_first=True)
    assert k.ds_cta_release and k.two_cta_dv_first
    k = bwd.FlashBwdSm90(bf16, 128, True, two_cta=False, ds_cta_release=True, two_cta_dv_first=True)
    assert not k.ds_cta_release and not k.two_cta_dv_first
    k = bwd.FlashBwdSm90(bf16, 64, False, two_cta=True, ds_cta_release=True, two_cta_dv_first=True)
    assert k.ds_cta_release and not k.two_cta_dv_first
    k = bwd.FlashBwdSm90(bf16, 128, False, two_cta=True)
    assert not k.ds_cta_release and not k.two_cta_dv_first


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_sass_hd128(tmp_path, causal):
    from kernels.sm90.sass import count, opcode_counts

    base = _sass(tmp_path, "base", 128, causal, dict(bwd_two_cta_cta_release=False))  # the fenced release
    var = _sass(tmp_path, "var", 128, causal, dict(bwd_two_cta_dv_first=True))  # the default release + dv_first
    ob, ov = opcode_counts(base), opcode_counts(var)
    assert not re.search(r"\b(LDL|STL)(\.|\s)", var)
    hgmma = lambda o: {k: v for k, v in o.items() if k.startswith("HGMMA")}
    assert hgmma(ov) == hgmma(ob)
    assert count(ov, "WARPGROUP.DEPBAR") == 4
    # ds_cta_release: the per-tile GPU fence is gone (the fenced kernel has it), only the kernel-end one is left
    b_ops, v_ops = _ops(base), _ops(var)
    assert len(_gpu_membars_outside_cluster_barrier(b_ops)) == 1
    assert _gpu_membars_outside_cluster_barrier(v_ops) == []
    assert count(ov, "MEMBAR.ALL.GPU") == count(ob, "MEMBAR.ALL.GPU") - 1
    # two_cta_dv_first: in the main loop (from the first HGMMA) the dV HGMMA.64x128 comes before the dS^T stmatrix and
    # the DSMEM send; the default sends first
    for ops, dv_first in ((v_ops, True), (b_ops, False)):
        h0 = _first(ops, "HGMMA")
        dv, st, send = _first(ops, "HGMMA.64x128", h0), _first(ops, "STSM", h0), _first(ops, "UBLKCP", h0)
        assert (dv < st < send) if dv_first else (st < send < dv), (dv, st, send)


@pytest.mark.compile
def test_sass_hd64_release(tmp_path):
    """hd 64 (128-row Q tiles), the two_cta default (ds_cta_release; two_cta_dv_first is ignored there): no spills,
    wgmma not serialised, the per-tile GPU fence gone."""
    from kernels.sm90.sass import count, opcode_counts

    var = _sass(tmp_path, "var64", 64, True, dict(bwd_two_cta_dv_first=True))
    ov = opcode_counts(var)
    assert not re.search(r"\b(LDL|STL)(\.|\s)", var)
    assert count(ov, "WARPGROUP.DEPBAR") == 4
    assert _gpu_membars_outside_cluster_barrier(_ops(var)) == []


def test_config_fields_reach_the_kernel():
    """AttnConfig.bwd_two_cta_cta_release / bwd_two_cta_dv_first reach FlashBwdSm90 (backward.py _main_kernel), are
    ignored without two_cta; release is on unless False; both stay out of to_dict() while None (release: or True, the
    default's kernel; dv_first: or False), so release=True compiles under the default's dict."""
    from cutlass import BFloat16

    from kernels import AttnConfig
    from kernels.sm90 import backward as B
    from kernels.tiles import compiled_config

    for causal in (False, True):
        on = AttnConfig(two_cta=True, bwd_two_cta_cta_release=True, bwd_two_cta_dv_first=True).resolve(
            "sm90", 128, causal)
        k = B._main_kernel(BFloat16, on, 128, 128, causal)
        assert k.ds_cta_release and k.two_cta_dv_first
        off = B._main_kernel(BFloat16, AttnConfig(bwd_two_cta_cta_release=True).resolve("sm90", 128, causal), 128,
                             128, causal)
        assert not off.ds_cta_release  # one CTA: ignored
        plain = B._main_kernel(BFloat16, AttnConfig(two_cta=True).resolve("sm90", 128, causal), 128, 128, causal)
        assert plain.ds_cta_release and not plain.two_cta_dv_first
        fenced = B._main_kernel(BFloat16, AttnConfig(two_cta=True, bwd_two_cta_cta_release=False).resolve(
            "sm90", 128, causal), 128, 128, causal)
        assert not fenced.ds_cta_release
    for name in ("bwd_two_cta_cta_release", "bwd_two_cta_dv_first"):
        assert name not in AttnConfig().to_dict()
        assert name not in compiled_config(AttnConfig(**{name: True}), "sm90", 128, False, "fwd")
    assert AttnConfig(bwd_two_cta_dv_first=True).to_dict()["bwd_two_cta_dv_first"] is True
    assert "bwd_two_cta_cta_release" not in AttnConfig(bwd_two_cta_cta_release=True).to_dict()  # True = the default
    assert "bwd_two_cta_dv_first" not in AttnConfig(bwd_two_cta_dv_first=False).to_dict()
    assert AttnConfig(bwd_two_cta_cta_release=False).to_dict()["bwd_two_cta_cta_release"] is False
    for tc in (True, None):
        assert (compiled_config(AttnConfig(two_cta=tc, bwd_two_cta_cta_release=True), "sm90", 128, False, "bwd")
                == compiled_config(AttnConfig(two_cta=tc), "sm90", 128, False, "bwd"))
