"""Split tail of the persistent forward (kernels/sm90/fwd_tail.py), on the CPU: the schedule covers every tail block
once with at most two pieces per CTA, the config field's per-call rule, and the sm_90a compile (no spills, the main
loop unchanged, the merge kernel present)."""
from __future__ import annotations

import itertools
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
    from kernels.interface import split_tail_config

    cfg = AttnConfig(split_tail=True, persistent=True).resolve("sm90", 128, False)
    assert split_tail_config(cfg, False, 4, 32).split_tail
    for excluded, tail, nb in ((True, 4, 32), (False, 0, 32), (False, 4, 1)):
        assert split_tail_config(cfg, excluded, tail, nb).split_tail is None
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
    # the K/V loop is the plain persistent kernel's, give or take the runtime first block's bookkeeping
    assert len(loops[True]) == len(loops[False])
    for a, b in zip(loops[True], loops[False]):
        assert abs(a - b) <= 4


@pytest.mark.compile
def test_split_tail_ignored_where_it_does_not_apply():
    from kernels.sm90.compile import make_fwd_kernel

    for causal, persistent, window in itertools.product((False, True), (False, True), (-1, 64)):
        cfg = AttnConfig(persistent=persistent or None, split_tail=True).resolve("sm90", 128, causal)
        kern = make_fwd_kernel(cfg, "bfloat16", 128, 128, causal, window_left=window)
        assert kern.split_tail is (persistent and not causal and window < 0)
