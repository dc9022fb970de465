"""AttnConfig.bwd_diag_align (on by default at hd128 causal, DEFAULTS' pair): the hd128 causal backward's 80-row Q tiles walked from each K/V tile's diagonal
row (kernels/sm90/bwd.py FlashBwdSm90._set_diag_align), dQaccum chunk-major (bwd_post.py ``chunk_major``).

CPU only: the field (hash, validation, compiled config), where the kernel takes it, the walk's row arithmetic against
the default's (rows computed per head), and the SASS of the three kernels (sm_90a, nvdisasm). GPU correctness:
tests/test_bwd_diag_align_gpu.py.
"""
from __future__ import annotations

import math
import re

import pytest

from test_bwd_sass import _bwd_kernels_sass


def _walk(sq, sk, tm=80, tn=128, align=True):
    """(first row, tile count) of each K/V tile's causal Q walk: the kernel's arithmetic (cta_work / tile_schedule)."""
    out = []
    for n in range(-(-sk // tn)):
        first = max(0, n * tn - (sk - sq))
        if align:
            r0 = first // 8 * 8
            out.append((r0, max(0, -(-(sq - r0) // tm))))
        else:
            m0 = first // tm
            out.append((m0 * tm, -(-sq // tm) - m0))
    return out


def test_diag_align_field():
    """None is left out of to_dict() (old hashes and keys), an explicit value is its own config; resolve() leaves it
    the DEFAULTS pair (on at hd128 causal only); dropped from the forward's compiled config; validated."""
    from kernels import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert "bwd_diag_align" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_diag_align=True).config_hash() != AttnConfig().config_hash()
    assert AttnConfig(bwd_diag_align=False).config_hash() != AttnConfig(bwd_diag_align=True).config_hash()
    for hd in (64, 128):
        for causal in (False, True):
            assert AttnConfig().resolve("sm90", hd, causal).bwd_diag_align is (True if (hd, causal) == (128, True)
                                                                               else None)
            assert AttnConfig(bwd_diag_align=False).resolve("sm90", hd, causal).bwd_diag_align is False
    assert "bwd_diag_align" not in compiled_config(AttnConfig(bwd_diag_align=True), "sm90", 128, True, "fwd")
    assert compiled_config(AttnConfig(bwd_diag_align=True), "sm90", 128, True, "bwd")["bwd_diag_align"] is True
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="bwd_diag_align"):
            AttnConfig(bwd_diag_align=bad)


def test_diag_align_where_it_applies():
    """Only hd128 causal 80-row tiles, not deterministic, one CTA, not varlen, no window / softcap; the postprocess reads
    chunk-major then (and only then)."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel, _post_layout

    dt = _cutlass_dtype("bfloat16")

    def main(hd=128, causal=True, varlen=False, features=None, **kw):
        return _main_kernel(dt, AttnConfig(two_cta=False, **kw).resolve("sm90", hd, causal), hd, hd, causal,
                            features=features, varlen=varlen)

    k = main(bwd_diag_align=True)
    assert k.diag_align and k.tile_m == 80 and _post_layout(k).get("chunk_major") is True
    assert main().diag_align  # the hd128 causal default (DEFAULTS' pair)
    off = main(bwd_diag_align=False)
    assert not off.diag_align and "chunk_major" not in _post_layout(off)
    assert not main(causal=False, bwd_diag_align=True).diag_align
    assert not main(deterministic=True, bwd_diag_align=True).diag_align
    assert not main(bwd_tile_m=64, bwd_diag_align=True).diag_align  # 128 / 64: already aligned
    assert not main(hd=64, bwd_diag_align=True).diag_align  # 128-row tiles
    assert not main(bwd_tile_m=64, varlen=True, bwd_diag_align=True).diag_align
    assert not main(features=dict(window_left=64), bwd_diag_align=True).diag_align
    assert "chunk_major" not in _post_layout(main(causal=False, bwd_diag_align=True))


@pytest.mark.parametrize("sq,sk", [(1024, 1024), (2048, 2048), (1000, 1000), (333, 397), (397, 333), (17, 129),
                                   (4096, 4096), (8192, 8192)])
def test_diag_align_walk_rows(sq, sk):
    """The aligned walk covers each K/V tile's visible Q rows [first, seqlen_q) from a multiple of 8 with whole 80-row
    tiles, ends inside the one extra padded tile (backward.py q_pad_rows), and never computes more rows than the
    default walk. At the benchmark lengths it computes the documented rows per head (default -> aligned): 1k 4960 ->
    4880, 2k 18400 -> 17920, 4k 70640 -> 68640, 8k 271360 -> 268320 (64-row tiles: 4608 / 17408 / 67584 / 266240)."""
    tm, tn = 80, 128
    sqp = -(-sq // tm) * tm + tm
    aligned, default = _walk(sq, sk), _walk(sq, sk, align=False)
    for n, ((r0, cnt), (d0, dcnt)) in enumerate(zip(aligned, default)):
        first = max(0, n * tn - (sk - sq))
        assert r0 % 8 == 0 and first - 8 < r0 <= first
        if first < sq:
            assert r0 + cnt * tm >= sq and r0 + (cnt - 1) * tm < sq  # every visible row, no tile past the end
            assert r0 + cnt * tm <= sqp
            assert cnt <= dcnt and r0 >= d0
        else:
            assert cnt == 0
    rows = lambda walk: sum(c for _, c in walk) * tm
    want = {1024: (4960, 4880), 2048: (18400, 17920), 4096: (70640, 68640), 8192: (271360, 268320)}
    if sq == sk and sq in want:
        assert (rows(default), rows(aligned)) == want[sq]


def _loop_sizes(sass):
    """Instruction counts of the backward branches' loop bodies that hold 34 HGMMA (the MMA warpgroups' Q-tile loop),
    smallest first."""
    ins, labels = [], {}
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if m:
            ins.append(m.group(1))
    sizes = []
    for i, txt in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", txt)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            body = ins[labels[m.group(1)]:i + 1]
            if sum("HGMMA" in t for t in body) == 34:
                sizes.append(len(body))
    return sorted(sizes)


def test_diag_align_sass(tmp_path):
    """hd128 causal: no spills in any of the three kernels; the main kernel's HGMMA and its innermost MMA loop body the
    default's (the walk changes per-CTA integer setup, the Q row of the mask, TMA coordinates and the writer's
    address only), with the 8-row rounding of the first row (a LOP3 with 0x7ffffff8 / 0xfffffff8) the default lacks;
    the preprocess unchanged; the postprocess's chunk address differs (a multiply by the padded row count). Non-causal
    with the field: the default's main kernel and postprocess exactly. (bwd_stream_post pinned off: its counters follow
    the walk's units.)"""
    from kernels.sm90.sass import count, opcode_counts

    cand = _bwd_kernels_sass(tmp_path, "bwd_diag_align=True, bwd_stream_post=False", 128, True)
    base = _bwd_kernels_sass(tmp_path, "bwd_diag_align=False, bwd_stream_post=False", 128, True)
    strip = lambda s: re.sub(r"/\*[0-9a-f]+\*/", "", s)
    for kind in ("pre", "main", "post"):
        ops = opcode_counts(cand[kind][0])
        assert count(ops, "LDL") == 0 and count(ops, "STL") == 0, kind
    assert strip(cand["pre"][0]) == strip(base["pre"][0])
    assert strip(cand["post"][0]) != strip(base["post"][0])
    assert strip(cand["main"][0]) != strip(base["main"][0])
    ops_c, ops_b = opcode_counts(cand["main"][0]), opcode_counts(base["main"][0])
    assert {k: v for k, v in ops_c.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_b.items() if k.startswith("HGMMA")}
    assert count(ops_c, "WARPGROUP") == count(ops_b, "WARPGROUP") and count(ops_c, "MUFU") == count(ops_b, "MUFU")
    loops_c, loops_b = _loop_sizes(cand["main"][0]), _loop_sizes(base["main"][0])
    # (with the LSE preload's views rebuilt per Q tile, bwd.py lse_views_fresh, the bodies differ by 6 instructions)
    assert loops_c and loops_b and abs(loops_c[0] - loops_b[0]) <= 8, (loops_c, loops_b)
    rounding = re.compile(r"LOP3\.LUT.*0x(?:7|f)ffffff8")
    assert rounding.search(cand["main"][0]) and not rounding.search(base["main"][0])
    nc_c = _bwd_kernels_sass(tmp_path, "bwd_diag_align=True, bwd_lpt_heads=0, bwd_stream_post=False", 128, False)
    nc_b = _bwd_kernels_sass(tmp_path, "bwd_lpt_heads=0, bwd_stream_post=False", 128, False)
    for kind in ("main", "post"):
        assert strip(nc_c[kind][0]) == strip(nc_b[kind][0]), kind


def test_diag_align_build_pads_one_tile():
    """backward.py pads the Q rows (LSE / dPsum / dQaccum, the preprocess's grid) by one more 80-row tile with the field
    on (the last aligned tile may end up to 79 rows past seqlen_q), by nothing otherwise."""
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    assert compile_backward(AttnConfig(bwd_diag_align=True), "bfloat16", 128, True)["q_pad_rows"] == 80
    assert compile_backward(AttnConfig(bwd_diag_align=False), "bfloat16", 128, True)["q_pad_rows"] == 0
    assert compile_backward(AttnConfig(), "bfloat16", 128, True)["q_pad_rows"] == 80  # the hd128 causal default
    assert compile_backward(AttnConfig(bwd_diag_align=True), "bfloat16", 128, False)["q_pad_rows"] == 0
    assert math.ceil(1000 / 80) * 80 + 80 >= 1000 + 79
