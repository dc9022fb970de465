"""analysis/waves.py: the last partial round's idle share of a non-causal forward on the paper grid."""
from __future__ import annotations

from analysis.waves import table, wave_row


def test_paper_grid_hd128_runs_32_rounds_for_4096_tiles():
    r = wave_row(132, 128, 128, 8192)  # 32k tokens: batch 4, 16 heads, 64 m-blocks
    assert (r["tiles"], r["rounds"], r["tail_tiles"]) == (4096, 32, 4)
    assert abs(r["efficiency"] - 4096 / (132 * 32)) < 1e-4


def test_efficiency_is_one_when_tiles_fill_whole_rounds():
    r = wave_row(128, 128, 128, 8192)
    assert r["efficiency"] == 1.0 and r["tail_tiles"] == 0


def test_table_covers_every_head_dim_and_seqlen():
    rows = table("h200")
    assert len(rows) == 24 and all(0.5 < r["efficiency"] <= 1.0 for r in rows)


def test_causal_list_scheduling_leaves_little_idle():
    from analysis.waves import causal_row

    r = causal_row(132, 128, 128, 4096)
    assert r["tiles"] == 4096 and 0.99 < r["efficiency"] <= 1.0
    # two tiles of 1 and 2 blocks (+1 overhead) on 2 SMs: the longest first, finish at 3, work 5: 5 / 6
    r = causal_row(2, 128, 128, 256, tokens=256, hidden=128)
    assert abs(r["efficiency"] - 5 / 6) < 1e-3
