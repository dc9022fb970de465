"""Split tail of the persistent forward (kernels/sm90/fwd_tail.py), on the CPU: the schedule covers every tail block
once with at most two pieces per CTA, the config field's per-call rule, and the sm_90a compile (no spills, the main
loop unchanged, the merge kernel present)."""
from __future__ import annotations

import dataclasses

import itertools
import math
import re

import pytest

from kernels import AttnConfig
from kernels.sm90.fwd_tail import schedule


@pytest.mark.parametrize("n_tail,n_blocks,ctas", [(4, 32, 132), (68, 51, 132), (52, 64, 132), (4, 8, 5), (3, 2, 7),
                                                  (131, 256, 132), (1, 2, 132)])
def test_schedule_covers_each_tail_block_once(n_tail, n_blocks, ctas):
    seen = {}
    per_cta = {}
    for c, i, lo, hi, slot in schedule(n_tail, n_blocks, ctas):
        assert 0 <= lo < hi <= n_blocks and 0 <= i < n_tail and slot in (2 * c, 2 * c + 1)
        per_cta[c] = per_cta.get(c, 0) + 1
        for blk in range(lo, hi):
            assert (i, blk) not in seen
            seen[(i, blk)] = c
    assert len(seen) == n_tail * n_blocks
    assert max(per_cta.values()) <= 2
    # balanced: every CTA's share within one block of the others'
    work = [sum(hi - lo for c2, _, lo, hi, _ in schedule(n_tail, n_blocks, ctas) if c2 == c) for c in range(ctas)]
    assert max(work) - min(work) <= 1


def test_split_tail_per_call_rule():
    from kernels.interface import split_tail_launch

    from kernels.interface import split_tail_pays

    cfg = AttnConfig(split_tail=True, persistent=True).resolve("sm90", 128, False)
    c, grid = split_tail_launch(cfg, False, 132, 4096, 64)  # paper grid hd128 8k: 4 tiles past 31 rounds
    assert c.split_tail and grid == 132
    c, grid = split_tail_launch(cfg, False, 132, 16, 256)  # fewer tiles than SMs: every tile cut, one CTA per SM
    assert c.split_tail and grid == 132
    # the policy (split_tail_pays: the cut must save >= 48 blocks): not at 4 tiles x 32 blocks (hd128 4k: 31 saved),
    # nor at 128 tiles of 256 blocks on 132 SMs (8 saved); 68 tiles of 205 blocks (hd256 16k: 99 saved) are cut
    assert not split_tail_pays(132, 4, 32) and split_tail_pays(132, 4, 50) and not split_tail_pays(132, 4, 49)
    assert not split_tail_pays(132, 128, 256) and split_tail_pays(132, 107, 256) and not split_tail_pays(132, 108, 256)
    assert split_tail_pays(132, 68, 205) and split_tail_pays(132, 32, 256)
    for excluded, tiles, nb, want_grid in ((True, 4096, 64, 132), (False, 3960, 64, 132), (False, 4096, 1, 132),
                                           (True, 16, 256, 16), (False, 16, 1, 16), (False, 4096, 32, 132),
                                           (False, 128, 256, 128)):
        c, grid = split_tail_launch(cfg, excluded, 132, tiles, nb)
        assert c.split_tail is None and grid == want_grid
    # the kernels' schedule products stay within int32: a tail of 4 tiles x 2^22 blocks (2^29 keys) on 132 SMs would
    # overflow them, so it runs the plain kernel
    c, grid = split_tail_launch(cfg, False, 132, 4, 2 ** 22)
    assert c.split_tail is None and grid == 4
    assert split_tail_launch(cfg, False, 132, 4, 2 ** 20)[0].split_tail
    # persistent=None (the length decides): a call the length leaves one tile per CTA runs persistent for a split
    # that pays, and stays one tile per CTA where it does not; never so with persistent=False or packed GQA
    lone = AttnConfig(split_tail=True).resolve("sm90", 256, False)
    assert lone.persistent is None
    c, grid = split_tail_launch(lone, False, 132, 2048, 205, True)  # hd256 16k: 2048 tiles, 68 left, 205 blocks each
    assert c.persistent is True and c.split_tail and grid == 132
    for args in ((lone, False, 132, 2048, 205, False), (lone, False, 132, 4096, 32, True), (lone, True, 132, 2048, 205, True),
                 (dataclasses.replace(lone, pack_gqa=True), False, 132, 2048, 205, True)):
        c, _ = split_tail_launch(*args)
        assert c.split_tail is None and c.persistent is args[0].persistent
    assert "split_tail" not in AttnConfig().to_dict()
    with pytest.raises(Exception, match="split_tail"):
        AttnConfig(split_tail=True).resolve("sm100", 128, False)


@pytest.mark.compile
@pytest.mark.parametrize("hdim,hdim_v", [(64, 64), (128, 128), (192, 128), (256, 256)])
def test_split_tail_compiles_without_spills(hdim, hdim_v, tmp_path):
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel
    from kernels.sm90.sass import count, disassemble, opcode_counts, steady_state_loops

    loops = {}
    for split in (False, True):
        cfg = AttnConfig(persistent=True, split_tail=split).resolve("sm90", hdim, False)
        kern = make_fwd_kernel(cfg, "bfloat16", hdim, hdim_v, False)
        assert kern.split_tail is split
        d = tmp_path / str(split)
        compile_fwd(kern, tvm_ffi=False, dump_dir=str(d))
        sass = disassemble(str(next(d.glob("*.cubin"))))
        funcs = re.split(r"\n\s*\.text\.", sass)[1:]
        names = [f.split(":")[0] for f in funcs]
        assert any("TailCombine" in n for n in names) is split
        main = next(f for f, n in zip(funcs, names) if "TailCombine" not in n)
        counts = opcode_counts(main)
        assert count(counts, "LDL") == 0 and count(counts, "STL") == 0
        loops[split] = [len(l) for l in steady_state_loops(main)]
    # the K/V loop is the plain persistent kernel's, give or take the runtime first block's bookkeeping (the eager
    # loops within 4 instructions; speculative_exp's, the hd 64 / 128 / (192, 128) default since session 52, within
    # 2%: 806 / 793 at hd128, 875 / 868 at (192, 128), register allocation around its two votes)
    assert len(loops[True]) == len(loops[False])
    for a, b in zip(loops[True], loops[False]):
        assert abs(a - b) <= max(4, a // 50), (a, b)


def test_split_tail_default_where_it_pays_on_the_paper_grid():
    """DEFAULTS' split_tail: non-causal at hd128 / 256 / (192, 128), never causal; on the paper grid (32k tokens, hidden
    2048, 132 SMs) hd256 runs the split from 8k (50 blocks; 4k: the cut would save 25 blocks, under 48), (192, 128)
    (10 heads) from 16k (8k: 39 blocks). Up to 8k both are persistent by their length anyway (with o_via_v_stage,
    session 66; hd256 with o_direct_wide, session 68), with the split or not; past 8k persistent only for the split."""
    from kernels.interface import forward_config, split_tail_launch

    for hd in (128, 256, 192):
        assert AttnConfig().resolve("sm90", hd, False).split_tail is True
        assert not AttnConfig().resolve("sm90", hd, True).split_tail
    assert not AttnConfig().resolve("sm90", 64, False).split_tail
    for hd, heads, first in ((256, 8, 8192), (192, 10, 16384)):
        for seqlen in (4096, 8192, 16384, 32768):
            split = seqlen >= first
            cfg = forward_config(AttnConfig().resolve("sm90", hd, False), hd, False, seqlen, 1, False)
            short = seqlen <= 8192
            assert bool(cfg.persistent) is short  # else one tile per CTA
            # O through the V stage (hd256 from 2049 tokens: from registers in 16-byte stores, session 68)
            assert bool(cfg.o_direct_wide if hd == 256 else cfg.o_via_v_stage) is short
            tiles = -(-seqlen // cfg.tile_m) * heads * (32768 // seqlen)
            c, grid = split_tail_launch(cfg, False, 132, tiles, -(-seqlen // cfg.tile_n), True)
            assert bool(c.split_tail) is split and bool(c.persistent) is (split or short), (hd, seqlen)
            assert grid == (132 if split else min(132, tiles))


@pytest.mark.compile
def test_split_tail_ignored_where_it_does_not_apply():
    from kernels.sm90.compile import make_fwd_kernel

    for causal, persistent, window in itertools.product((False, True), (False, True), (-1, 64)):
        cfg = AttnConfig(persistent=persistent or None, split_tail=True).resolve("sm90", 128, causal)
        kern = make_fwd_kernel(cfg, "bfloat16", 128, 128, causal, window_left=window)
        assert kern.split_tail is (persistent and not causal and window < 0)


@pytest.mark.parametrize("n_tail,n_blocks,ctas", [(3, 5, 7), (2, 4, 5), (1, 6, 4)])
def test_pieces_merge_to_the_whole_tile(n_tail, n_blocks, ctas):
    """The merge TailCombine computes (LSE = log sum exp LSE_i, O = sum exp(LSE_i - LSE) O_i), in fp32 on the CPU
    over the schedule's pieces, gives each tail tile's attention over all its keys."""
    torch = pytest.importorskip("torch")
    tile_m, tile_n, d = 8, 16, 32
    g = torch.Generator().manual_seed(0)
    q = torch.randn(n_tail, tile_m, d, generator=g)
    k = torch.randn(n_tail, n_blocks * tile_n, d, generator=g)
    v = torch.randn(n_tail, n_blocks * tile_n, d, generator=g)
    s = q @ k.transpose(1, 2) / math.sqrt(d)
    want = torch.softmax(s, -1) @ v
    want_lse = torch.logsumexp(s, -1)
    o_acc = torch.full((2 * ctas, tile_m, d), float("nan"))
    lse_acc = torch.full((2 * ctas, tile_m), float("nan"))
    for c, i, lo, hi, slot in schedule(n_tail, n_blocks, ctas):  # each piece: a tile over its blocks only
        sp = s[i, :, lo * tile_n:hi * tile_n]
        o_acc[slot] = torch.softmax(sp, -1) @ v[i, lo * tile_n:hi * tile_n]
        lse_acc[slot] = torch.logsumexp(sp, -1)
    for i in range(n_tail):
        slots = [slot for _, ti, _, _, slot in schedule(n_tail, n_blocks, ctas) if ti == i]
        m = torch.stack([lse_acc[sl] for sl in slots]).max(0).values
        w = [torch.exp2((lse_acc[sl] - m) * math.log2(math.e)) for sl in slots]
        wsum = sum(w)
        out = sum(wi[:, None] * o_acc[sl] for wi, sl in zip(w, slots)) / wsum[:, None]
        assert torch.allclose(out, want[i], atol=1e-5, rtol=1e-5)
        assert torch.allclose(m + torch.log(wsum), want_lse[i], atol=1e-5)


@pytest.mark.compile
@pytest.mark.parametrize("dtype,group", [("float16", 1), ("bfloat16", 4)])
def test_split_tail_compiles_fp16_and_gqa(dtype, group, tmp_path):
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel

    cfg = AttnConfig(persistent=True, split_tail=True).resolve("sm90", 128, False)
    kern = make_fwd_kernel(cfg, dtype, 128, 128, False, qhead_per_kvhead=group)
    assert kern.split_tail
    compile_fwd(kern, tvm_ffi=False, dump_dir=str(tmp_path))
    assert list(tmp_path.glob("*.cubin"))
