"""AttnConfig.bwd_det_diag_align: the deterministic hd128 causal backward walks its 80-row Q tiles from each K/V tile's
diagonal row (bwd_diag_align's walk, kernels/sm90/bwd.py _set_diag_align) with one dQ semaphore per 8 Q rows
(bwd_dq_writer.py det_diag_turn, det_wait, det_release).

CPU only: the field (hash, resolve, where the kernel takes it), the turn arithmetic against a simulation of the walks
(every 8-row group's turns are a permutation over exactly the K/V tiles whose tiles cover it, and a tile only ever
waits for tiles launched before it), and the SASS (no spills; ten semaphore adds per Q tile). GPU: accuracy, bitwise
repeats and equality with the other kernels in tests/test_bwd_det_diag_align_gpu.py.
"""
from __future__ import annotations

import re

import pytest

from test_bwd_sass import _bwd_kernels_sass

TM, TN = 80, 128


def _q_base(n, sq, sk):
    """Kernel arithmetic (bwd.py cta_work): the first row of K/V tile n's aligned walk."""
    return max(0, n * TN - (sk - sq)) // 8 * 8


def test_det_diag_align_field():
    """None is left out of to_dict(); resolve() leaves it None (opt-in) and never fills it into a non-deterministic
    config; validated like the other optional switches."""
    from kernels import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert "bwd_det_diag_align" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_det_diag_align=True).config_hash() != AttnConfig().config_hash()
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            assert AttnConfig().resolve("sm90", hd, causal).bwd_det_diag_align is None
    assert "bwd_det_diag_align" not in compiled_config(AttnConfig(bwd_det_diag_align=True), "sm90", 128, True, "fwd")
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="bwd_det_diag_align"):
            AttnConfig(bwd_det_diag_align=bad)


def test_det_diag_align_where_it_applies():
    """Deterministic hd128 causal spt kernels take the walk by bwd_det_diag_align (not by bwd_diag_align, which stays
    the non-deterministic switch), with 8-row semaphores and the padded extra tile; naive / lpt turns, non-causal,
    64-row tiles and windows do not."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel, _post_layout

    dt = _cutlass_dtype("bfloat16")

    def main(causal=True, features=None, **kw):
        return _main_kernel(dt, AttnConfig(two_cta=False, **kw).resolve("sm90", 128, causal), 128, 128, causal,
                            features=features)

    k = main(deterministic=True, bwd_det_diag_align=True)
    assert k.diag_align and k.deterministic and k.sem_rows == 8 and _post_layout(k).get("chunk_major") is True
    assert k.det_two_writers  # the hd128 deterministic default
    k1 = main(deterministic=True, bwd_det_diag_align=True, bwd_det_two_writers=False)
    assert k1.diag_align and not k1.det_two_writers
    off = main(deterministic=True, bwd_diag_align=True)  # the non-deterministic switch alone: the grid walk
    assert not off.diag_align and off.sem_rows == off.tile_m == 80
    # non-deterministic diag_align: no semaphores read (but the stream's 8-row counters, on by default)
    assert main(bwd_diag_align=True, bwd_stream_post=False).sem_rows == 80 and main(bwd_diag_align=True).sem_rows == 8
    assert not main(deterministic=True, bwd_det_diag_align=True, det_schedule="naive").diag_align
    assert not main(deterministic=True, bwd_det_diag_align=True, det_schedule="lpt").diag_align
    assert not main(causal=False, deterministic=True, bwd_det_diag_align=True).diag_align
    assert not main(deterministic=True, bwd_det_diag_align=True, bwd_tile_m=64).diag_align
    assert not main(deterministic=True, bwd_det_diag_align=True, features=dict(window_left=64)).diag_align


@pytest.mark.parametrize("sq,sk", [(1024, 1024), (1000, 1000), (333, 397), (397, 333), (17, 129), (1, 1),
                                   (300, 1003), (4097, 4097), (2000, 1500)])
def test_det_diag_turns_are_a_launch_ordered_permutation(sq, sk):
    """Simulate the walks: K/V tile n covers rows [q_base(n), q_base(n) + 80 k) with k = ceil((sq - q_base) / 80).
    For every 8-row group below seqlen_q, det_diag_turn over the tiles that cover it is exactly 0 .. count - 1, and
    ordered so that turn t + 1 belongs to a tile launched after turn t's (the spt grid launches n = N-1 first:
    in-order launch cannot deadlock). The semaphore count per (batch, head) holds every group a tile touches."""
    from kernels.sm90.bwd_dq_writer import det_diag_turn

    n_tiles = -(-sk // TN)
    sqp = -(-sq // TM) * TM + TM  # backward.py: tile_m-padded rows plus one tile (q_pad_rows)
    cover = {}
    for n in range(n_tiles):
        r0 = _q_base(n, sq, sk)
        if r0 >= sq:
            continue
        k = -(-(sq - r0) // TM)
        assert r0 + k * TM <= sqp
        for row in range(r0, r0 + k * TM, 8):
            assert row // 8 < sqp // 8
            if row < sq:  # padding groups take no turns (det_wait / det_release skip them)
                cover.setdefault(row // 8, []).append(n)
    for g, ns in cover.items():
        turns = {n: det_diag_turn(n, g, TN, sk - sq, n_tiles) for n in ns}
        assert sorted(turns.values()) == list(range(len(ns))), (g, turns)
        by_turn = [n for n, _ in sorted(turns.items(), key=lambda kv: kv[1])]
        assert by_turn == sorted(ns, reverse=True), g  # diagonal-most (launched first) first
    # every row with at least one visible key (row + seqlen_k - seqlen_q >= 0) is covered by some tile
    for row in range(max(0, sq - sk), sq):
        assert row // 8 in cover, row


def test_det_diag_align_sass(tmp_path):
    """The deterministic hd128 causal kernel with the aligned walk: no spills in the three kernels, the default
    deterministic kernel's HGMMA count, and ten relaxed semaphore adds per released Q tile (one per 8-row group)
    where the grid walk has one per tile."""
    from kernels.sm90.sass import count, opcode_counts

    cand = _bwd_kernels_sass(tmp_path, "deterministic=True, bwd_det_diag_align=True", 128, True)
    base = _bwd_kernels_sass(tmp_path, "deterministic=True", 128, True)
    for kind in ("pre", "main", "post"):
        ops = opcode_counts(cand[kind][0])
        assert count(ops, "LDL") == 0 and count(ops, "STL") == 0, kind
    c_ops, b_ops = opcode_counts(cand["main"][0]), opcode_counts(base["main"][0])
    assert count(c_ops, "HGMMA") == count(b_ops, "HGMMA")
    red = lambda sass: len(re.findall(r"\bREDG\.E\.ADD\.S32\.STRONG\.GPU\b", sass))
    assert red(base["main"][0]) >= 1
    assert red(cand["main"][0]) == 10 * red(base["main"][0]), (red(cand["main"][0]), red(base["main"][0]))
