"""AttnConfig.bwd_stream_post (opt-in): the dQ writer counts each dQ row unit's completed reductions and the
postprocess converts a tile once every K/V tile that visits it has counted (kernels/sm90/bwd.py _set_stream_post,
bwd_post.py ``stream``, bwd_pre.py ``call_stream``).

CPU only: the field, where the kernel takes it, the count each unit waits for against the walks the main kernel
runs, and the SASS (sm_90a, nvdisasm) of the three kernels. GPU correctness: tests/test_bwd_stream_post_gpu.py.
"""
from __future__ import annotations

import re

import pytest

from test_bwd_diag_align import _walk
from test_bwd_sass import _bwd_kernels_sass


def test_stream_post_field():
    """None is left out of to_dict() (old hashes and keys), an explicit value is its own config; resolve() fills True
    at hd 64 / 128 where the kernel has it; dropped from the forward's compiled config; validated."""
    from kernels import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert "bwd_stream_post" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_stream_post=True).config_hash() != AttnConfig().config_hash()
    assert AttnConfig(bwd_stream_post=False).config_hash() != AttnConfig(bwd_stream_post=True).config_hash()
    for hd in (64, 128):  # on at hd 64 / 128 (with PDL), absent elsewhere
        for causal in (False, True):
            r = AttnConfig().resolve("sm90", hd, causal)
            assert r.bwd_stream_post is True and r.bwd_pdl is True
            assert AttnConfig(deterministic=True).resolve("sm90", hd, causal).bwd_stream_post is True
            for off in (dict(bwd_pdl=False), dict(bwd_persistent=True), dict(bwd_q_tail=True), dict(two_cta=True)):
                assert AttnConfig(**off).resolve("sm90", hd, causal).bwd_stream_post is None, off  # kernels without it
            assert AttnConfig(bwd_stream_post=False).resolve("sm90", hd, causal).bwd_stream_post is False
            assert AttnConfig().resolve("sm90", 192 if hd == 64 else 256, causal).bwd_stream_post is None
    assert "bwd_stream_post" not in compiled_config(AttnConfig(bwd_stream_post=True), "sm90", 128, True, "fwd")
    assert compiled_config(AttnConfig(bwd_stream_post=True), "sm90", 128, True, "bwd")["bwd_stream_post"] is True
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="bwd_stream_post"):
            AttnConfig(bwd_stream_post=bad)


def test_stream_post_where_it_applies():
    """With PDL (the hd 64 / 128 default), hd 64 / 128 one-CTA; not two_cta, persistent, q_tail or a window;
    deterministic kernels stream on their semaphores (no counting, no zeroing in the preprocess). The counters are per 8 rows under diag_align (hd128 causal), per Q tile elsewhere."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel

    dt = _cutlass_dtype("bfloat16")

    def main(hd=128, causal=True, **kw):
        return _main_kernel(dt, AttnConfig(two_cta=False, **kw).resolve("sm90", hd, causal), hd, hd, causal)

    k = main(bwd_stream_post=True)
    assert k.stream_post and k.diag_align and k.sem_rows == 8
    assert main(bwd_stream_post=True, causal=False).sem_rows == 80
    assert main(hd=64).stream_post and main(hd=64).sem_rows == 128
    assert main().stream_post and main(causal=False).stream_post  # the hd128 default
    assert not main(bwd_stream_post=False).stream_post and main(bwd_stream_post=False).sem_rows == 80
    assert not main(bwd_stream_post=True, bwd_pdl=False).stream_post
    det = main(bwd_stream_post=True, deterministic=True)  # only the postprocess streams, on the dQ semaphores
    assert det.stream_post and not det.stream_pre and k.stream_pre
    assert not main(bwd_stream_post=True, bwd_persistent=True).stream_post
    assert not main(bwd_stream_post=True, bwd_q_tail=True).stream_post
    assert main(bwd_stream_post=True, deterministic=True, bwd_det_diag_align=True).sem_rows == 8  # (the det turns')


@pytest.mark.parametrize("sq,sk", [(1024, 1024), (1000, 1000), (333, 397), (300, 1003), (1003, 300), (17, 129),
                                   (1, 1), (4097, 4097), (129, 128)])
@pytest.mark.parametrize("align", [True, False])
def test_stream_unit_counts_match_the_walks(sq, sk, align):
    """For every unit below seqlen_q, stream_unit_count equals the number of K/V tiles whose walk (the kernel's
    arithmetic, test_bwd_diag_align._walk) covers it: aligned walks (80-row tiles from 8-row groups, units of 8 rows)
    and grid walks (80-row tiles, units of a tile); non-causal, every K/V tile."""
    from kernels.sm90.bwd_dq_writer import stream_unit_count

    tm, tn = 80, 128
    unit = 8 if align else tm
    n_tiles = -(-sk // tn)
    walks = _walk(sq, sk, tm, tn, align)
    for r0 in range(0, sq, unit):
        seen = sum(1 for first, count in walks if count > 0 and first <= r0 < first + count * tm)
        assert stream_unit_count(r0, unit, True, sk - sq, tn, n_tiles) == seen, (r0, seen)
        assert stream_unit_count(r0, unit, False, sk - sq, tn, n_tiles) == n_tiles


def test_stream_post_sass(tmp_path):
    """hd128 causal: the main kernel's MMA code unchanged (same HGMMA), no spills, the writer's counter adds (one loop
    over the walk's units, after the loop over its Q tiles) behind a GPU-scope fence; the preprocess zeroes its
    counters before it signals (a store and a fence before PREEXIT); the postprocess spins on acquire loads instead of
    waiting for the main grid first (its one ACQBULK is the last CTA's wait at the end, after the dQ stores)."""
    from kernels.sm90.sass import count, opcode_counts

    cand = _bwd_kernels_sass(tmp_path, "bwd_stream_post=True", 128, True)
    base = _bwd_kernels_sass(tmp_path, "bwd_stream_post=False", 128, True)
    main_c, main_b = cand["main"][0], base["main"][0]
    ops_c, ops_b = opcode_counts(main_c), opcode_counts(main_b)
    assert count(ops_c, "LDL") == 0 and count(ops_c, "STL") == 0
    assert {k: v for k, v in ops_c.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_b.items() if k.startswith("HGMMA")}
    adds = lambda s: len(re.findall(r"REDG?\.E\.ADD\.S32", s))
    assert adds(main_c) >= 1 and adds(main_b) == 0
    assert main_c.count("MEMBAR.ALL.GPU") > main_b.count("MEMBAR.ALL.GPU")
    assert main_c.index("MEMBAR.ALL.GPU") < min(m.start() for m in re.finditer(r"REDG?\.E\.ADD\.S32", main_c))
    pre = cand["pre"][0]
    assert pre.index("MEMBAR") < pre.index("PREEXIT") and "MEMBAR" not in base["pre"][0]
    post_c, post_b = cand["post"][0], base["post"][0]
    assert re.search(r"LDG\.E\.STRONG\.GPU", post_c) and not re.search(r"LDG\.E\.STRONG\.GPU", post_b)
    assert post_c.count("ACQBULK") == 1 and post_c.index("ACQBULK") > post_c.rindex("STG")
    assert post_b.index("ACQBULK") < post_b.index("LDG")


def _mma_span(sass: str) -> list[tuple[str, str]]:
    """The main kernel's instructions from its first HGMMA to its last (the MMA warps' loop), labels anonymised."""
    from kernels.sm90.sass import instructions

    ins = [(op, re.sub(r"\.L_x_\d+", "L", rest).strip()) for _, op, rest in instructions(sass)[0]]
    at = [i for i, (op, _) in enumerate(ins) if op.startswith("HGMMA")]
    return ins[at[0]:at[-1] + 1]


@pytest.mark.parametrize("causal", [True, False])
def test_stream_post_leaves_the_mma_loop_alone(tmp_path, causal):
    """hd128: the MMA warps' code (first to last HGMMA) is the default's instruction for instruction; only the writer
    warp changes. Counting before the writer's last read wait made ptxas schedule that loop differently at non-causal
    (497 -> 491 instructions), where the field then measured 0.977 of the default at 16k (session 40)."""
    cand = _bwd_kernels_sass(tmp_path, "bwd_stream_post=True", 128, causal)["main"][0]
    base = _bwd_kernels_sass(tmp_path, "bwd_stream_post=False", 128, causal)["main"][0]
    span_c, span_b = _mma_span(cand), _mma_span(base)
    assert len(span_b) > 100 and span_c == span_b


@pytest.mark.parametrize("causal", [True, False])
def test_stream_post_deterministic_sass(tmp_path, causal):
    """Deterministic hd128 (diag_align's 8-row semaphores causal, a Q tile's non-causal): the main kernel and the
    preprocess are byte for byte the kernels without the field (the semaphores already count each unit's turns); the
    postprocess spins on acquire loads instead of waiting for the main grid first."""
    cand = _bwd_kernels_sass(tmp_path, "deterministic=True, bwd_stream_post=True", 128, causal)
    base = _bwd_kernels_sass(tmp_path, "deterministic=True, bwd_stream_post=False", 128, causal)
    strip = lambda s: re.sub(r"\.text\.\S+|\.nv\.\S+|kernel_\w+", "", s)  # the names carry the compile key
    assert "HGMMA" in cand["main"][0] and strip(cand["main"][0]) == strip(base["main"][0])
    assert strip(cand["pre"][0]) == strip(base["pre"][0])
    post_c, post_b = cand["post"][0], base["post"][0]
    assert re.search(r"LDG\.E\.STRONG\.GPU", post_c) and not re.search(r"LDG\.E\.STRONG\.GPU", post_b)
    assert post_c.count("ACQBULK") == 1 and post_c.index("ACQBULK") > post_c.rindex("STG")
