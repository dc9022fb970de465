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


def test_persistent_causal_walks_match_what_was_measured():
    """The model's order of the walks, as the H200 measured them (docs/DEFAULTS_HISTORY.md, persistent_snake):
    hd64's 192-row tiles balance better in snake order than round robin at 2k-4k, hd128's worse; list scheduling
    (persistent_greedy) balances every cell."""
    from analysis.waves import persistent_causal_row

    for s in (2048, 4096):
        r64, r128 = persistent_causal_row(132, 64, 64, s), persistent_causal_row(132, 128, 128, s)
        assert r64["snake"] > r64["rr"] + 0.03 and r128["snake"] < r128["rr"] - 0.1
        assert min(r64["greedy"], r128["greedy"]) > 0.99
    r = persistent_causal_row(132, 256, 256, 8192)
    assert r["rr"] < 0.8 < 0.99 < r["greedy"]
