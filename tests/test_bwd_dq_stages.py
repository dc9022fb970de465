"""AttnConfig.bwd_dq_stages (opt-in): the number of dQ staging buffers of the one-CTA sm90 backward (kernels/sm90/bwd.py
_set_dq_stages). 2 at hd64's 128-row Q tiles fits only with the dS mbarriers in front of the LSE stages: the struct is
then exactly 227 KB (struct_bytes, which _host_setup checks against every one-CTA FlashBwdSm90 struct it builds).

CPU only: the field, where the kernel takes it, and the SASS (sm_90a, nvdisasm). GPU correctness:
tests/test_bwd_dq_stages_gpu.py.
"""
from __future__ import annotations

import re

import pytest

from test_bwd_sass import _bwd_kernels_sass


def test_dq_stages_field():
    """None is left out of to_dict() (old hashes and keys), an explicit value is its own config; resolve() leaves it
    None; dropped from the forward's compiled config; validated."""
    from kernels import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert "bwd_dq_stages" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_dq_stages=2).config_hash() != AttnConfig().config_hash()
    assert AttnConfig(bwd_dq_stages=1).config_hash() != AttnConfig(bwd_dq_stages=2).config_hash()
    for hd in (64, 128):
        for causal in (False, True):
            assert AttnConfig().resolve("sm90", hd, causal).bwd_dq_stages is None
    assert "bwd_dq_stages" not in compiled_config(AttnConfig(bwd_dq_stages=2), "sm90", 64, True, "fwd")
    assert compiled_config(AttnConfig(bwd_dq_stages=2), "sm90", 64, True, "bwd")["bwd_dq_stages"] == 2
    for bad in (0, 3, True, 2.0, "2"):
        with pytest.raises(ConfigError, match="bwd_dq_stages"):
            AttnConfig(bwd_dq_stages=bad)


def test_dq_stages_where_it_applies():
    """hd64 (128-row tiles): one buffer by default, two on request with the dS mbarriers first and the struct at
    exactly 227 KB; 1 forces one where the rule gives two (64-row tiles); hd128's 80-row tiles have no room (the
    kernel says so); two_cta keeps its own rule; the claim path (one buffer only) steps aside."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel
    from kernels.sm90.bwd import SMEM_BYTES, FlashBwdSm90

    dt = _cutlass_dtype("bfloat16")

    def main(hd=64, causal=False, **kw):
        return _main_kernel(dt, AttnConfig(**kw).resolve("sm90", hd, causal), hd, hd, causal)

    base = main()
    assert (base.tile_m, base.dq_stages, base.ds_mbar_first) == (128, 1, False)
    assert base.struct_bytes(2, False) > SMEM_BYTES  # why the rule gives one
    for causal in (False, True):
        for det in (False, True):
            k = main(causal=causal, deterministic=det, bwd_dq_stages=2)
            assert (k.dq_stages, k.ds_mbar_first) == (2, True)
            assert k.struct_bytes(2, True) == SMEM_BYTES
    t64 = main(bwd_tile_m=64)
    assert t64.dq_stages == 2 and not t64.ds_mbar_first
    assert main(bwd_tile_m=64, bwd_dq_stages=1).dq_stages == 1
    assert main(bwd_dq_stages=1).dq_stages == 1
    with pytest.raises(ValueError, match="bwd_dq_stages=2"):
        main(hd=128, bwd_dq_stages=2)
    two = main(two_cta=True, bwd_dq_stages=2)
    assert two.ds_mbar_first is False and two.dq_stages == main(two_cta=True).dq_stages
    assert main(causal=True, bwd_dq_claim=True).dq_claim
    assert not main(causal=True, bwd_dq_claim=True, bwd_dq_stages=2).dq_claim
    with pytest.raises(ValueError, match="dq_stages"):
        FlashBwdSm90(dt, 64, False, dq_stages=3)


def _writer_waits(sass: str) -> set[str]:
    return set(re.findall(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", sass))


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_dq_stages_sass(tmp_path, causal):
    """hd64 with two staging buffers: no local memory, the default's HGMMA and bulk-reduction counts, and the writer
    waits for the reads of all but the last hand-off's two chunks (DEPBAR.LE SB0, 0x2) where the one-buffer kernel
    waits for all of them; the pre / post kernels are the default's."""
    from kernels.sm90.sass import opcode_counts

    two = _bwd_kernels_sass(tmp_path, "bwd_dq_stages=2", 64, causal)
    one = _bwd_kernels_sass(tmp_path, "", 64, causal)
    c2, c1 = opcode_counts(two["main"][0]), opcode_counts(one["main"][0])
    assert not {k: v for k, v in c2.items() if re.match(r"(LDL|STL)\b", k)}
    for op in ("HGMMA", "UBLKRED"):
        assert sum(v for k, v in c2.items() if k.startswith(op)) == sum(v for k, v in c1.items() if k.startswith(op))
    assert "0x2" in _writer_waits(two["main"][0]) and "0x2" not in _writer_waits(one["main"][0])
    for kind in ("pre", "post"):
        assert two[kind][0] == one[kind][0], kind


@pytest.mark.compile
def test_dq_stages_det_early_handback_sass(tmp_path):
    """Deterministic (one writer) with two buffers: the writer arrives on the dQ-empty barriers (ids 9, 10) in two
    places, the walk's first tile and after each tile's reductions are issued (dq_writer's ``early``), where the
    one-buffer kernel arrives once per tile at the top of its loop; no local memory."""
    from kernels.sm90.sass import opcode_counts

    arrives = lambda sass: len(re.findall(r"BAR\.ARV 0x(?:9|a), 0xa0", sass))  # noqa: E731
    sched = "deterministic=True, det_schedule='rotate'"  # (the hd64 non-causal default, lpt, has two buffers)
    two = _bwd_kernels_sass(tmp_path, f"{sched}, bwd_dq_stages=2", 64, False)["main"][0]
    one = _bwd_kernels_sass(tmp_path, sched, 64, False)["main"][0]
    assert (arrives(one), arrives(two)) == (2, 4)
    assert not {k: v for k, v in opcode_counts(two).items() if re.match(r"(LDL|STL)\b", k)}


def test_deferred_release_where_it_applies():
    """The deferred semaphore release (dq_writer.deferred_release): deterministic lpt walks with two staging buffers
    and one writer (hd64 non-causal's deterministic default; causal lpt on request); not on one buffer, rotate / spt
    turns, two writers or the non-deterministic kernel."""
    from kernels import AttnConfig
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel

    dt = _cutlass_dtype("bfloat16")

    def main(causal=False, **kw):
        return _main_kernel(dt, AttnConfig(**kw).resolve("sm90", 64, causal), 64, 64, causal)

    assert main(deterministic=True).deferred_release()
    assert main(causal=True, deterministic=True, det_schedule="lpt", bwd_dq_stages=2).deferred_release()
    for causal, kw in ((False, dict(deterministic=True, bwd_dq_stages=1)),
                       (False, dict(deterministic=True, det_schedule="rotate", bwd_dq_stages=2)),
                       (True, dict(deterministic=True, bwd_dq_stages=2)),
                       (False, dict(deterministic=True, bwd_det_two_writers=True)),
                       (False, dict(bwd_dq_stages=2))):
        assert not main(causal, **kw).deferred_release(), (causal, kw)


@pytest.mark.compile
def test_deferred_release_sass(tmp_path):
    """hd64 non-causal deterministic default (lpt, two buffers): the writer waits for all but the newest tile's two
    commit groups (DEPBAR.LE SB0, 0x2: the previous tile's reads before its buffer goes back, its completion before its
    release) and releases in two places (the loop, the walk's last tile); rotate with two buffers, which keeps the
    immediate release, waits only for all groups and releases in one place."""
    red = lambda sass: len(re.findall(r"\bREDG\.E\.ADD\.S32", sass))  # noqa: E731
    lpt = _bwd_kernels_sass(tmp_path, "deterministic=True", 64, False)["main"][0]
    rot_cfg = "deterministic=True, det_schedule='rotate', bwd_dq_stages=2"
    rot = _bwd_kernels_sass(tmp_path, rot_cfg, 64, False)["main"][0]
    assert "0x2" in _writer_waits(lpt) and "0x2" not in _writer_waits(rot)
    assert (red(lpt), red(rot)) == (2, 1)
