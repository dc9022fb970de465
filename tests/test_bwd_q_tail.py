"""AttnConfig.bwd_q_tail (opt-in): with bwd_diag_align's walks (hd128 causal), each walk's last Q tile runs as a tile of
its 16-row blocks below seqlen_q (kernels/sm90/bwd.py FlashBwdSm90._set_q_tail / tail_step).

CPU only: the field (hash, validation, compiled config), where the kernel takes it, the tail's row arithmetic against
the rows the walks need, and the SASS (sm_90a, nvdisasm). GPU correctness: tests/test_bwd_q_tail_gpu.py.
"""
from __future__ import annotations

import pytest

from test_bwd_diag_align import _walk
from test_bwd_sass import _bwd_kernels_sass


def test_q_tail_field():
    """None is left out of to_dict() (old hashes and keys), an explicit value is its own config; resolve() leaves it
    None (no DEFAULTS entry); dropped from the forward's compiled config; validated."""
    from kernels import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert "bwd_q_tail" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_q_tail=True).config_hash() != AttnConfig().config_hash()
    assert AttnConfig(bwd_q_tail=False).config_hash() != AttnConfig(bwd_q_tail=True).config_hash()
    for hd in (64, 128):
        for causal in (False, True):
            assert AttnConfig().resolve("sm90", hd, causal).bwd_q_tail is None
    assert "bwd_q_tail" not in compiled_config(AttnConfig(bwd_q_tail=True), "sm90", 128, True, "fwd")
    assert compiled_config(AttnConfig(bwd_q_tail=True), "sm90", 128, True, "bwd")["bwd_q_tail"] is True
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="bwd_q_tail"):
            AttnConfig(bwd_q_tail=bad)


def test_q_tail_where_it_applies():
    """Only with diag_align (hd128 causal 80-row tiles), not deterministic, software exp2 off, not persistent; the tail kernel object
    keeps the walk's shared-memory stage stride."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel

    dt = _cutlass_dtype("bfloat16")

    def main(hd=128, causal=True, **kw):
        return _main_kernel(dt, AttnConfig(two_cta=False, **kw).resolve("sm90", hd, causal), hd, hd, causal)

    k = main(bwd_q_tail=True)
    assert k.q_tail and k.diag_align
    assert not main().q_tail  # opt-in
    assert not main(bwd_q_tail=True, bwd_diag_align=False).q_tail
    assert not main(bwd_q_tail=True, causal=False).q_tail
    assert not main(bwd_q_tail=True, deterministic=True, bwd_det_diag_align=True).q_tail
    assert not main(bwd_q_tail=True, exp2_emu_fraction=0.25).q_tail
    assert not main(bwd_q_tail=True, hd=64).q_tail
    assert not main(bwd_q_tail=True, bwd_persistent=True).q_tail
    for nq in range(1, 5):
        t = k._tail_kernel(nq)
        assert t.tile_m == 16 * nq and t.dq_shape == (64, 16 * nq) and t.dq_vals == 8 * nq
        assert t.lse_stride == k.lse_stride == 96 and t.dq_chunk == k.dq_chunk
    assert k.tile_m == 80 and k.stage_rows == 0  # the copy leaves the kernel as it was


@pytest.mark.parametrize("sq,sk", [(1024, 1024), (2048, 2048), (1000, 1000), (333, 397), (17, 129), (96, 96)])
def test_q_tail_rows(sq, sk):
    """The last tile's block count nq = min(ceil((seqlen_q - r0) / 16), 5) (mma_walk) covers its rows below seqlen_q,
    ends in the padded tile, and leaves fewer than 16 rows past seqlen_q; at 1k the walks' last tiles take 1 .. 5
    blocks (every tail_step copy) and the kernel computes 4608 Q rows per head, as 64-row tiles do, instead of 4880."""
    tm = 80
    rows, counts = 0, set()
    for r0, cnt in _walk(sq, sk):
        if cnt == 0:
            continue
        last = r0 + (cnt - 1) * tm
        nq = min(-(-(sq - last) // 16), tm // 16)
        assert last + 16 * nq >= sq and last + 16 * (nq - 1) < sq
        rows += (cnt - 1) * tm + 16 * nq
        counts.add(nq)
    if (sq, sk) == (1024, 1024):
        assert counts == {1, 2, 3, 4, 5} and rows == 4608


def test_q_tail_sass(tmp_path):
    """hd128 causal with the field: no spills, every wgmma N of the tail (16 .. 64) besides the loop's 80, and each
    step copy with its own 4 WARPGROUP.DEPBAR (5 copies: ptxas did not serialise the wgmma chains, as it did when the
    shape was chosen per GEMM inside one step: 184); without it none of the short shapes."""
    from kernels.sm90.sass import count, opcode_counts

    cand = _bwd_kernels_sass(tmp_path, "bwd_q_tail=True", 128, True)
    base = _bwd_kernels_sass(tmp_path, "bwd_q_tail=False, bwd_stream_post=False", 128, True)  # (q_tail: no stream)
    sass_c, sass_b = cand["main"][0], base["main"][0]
    ops_c, ops_b = opcode_counts(sass_c), opcode_counts(sass_b)
    assert count(ops_c, "LDL") == 0 and count(ops_c, "STL") == 0
    for n in (16, 32, 48, 64):
        assert f"HGMMA.64x{n}x16.F32.BF16" in sass_c and f"HGMMA.64x{n}x16.F32.BF16" not in sass_b, n
    assert sass_c.count("WARPGROUP.DEPBAR") == 5 * sass_b.count("WARPGROUP.DEPBAR") == 20
    assert cand["post"][0] == base["post"][0] and cand["pre"][0] == base["pre"][0]
