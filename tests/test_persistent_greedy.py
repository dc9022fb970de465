"""The persistent causal forward's greedy walk (kernels/sm90/greedy_walk.py), on the CPU: the table covers every tile
once, list scheduling balances the paper grid's causal tiles better than the round robin, the block counts match the
kernel's own range (mask.window_block_range), the config field's per-call rule, and the sm_90a compile."""
from __future__ import annotations

import pytest

from kernels import AttnConfig
from kernels.sm90.greedy_walk import (TILE_OVERHEAD_BLOCKS, causal_blocks, causal_tile_order, greedy_walks,
                                      list_schedule, walk_table)


def _loads(walks, costs):
    return [sum(costs[t] for t in w) for w in walks]


@pytest.mark.parametrize("m_blocks,pairs,hb_group,ctas", [(32, 128, 16, 132), (64, 64, 8, 132), (5, 3, 2, 4),
                                                          (1, 1, 1, 3), (8, 128, 128, 132), (3, 7, 4, 50)])
def test_walk_table_holds_every_tile_once(m_blocks, pairs, hb_group, ctas):
    walks = greedy_walks(m_blocks, pairs, hb_group, 128, 128, m_blocks * 128, m_blocks * 128, ctas)
    table = walk_table(walks)
    assert len(table) == ctas and len({len(r) for r in table}) == 1
    seen = [t for row in table for t in row[1:1 + row[0]]]
    assert sorted(seen) == list(range(m_blocks * pairs))
    for row in table:  # each CTA's tiles in issue order (the order the hardware would hand them out)
        assert row[1:1 + row[0]] == sorted(row[1:1 + row[0]])


def test_tile_order_is_the_kernels_causal_issue_order():
    """causal_tile_order mirrors scheduler.tile_at: L2 groups of pairs, m_block descending, pairs fastest; a short
    last group."""
    assert causal_tile_order(2, 3, 2) == [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (0, 2)]


@pytest.mark.parametrize("s,hb_group", [(2048, 32), (4096, 16), (8192, 8)])
def test_list_scheduling_balances_better_than_the_round_robin(s, hb_group):
    """hd128 causal, 32k tokens, 16 heads, 132 CTAs: the round robin's busiest CTA does 3% more than the mean, list
    scheduling's under 1%."""
    m_blocks, pairs, ctas = s // 128, (32768 // s) * 16, 132
    costs = [causal_blocks(m, 128, 128, s, s) + TILE_OVERHEAD_BLOCKS for m, _ in causal_tile_order(m_blocks, pairs,
                                                                                                      hb_group)]
    mean = sum(costs) / ctas
    greedy = max(_loads(greedy_walks(m_blocks, pairs, hb_group, 128, 128, s, s, ctas), costs))
    rr = max(_loads([list(range(c, len(costs), ctas)) for c in range(ctas)], costs))
    assert mean / greedy > 0.99 and mean / rr < 0.98


def test_list_schedule_gives_each_tile_to_the_cta_free_first():
    assert list_schedule([3.0, 1.0, 1.0, 1.0, 2.0], 2) == [[0, 4], [1, 2, 3]]


@pytest.mark.parametrize("sq,sk,tile_m,tile_n,wl", [(1000, 1000, 128, 128, -1), (512, 2048, 128, 128, -1),
                                                    (2048, 512, 192, 128, -1), (777, 1500, 128, 80, 300),
                                                    (4096, 4096, 128, 128, 1024)])
def test_causal_blocks_match_the_kernels_block_range(sq, sk, tile_m, tile_n, wl):
    from kernels.sm90.mask import window_block_range

    for m in range(-(-sq // tile_m)):
        lo, hi, _, _ = window_block_range(m, tile_m, tile_n, sq, sk, True, wl, -1)
        assert causal_blocks(m, tile_m, tile_n, sq, sk, wl) == max(hi - lo, 1)


def test_persistent_greedy_field_and_per_call_rule():
    assert "persistent_greedy" not in AttnConfig().to_dict()
    assert "persistent_greedy" not in AttnConfig(persistent_greedy=False).to_dict()
    on = AttnConfig(persistent_greedy=True)
    assert on.to_dict()["persistent_greedy"] is True and on.config_hash() != AttnConfig().config_hash()
    assert AttnConfig(persistent_greedy=True).resolve("sm90", 128, True).persistent_greedy is True


@pytest.mark.compile
@pytest.mark.parametrize("hdim", [64, 128])
def test_persistent_greedy_compiles_without_spills_and_keeps_the_loop(hdim, tmp_path):
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, kernel_sass, opcode_counts, steady_state_loops

    bodies = {}
    for greedy in (False, True):
        cfg = AttnConfig(persistent=True, persistent_greedy=greedy).resolve("sm90", hdim, True)
        kern = make_fwd_kernel(cfg, "bfloat16", hdim, hdim, True)
        assert kern.greedy is greedy and not kern.snake
        sass = kernel_sass(kern, str(tmp_path / f"g{int(greedy)}"))
        if sass is None:
            pytest.skip("nvdisasm not installed")
        c = opcode_counts(sass)
        assert count(c, "LDL") == 0 and count(c, "STL") == 0
        bodies[greedy] = [len(b) for b in steady_state_loops(sass)]
    # the walk only changes which tile comes next: the K/V block loop is the round robin kernel's, within 2%
    assert len(bodies[True]) == len(bodies[False])
    for a, b in zip(bodies[True], bodies[False]):
        assert abs(a - b) <= 0.02 * b


def test_greedy_is_not_compiled_where_it_does_not_apply():
    from kernels.sm90.compile import make_fwd_kernel

    for causal, persistent in ((False, True), (True, False)):
        cfg = AttnConfig(persistent=persistent, persistent_greedy=True).resolve("sm90", 128, causal)
        assert not make_fwd_kernel(cfg, "bfloat16", 128, 128, causal).greedy
    snake = AttnConfig(persistent=True, persistent_greedy=True, persistent_snake=True).resolve("sm90", 128, True)
    kern = make_fwd_kernel(snake, "bfloat16", 128, 128, True)
    assert kern.greedy and not kern.snake


@pytest.mark.compile
@pytest.mark.parametrize("hdim,seqlen", [(64, 1024), (64, 4096), (128, 1024), (128, 4096), (192, 4096), (256, 4096)])
@pytest.mark.parametrize("window,softcap", [(-1, 0.0), (256, 0.0), (256, 30.0), (-1, 30.0)],
                         ids=["plain", "window", "window_cap", "cap"])
def test_per_call_causal_defaults_compile_without_spills(hdim, seqlen, window, softcap, tmp_path):
    """The kernel each causal call gets by default (kernels/interface.py forward_config: persistent by its length,
    DEFAULTS' persistent_tile -- the greedy walk, at hd128 <= 1k with exp_in_branch + causal_split except with a
    window, hd128 from 1025 tiles claimed at run time except with a softcap)
    uses no local memory, with a left window and a softcap too (with the window, exp_in_branch spilled 100 LDL)."""
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, find_nvdisasm, opcode_counts
    from sass_cache import kernel_sass

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip nvidia-cuda-nvdisasm)")
    from kernels.interface import forward_config

    hdim_v = 128 if hdim == 192 else hdim
    cfg = forward_config(AttnConfig().resolve("sm90", hdim, True), hdim, True, seqlen, 1, window >= 0, softcap != 0)
    # hd128 causal from 1025: tiles claimed at run time, but without a softcap (3 registers spilled with one)
    claims = hdim == 128 and seqlen > 1024 and softcap == 0
    assert cfg.persistent and (cfg.persistent_dynamic if claims else cfg.persistent_greedy)
    assert bool(cfg.exp_in_branch) is (hdim == 128 and window < 0 and not claims)
    kern = make_fwd_kernel(cfg, "bfloat16", hdim, hdim_v, True, 1, window_left=window, window_right=-1,
                           softcap=softcap)
    c = opcode_counts(kernel_sass(kern, str(tmp_path)))
    assert count(c, "LDL") == 0 and count(c, "STL") == 0, (hdim, seqlen, window, softcap)
