"""GQA / MQA on the CPU (issue 12.1): grouped K/V compile (forward and backward, CUTE_DSL_ARCH=sm_90a, fake tensors),
the group size is a compile-time constant in the cache key (group 1 = the MHA key and kernel, unchanged), the group-4
SASS keeps the MHA main loop (same HGMMA / MUFU / TMA mix, no spills), and the argument checks.

The GPU numerics (vs an fp64 reference with K/V repeated) are in tests/test_gqa_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from kernels.config import AttnConfig  # noqa: E402
from kernels.validate import InputError, check_gqa_heads, check_qkv  # noqa: E402

compile_mark = pytest.mark.compile


# ---- argument checks (no compile) -----------------------------------------------------------------------------------
def _t(h, s=8, d=64):
    return torch.empty(1, s, h, d, dtype=torch.bfloat16)


def test_check_qkv_grouped_heads():
    check_qkv(_t(8), _t(2), _t(2), gqa=True)
    check_qkv(_t(8), _t(1), _t(1), gqa=True)  # MQA
    check_qkv(_t(4), _t(4), _t(4), gqa=True)  # MHA
    with pytest.raises(InputError, match=r"^heads: the K/V heads \(3\) must divide the Q heads \(8\)"):
        check_qkv(_t(8), _t(3), _t(3), gqa=True)
    with pytest.raises(InputError, match=r"^heads: k and v must share the number of heads, got 2 and 4$"):
        check_qkv(_t(8), _t(2), _t(4), gqa=True)
    with pytest.raises(InputError, match=r"must divide the Q heads \(2\)"):
        check_qkv(_t(2), _t(4), _t(4), gqa=True)  # more K/V heads than Q heads
    # without gqa (the reference model, the harness backends) the heads must still agree
    with pytest.raises(InputError, match="q, k, v must share the number of heads"):
        check_qkv(_t(8), _t(2), _t(2))
    assert check_gqa_heads(32, 8, 8) == 4 and check_gqa_heads(8, 1, 1) == 8 and check_gqa_heads(3, 3, 3) == 1


def test_kernel_classes_reject_a_bad_group():
    import cutlass

    from kernels.sm90.bwd import FlashBwdSm90
    from kernels.sm90.fwd import FlashFwdSm90

    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="qhead_per_kvhead"):
            FlashFwdSm90(cutlass.BFloat16, 128, 128, False, qhead_per_kvhead=bad)
        with pytest.raises(ValueError, match="qhead_per_kvhead"):
            FlashBwdSm90(cutlass.BFloat16, 128, False, qhead_per_kvhead=bad)


def test_group_one_keys_are_the_mha_keys():
    """The group is in the cache key only when > 1: the group-1 key, and so the kernel, is the one from before GQA."""
    from kernels.compile_cache import cache_key
    from kernels.interface import fwd_kernel_key

    cfg = AttnConfig().resolve("sm90", 128, True)
    mha = cache_key("fwd", cfg, "bfloat16", 128, 128, True, "sm90")
    assert fwd_kernel_key(cfg, "bfloat16", 128, 128, True) == mha
    assert fwd_kernel_key(cfg, "bfloat16", 128, 128, True, qhead_per_kvhead=1) == mha
    g4 = fwd_kernel_key(cfg, "bfloat16", 128, 128, True, qhead_per_kvhead=4)
    g8 = fwd_kernel_key(cfg, "bfloat16", 128, 128, True, qhead_per_kvhead=8)
    assert len({mha, g4, g8}) == 3


# ---- compiles -------------------------------------------------------------------------------------------------------
FWD_CASES = [  # (hdims, causal, group, switches)
    ((128, 128), True, 4, {}),
    ((64, 64), False, 8, {}),  # MQA with 8 Q heads
    ((256, 256), True, 2, {}),
    ((192, 128), False, 4, {}),
    ((128, 128), True, 32, {"intra_wg_overlap": False}),  # MQA with 32 Q heads, no intra-warpgroup overlap
]


@compile_mark
@pytest.mark.parametrize("hdims,causal,group,switches", FWD_CASES,
                         ids=[f"hd{h[0]}-{'causal' if c else 'full'}-g{g}{'-noverlap' if s else ''}"
                              for h, c, g, s in FWD_CASES])
def test_fwd_gqa_compiles(hdims, causal, group, switches):
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel

    hdim, hdim_v = hdims
    cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
    kern = make_fwd_kernel(cfg, "bfloat16", hdim, hdim_v, causal, qhead_per_kvhead=group)
    assert kern.qhead_per_kvhead == group
    assert compile_fwd(kern, tvm_ffi=False) is not None


@compile_mark
def test_fwd_group_is_its_own_kernel_through_interface():
    from kernels import compile_cache
    from kernels.interface import get_fwd_kernel, resolve_config

    compile_cache.clear()
    cfg = resolve_config(None, 64, False)
    k1, c1 = get_fwd_kernel(cfg, "bfloat16", 64, 64, False, tvm_ffi=False)
    k4, c4 = get_fwd_kernel(cfg, "bfloat16", 64, 64, False, tvm_ffi=False, qhead_per_kvhead=4)
    assert c1 is not c4 and (k1.qhead_per_kvhead, k4.qhead_per_kvhead) == (1, 4)
    assert get_fwd_kernel(cfg, "bfloat16", 64, 64, False, tvm_ffi=False, qhead_per_kvhead=1)[1] is c1


BWD_CASES = [  # (hdims, causal, group, switches)
    ((128, 128), True, 4, {}),
    ((64, 64), False, 8, {"deterministic": True}),
    ((128, 128), True, 4, {"two_cta": True}),
    ((256, 256), True, 4, {}),
    ((192, 128), False, 16, {"deterministic": True}),
]


@compile_mark
@pytest.mark.parametrize("hdims,causal,group,switches", BWD_CASES,
                         ids=[f"hd{h[0]}-{'causal' if c else 'full'}-g{g}-{'-'.join(s) or 'default'}"
                              for h, c, g, s in BWD_CASES])
def test_bwd_gqa_compiles(hdims, causal, group, switches):
    from kernels.sm90.backward import compile_backward

    hdim, hdim_v = hdims
    out = compile_backward(AttnConfig(**switches), "bfloat16", hdim, causal, hdim_v=hdim_v, qhead_per_kvhead=group)
    assert set(out) >= {"pre", "main", "post"}
    mha = compile_backward(AttnConfig(**switches), "bfloat16", hdim, causal, hdim_v=hdim_v)
    assert out["main"] is not mha["main"]
    # group 1 is exactly the MHA entry of the cache
    assert compile_backward(AttnConfig(**switches), "bfloat16", hdim, causal, hdim_v=hdim_v,
                            qhead_per_kvhead=1) is mha


# ---- SASS: the group changes the K/V head index only ----------------------------------------------------------------
def _sass(kern, workdir):
    from sass_cache import kernel_sass  # tests/sass_cache.py: one compile per kernel in the session

    return kernel_sass(kern, workdir)


@compile_mark
def test_fwd_gqa_sass_keeps_the_mha_main_loop(tmp_path):
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, find_nvdisasm, opcode_counts

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip nvidia-cuda-nvdisasm)")
    cfg = AttnConfig().resolve("sm90", 128, True)
    sass = {}
    for g in (1, 4):
        d = tmp_path / f"g{g}"
        d.mkdir()
        sass[g] = _sass(make_fwd_kernel(cfg, "bfloat16", 128, 128, True, qhead_per_kvhead=g), str(d))
    c1, c4 = opcode_counts(sass[1]), opcode_counts(sass[4])
    for op in ("HGMMA", "MUFU.EX2", "UTMALDG", "UTMASTG", "SYNCS", "BAR"):
        assert count(c1, op) == count(c4, op), op
    assert count(c4, "LDL") == 0 and count(c4, "STL") == 0
    assert sass[1] != sass[4]  # the group is compiled in (the K/V head index)
