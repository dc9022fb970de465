"""Packed GQA forward (AttnConfig.pack_gqa, issue 12.1), CPU only: the config field (left out of dicts, hashes and
keys while None = decided per call; forward-only), the per-call rule, the refused combinations (persistent, cluster, varlen, tile_m not a multiple of the group)
as one-line ConfigErrors, the key and kernel of a group of 1 (the plain ones), the K/V blocks a packed tile visits (every
visible (row, key) pair lies in a visited block, every unmasked block is fully visible, by the row's query position
r // group), compiles, and the SASS against the per-Q-head GQA kernel: no local-memory spills, the same wgmma waits
(WARPGROUP.DEPBAR), HGMMA and MUFU.EX2 counts, Q loaded and O stored as 5-D TMA boxes (head dim, group, positions,
K/V head, batch). GPU numerics: tests/test_pack_gqa_gpu.py.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.tiles import compiled_config  # noqa: E402

compile_mark = pytest.mark.compile


# ---- config: field, hashes, keys ------------------------------------------------------------------------------------
def test_field_validates_and_stays_out_of_dicts_when_per_call():
    base = AttnConfig()
    assert base.pack_gqa is None and "pack_gqa" not in base.to_dict()
    r = base.resolve("sm90", 128, True)
    assert r.pack_gqa is None and "pack_gqa" not in r.to_dict() and r.is_resolved
    assert base.op_string == "{}"
    off = AttnConfig(pack_gqa=False)  # forced off: a different config from "decided per call"
    assert off.to_dict()["pack_gqa"] is False and off.config_hash() != base.config_hash()
    on = AttnConfig(pack_gqa=True)
    assert on.to_dict()["pack_gqa"] is True and on.config_hash() not in (base.config_hash(), off.config_hash())
    assert AttnConfig.from_dict(on.to_dict()) == on and on.op_string == '{"pack_gqa":true}'
    for bad in (1, 0, "true", 2.0):
        with pytest.raises(ConfigError, match="^pack_gqa=.*must be None .* or a bool$"):
            AttnConfig(pack_gqa=bad)


def test_per_call_rule_packs_when_the_q_tile_would_be_padding():
    from kernels.config import pack_gqa_by_default as rule
    from kernels.interface import forward_config

    auto = AttnConfig().resolve("sm90", 128, False)  # tile_m 128
    assert [rule(auto, 128, s, 8) for s in (1, 64, 127, 128, 4096)] == [True, True, True, False, False]
    assert not rule(auto, 128, 1, 1)  # no group
    assert not rule(auto, 128, 1, 3)  # 128 rows are not a multiple of the group
    assert not rule(auto, 128, 1, 8, varlen=True)
    assert not rule(AttnConfig(persistent=True).resolve("sm90", 128, False), 128, 1, 8)
    assert not rule(AttnConfig(cluster_m=2).resolve("sm90", 128, False), 128, 1, 8)
    assert not rule(AttnConfig().resolve("sm90", 192, False), 192, 1, 8)  # no GPU-tested packed kernel at (192, 128)
    assert not rule(AttnConfig(pack_gqa=False).resolve("sm90", 128, False), 128, 1, 8)
    assert rule(AttnConfig(pack_gqa=True).resolve("sm90", 128, False), 128, 4096, 8)
    # forward_config: packed -> True and never persistent; otherwise None (the plain kernel's key), whatever was asked
    hd64 = AttnConfig().resolve("sm90", 64, True)  # tile_m 192; persistent by default up to seqlen 1024
    assert forward_config(hd64, 64, True, 1, 4).pack_gqa is True and forward_config(hd64, 64, True, 1, 4).persistent is None
    long = forward_config(hd64, 64, True, 512, 4)
    assert long.pack_gqa is None and long.persistent is True
    forced_off = forward_config(AttnConfig(pack_gqa=False).resolve("sm90", 64, True), 64, True, 1, 4)
    # the plain GQA kernel, persistent at seqlen 1 by the length: DEFAULTS' persistent_tile (128-row tiles at hd64
    # causal, on the greedy walk)
    assert forced_off == dataclasses.replace(hd64, persistent=True, tile_m=128, consumer_regs=240, producer_regs=24,
                                             persistent_greedy=True)


def test_refused_with_persistent_or_cluster():
    for kw, what in (({"persistent": True}, "persistent=True"), ({"cluster_m": 2}, "cluster_m=2")):
        with pytest.raises(ConfigError) as e:
            AttnConfig(pack_gqa=True, **kw)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"pack_gqa=True with {what}"), msg
    AttnConfig(pack_gqa=True, persistent=False)


def test_forward_only_field():
    on = AttnConfig(pack_gqa=True)
    for hd in (64, 128):
        assert (compiled_config(on, "sm90", hd, True, mode="bwd")
                == compiled_config(AttnConfig(), "sm90", hd, True, mode="bwd"))
    assert compiled_config(on, "sm90", 128, False)["pack_gqa"] is True
    assert "pack_gqa" not in compiled_config(AttnConfig(), "sm90", 128, False)


def test_forward_config_packs_only_a_group_and_never_persistent():
    from kernels.interface import forward_config, fwd_kernel_key

    plain = AttnConfig().resolve("sm90", 64, True)
    on = AttnConfig(pack_gqa=True).resolve("sm90", 64, True)
    # hd64 at seqlen 512 runs persistent by default; the packed kernel has no persistent variant
    assert forward_config(plain, 64, True, 512, 4).persistent is True
    packed = forward_config(on, 64, True, 512, 4)
    assert packed.pack_gqa and packed.persistent is None
    assert forward_config(AttnConfig(pack_gqa=True, persistent=False).resolve("sm90", 64, True), 64, True, 512,
                          4).persistent is None
    # group 1: the plain kernel, its config and key (no error)
    one = forward_config(on, 64, True, 512, 1)
    assert one == forward_config(plain, 64, True, 512, 1)
    assert fwd_kernel_key(one, "bfloat16", 64, 64, True) == fwd_kernel_key(forward_config(plain, 64, True, 512),
                                                                              "bfloat16", 64, 64, True)
    # the packed key differs from the per-Q-head GQA key of the same group
    long_plain = forward_config(plain, 64, True, 4096, 4)
    assert fwd_kernel_key(packed, "bfloat16", 64, 64, True, 4) != fwd_kernel_key(long_plain, "bfloat16", 64, 64, True, 4)


def test_kernel_class_refuses_what_it_cannot_pack():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, True, qhead_per_kvhead=4, pack_gqa=True).tile_q == 32
    assert FlashFwdSm90(bf, 128, 128, True, qhead_per_kvhead=4).tile_q == 128
    for kw, why in (({"qhead_per_kvhead": 1}, "qhead_per_kvhead=1"),
                    ({"qhead_per_kvhead": 4, "varlen": True}, "varlen"),
                    ({"qhead_per_kvhead": 4, "persistent": True}, "persistent"),
                    ({"qhead_per_kvhead": 4, "cluster_m": 2, "causal": False}, "cluster_m=2"),
                    ({"qhead_per_kvhead": 3}, "tile_m=128 not a multiple of the group 3")):
        args = dict(causal=True)
        args.update(kw)
        with pytest.raises(ValueError, match=f"^pack_gqa=True with {why}"):
            FlashFwdSm90(bf, 128, 128, args.pop("causal"), pack_gqa=True, **args)


def test_interface_errors_are_one_line_config_errors():
    """A group that does not divide tile_m, and varlen with a group: ConfigErrors before anything compiles."""
    from kernels.interface import get_fwd_kernel
    from kernels.varlen import get_varlen_fwd_kernel

    cfg = AttnConfig(pack_gqa=True).resolve("sm90", 128, True)  # tile_m 128
    for fn in (get_fwd_kernel, get_varlen_fwd_kernel):
        with pytest.raises(ConfigError) as e:
            fn(cfg, "bfloat16", 128, 128, True, tvm_ffi=False, qhead_per_kvhead=3 if fn is get_fwd_kernel else 2)
        assert "\n" not in str(e.value) and str(e.value).startswith("pack_gqa=True with "), str(e.value)


# ---- the K/V blocks of a packed tile (plain Python: the kernel's tile_blocks with tile_q = tile_m / group) -----------
def _visible(pos, key, s_q, s_k, causal, left, right):
    off = s_k - s_q
    if key >= s_k:
        return False
    r = 0 if causal else right
    if r >= 0 and key > pos + off + r:
        return False
    return not (left >= 0 and key < pos + off - left)


@pytest.mark.parametrize("causal,left,right", [(True, -1, -1), (False, -1, -1), (True, 40, -1), (False, 33, 70),
                                               (False, -1, 5)])
def test_packed_tile_visits_every_visible_block(causal, left, right):
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90
    from kernels.sm90.mask import window_block_range

    tile_m, tile_n = 128, 64
    for g in (2, 4, 8):
        kern = FlashFwdSm90(cutlass.BFloat16, 128, 128, causal, tile_m=tile_m, tile_n=tile_n, qhead_per_kvhead=g,
                            window_left=left, window_right=right, pack_gqa=True)
        tile_q = kern.tile_q  # what the kernel's tile_blocks passes as the tile's query positions
        assert tile_q == tile_m // g
        for s_q, s_k in ((1, 1), (1, 300), (17, 200), (128, 128), (100, 77), (300, 1000)):
            for m_block in range(-(-s_q * g // tile_m)):
                lo, hi, masked_from, local_end = window_block_range(m_block, tile_q, tile_n, s_q, s_k, causal, left,
                                                                    right)
                if left < 0:
                    local_end = 0
                rows = [r for r in range(m_block * tile_m, (m_block + 1) * tile_m) if r < s_q * g]
                for n in range(-(-s_k // tile_n)):
                    keys = range(n * tile_n, (n + 1) * tile_n)
                    vis = [[_visible(r // g, j, s_q, s_k, causal, left, right) for j in keys] for r in rows]
                    if any(map(any, vis)):
                        assert lo <= n < hi, (g, s_q, s_k, m_block, n)
                    # unmasked (the first block visited, hi - 1, is always masked): every (row, key) visible
                    if lo <= n < hi - 1 and local_end <= n < masked_from:
                        assert all(map(all, vis)), (g, s_q, s_k, m_block, n)


# ---- compiles and SASS ----------------------------------------------------------------------------------------------
def _sass(hd, causal, group, pack, workdir, window=(-1, -1), **switches):
    from kernels.sm90.compile import make_fwd_kernel
    from sass_cache import kernel_sass  # tests/sass_cache.py: one compile per kernel in the session

    cfg = AttnConfig(pack_gqa=pack, **switches).resolve("sm90", hd, causal)
    kern = make_fwd_kernel(cfg, "bfloat16", hd, hd, causal, qhead_per_kvhead=group, window_left=window[0],
                           window_right=window[1])
    assert kern.pack_gqa is pack
    return kernel_sass(kern, workdir)


def _need_nvdisasm():
    from kernels.sm90.sass import find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip nvidia-cuda-nvdisasm)")


@compile_mark
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_sass_matches_the_gqa_main_loop(hd, causal, tmp_path):
    from kernels.sm90.sass import count, opcode_counts

    _need_nvdisasm()
    group = 4
    plain = _sass(hd, causal, group, False, str(tmp_path / "gqa"))
    packed = _sass(hd, causal, group, True, str(tmp_path / "packed"))
    cp, cg = opcode_counts(packed), opcode_counts(plain)
    assert count(cp, "LDL") == 0 and count(cp, "STL") == 0, "packed kernel spills"
    for op in ("WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "HGMMA", "MUFU.EX2", "UTMALDG", "UTMASTG", "BAR"):
        assert count(cp, op) == count(cg, op), (op, count(cp, op), count(cg, op))
    # Q in as (head dim, group, positions, K/V head, batch) boxes, O out the same way; K/V stay 4-D
    assert count(cp, "UTMALDG.5D") == hd // 64 and count(cp, "UTMASTG.5D") == hd // 64
    assert count(cg, "UTMALDG.5D") == 0 and count(cg, "UTMASTG.5D") == 0
    assert packed != plain


@compile_mark
@pytest.mark.parametrize("hd,causal,group,window,switches", [
    (128, True, 8, (-1, -1), {}),
    (128, False, 2, (32, 32), {}),
    (64, True, 4, (64, -1), {}),  # causal + left window
    (64, False, 4, (-1, 32), {}),  # right-only window (the per-Q-head hd64 kernel spills here)
    (64, False, 3, (-1, -1), {}),  # tile_m 192: a group of 3 divides it
    (128, True, 4, (-1, -1), {"intra_wg_overlap": False}),
    (128, True, 4, (-1, -1), {"rescale_threshold": 0.0}),
], ids=["hd128-causal-g8", "hd128-window-g2", "hd64-causal-left-g4", "hd64-right-g4", "hd64-g3", "hd128-nooverlap",
        "hd128-tau0"])
def test_packed_variants_compile_without_spills(hd, causal, group, window, switches, tmp_path):
    from kernels.sm90.sass import count, opcode_counts

    _need_nvdisasm()
    c = opcode_counts(_sass(hd, causal, group, True, str(tmp_path), window=window, **switches))
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    assert count(c, "UTMALDG.5D") == hd // 64


@compile_mark
def test_packed_kernel_is_its_own_cache_entry():
    from kernels import compile_cache
    from kernels.interface import get_fwd_kernel

    compile_cache.clear()
    plain = AttnConfig().resolve("sm90", 64, False)
    on = AttnConfig(pack_gqa=True).resolve("sm90", 64, False)
    k_g, c_g = get_fwd_kernel(plain, "bfloat16", 64, 64, False, tvm_ffi=False, qhead_per_kvhead=4)
    k_p, c_p = get_fwd_kernel(on, "bfloat16", 64, 64, False, tvm_ffi=False, qhead_per_kvhead=4)
    assert c_g is not c_p and (k_g.pack_gqa, k_p.pack_gqa) == (False, True)
    assert get_fwd_kernel(on, "bfloat16", 64, 64, False, tvm_ffi=False, qhead_per_kvhead=4)[1] is c_p
