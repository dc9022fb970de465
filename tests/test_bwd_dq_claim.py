"""AttnConfig.bwd_dq_claim (opt-in): the preprocess leaves dQaccum unzeroed; the first dQ writer to reach each dQ row
unit claims it and bulk-stores its chunk there, the others reduce-add after the claim's store has completed
(kernels/sm90/bwd.py _set_dq_claim, bwd_dq_writer.py claim_tile, bwd_pre.py ``claim``); deterministic kernels store
on each tile's turn 0 (turn0_op).

CPU only: the field, where the kernel takes it, and the SASS (sm_90a, nvdisasm). GPU correctness:
tests/test_bwd_dq_claim_gpu.py.
"""
from __future__ import annotations

import re

import pytest

from test_bwd_sass import _bwd_kernels_sass
from test_bwd_stream_post import _mma_span


def test_dq_claim_field():
    """None is left out of to_dict() (old hashes and keys), an explicit value is its own config; resolve() leaves it
    None; dropped from the forward's compiled config; validated."""
    from kernels import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert "bwd_dq_claim" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_dq_claim=True).config_hash() != AttnConfig().config_hash()
    for hd in (64, 128):
        for causal in (False, True):
            assert AttnConfig().resolve("sm90", hd, causal).bwd_dq_claim is None
    assert "bwd_dq_claim" not in compiled_config(AttnConfig(bwd_dq_claim=True), "sm90", 128, True, "fwd")
    assert compiled_config(AttnConfig(bwd_dq_claim=True), "sm90", 128, True, "bwd")["bwd_dq_claim"] is True
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="bwd_dq_claim"):
            AttnConfig(bwd_dq_claim=bad)


def test_dq_claim_where_it_applies():
    """With the stream's counters (not deterministic), causal or on rotated walks: hd128 causal (8-row units of the
    80-row dQ^T chunks), hd64 both ways (a Q tile's unit), hd128 non-causal only with bwd_rotate_q (its grid walks
    start every CTA of a head on the same tile); not without the stream, deterministic or with dq_chunk_release."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel

    dt = _cutlass_dtype("bfloat16")

    def main(hd=128, causal=True, **kw):
        return _main_kernel(dt, AttnConfig(two_cta=False, bwd_dq_claim=True, **kw).resolve("sm90", hd, causal), hd,
                            hd, causal)

    assert main().dq_claim and main().sem_rows == 8
    assert main(hd=64).dq_claim and main(hd=64, causal=False).dq_claim and main(hd=64).sem_rows == 128
    assert not main(causal=False).dq_claim and main(causal=False, bwd_rotate_q=True).dq_claim
    assert not main(bwd_stream_post=False).dq_claim
    det = main(deterministic=True)  # deterministic: each tile's turn 0 stores (semaphores per Q tile only)
    assert not det.dq_claim and det.dq_turn0_store and main(hd=64, deterministic=True).dq_turn0_store
    assert not main(deterministic=True, bwd_det_diag_align=True).dq_turn0_store
    assert not main(deterministic=True, bwd_stream_post=False).dq_turn0_store
    assert not main().dq_turn0_store
    assert not main(bwd_dq_chunk_release=True).dq_claim
    assert not main(bwd_pdl=False).dq_claim
    assert not _main_kernel(dt, AttnConfig(two_cta=False).resolve("sm90", 128, True), 128, 128, True).dq_claim


@pytest.mark.parametrize("hdim,causal", [(128, True), (64, False)])
def test_dq_claim_sass(tmp_path, hdim, causal):
    """Main kernel: the MMA warps' code (first to last HGMMA) has the default's HGMMA in the same order and about its
    length (ptxas schedules it a little differently: hd64 non-causal 898 instructions both, four integer ops apart;
    hd128 causal 606 against 619, five LDS.64 fewer), no spills;
    the writer has the claim (ATOMG CAS), bulk stores (UBLKCP) beside its bulk reduce-adds (UBLKRED), and a fence
    (MEMBAR.GPU) before its claim releases. The preprocess stores nothing into dQaccum (fewer STG); the postprocess
    is the default's."""
    from kernels.sm90.sass import count, opcode_counts

    cand = _bwd_kernels_sass(tmp_path, "bwd_dq_claim=True", hdim, causal)
    base = _bwd_kernels_sass(tmp_path, "bwd_dq_claim=False", hdim, causal)
    main_c, main_b = cand["main"][0], base["main"][0]
    ops_c = opcode_counts(main_c)
    assert count(ops_c, "LDL") == 0 and count(ops_c, "STL") == 0
    span_c, span_b = _mma_span(main_c), _mma_span(main_b)
    assert [op for op, _ in span_c if op.startswith("HGMMA")] == [op for op, _ in span_b if op.startswith("HGMMA")]
    assert abs(len(span_c) - len(span_b)) <= 0.05 * len(span_b)  # (hd128 causal: 606 vs 619 instructions)
    assert "ATOMG.E.CAS" in main_c and "ATOMG.E.CAS" not in main_b
    assert "UBLKCP.G.S" in main_c and "UBLKCP.G.S" not in main_b and "UBLKRED.G.S.ADD.F32" in main_c
    assert main_c.count("MEMBAR.ALL.GPU") > main_b.count("MEMBAR.ALL.GPU")
    stg = lambda s: len(re.findall(r"\bSTG\.", s))
    assert stg(cand["pre"][0]) < stg(base["pre"][0])
    strip = lambda s: re.sub(r"\.text\.\S+|\.nv\.\S+|kernel_\w+", "", s)
    assert strip(cand["post"][0]) == strip(base["post"][0])


@pytest.mark.parametrize("hdim,causal", [(128, True), (64, False)])
def test_dq_turn0_store_sass(tmp_path, hdim, causal):
    """Deterministic (hd128: its two writer warps): the writer stores (UBLKCP) beside its reduce-adds, the MMA warps'
    HGMMA unchanged, no spills; the preprocess stores nothing into dQaccum."""
    from kernels.sm90.sass import count, opcode_counts

    cand = _bwd_kernels_sass(tmp_path, "deterministic=True, bwd_dq_claim=True", hdim, causal)
    base = _bwd_kernels_sass(tmp_path, "deterministic=True, bwd_dq_claim=False", hdim, causal)
    main_c, main_b = cand["main"][0], base["main"][0]
    ops_c = opcode_counts(main_c)
    assert count(ops_c, "LDL") == 0 and count(ops_c, "STL") == 0
    hg = lambda s: [op for op, _ in _mma_span(s) if op.startswith("HGMMA")]
    assert hg(main_c) == hg(main_b)
    assert "UBLKCP.G.S" in main_c and "UBLKCP.G.S" not in main_b and "UBLKRED.G.S.ADD.F32" in main_c
    stg = lambda s: len(re.findall(r"\bSTG\.", s))
    assert stg(cand["pre"][0]) < stg(base["pre"][0])
