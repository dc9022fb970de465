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
