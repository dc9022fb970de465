"""CPU tests of the persistent backward (AttnConfig.bwd_persistent, kernels/sm90/bwd.py _set_persistent): the config
field, which kernels take it, and its SASS (compiled with CUTE_DSL_ARCH=sm_90a; GPU tests: test_bwd_persistent_gpu.py).

    python -m pytest -q tests/test_bwd_persistent.py
"""
from __future__ import annotations

import re

import pytest

from test_bwd_sass import _main_sass  # noqa: E402  (tests/ is on sys.path under pytest)


def test_bwd_persistent_field():
    """None is left out of to_dict() (old hashes and keys), an explicit value is its own config; resolve() leaves it
    None (no DEFAULTS entry); the forward's compiled config drops it; validated. Only FlashBwdSm90 (hd 64 / 128), one
    CTA, not deterministic, not varlen and without PDL takes it."""
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel
    from kernels.tiles import compiled_config

    assert "bwd_persistent" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_persistent=True).config_hash() != AttnConfig().config_hash()
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            assert AttnConfig().resolve("sm90", hd, causal).bwd_persistent is None
    assert "bwd_persistent" not in compiled_config(AttnConfig(bwd_persistent=True), "sm90", 128, False, "fwd")
    assert compiled_config(AttnConfig(bwd_persistent=True), "sm90", 128, True, "bwd")["bwd_persistent"] is True
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="bwd_persistent"):
            AttnConfig(bwd_persistent=bad)
    dt = _cutlass_dtype("bfloat16")

    def main(hd, hv=None, causal=False, **kw):
        varlen = kw.pop("varlen", False)
        cfg = AttnConfig(bwd_persistent=True, **kw).resolve("sm90", hd, causal)
        return _main_kernel(dt, cfg, hd, hv or hd, causal, varlen=varlen)

    assert main(128).persistent and main(64, causal=True).persistent and main(128, bwd_tile_m=64).persistent
    assert main(128, causal=True, bwd_lpt_heads=2).persistent
    assert not main(128, deterministic=True).persistent
    assert not main(64, two_cta=True).persistent
    assert not main(128, varlen=True).persistent
    assert not main(128, bwd_pdl=True).persistent
    assert not main(256).persistent and not main(192, 128).persistent  # FlashBwdWideSm90 / FlashBwd192Sm90
    assert not _main_kernel(dt, AttnConfig().resolve("sm90", 128, False), 128, 128, False).persistent


def _loops(sass: str) -> list[tuple[int, int]]:
    """(first, last) address of every backward branch's span in the SASS without an EXIT inside (the out-of-line
    mbarrier retry blocks past EXIT branch back into the code: not loops of their own, as in steady_state_loops)."""
    from kernels.sm90.sass import instructions

    ins, labels = instructions(sass)
    exits = [a for a, op, _ in ins if op.startswith("EXIT")]
    spans = []
    for a, op, rest in ins:
        m = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if m and labels[m.group(1)] < a and not any(labels[m.group(1)] <= e <= a for e in exits):
            spans.append((labels[m.group(1)], a))
    return spans


def _loop_around_all_loads(sass: str) -> bool:
    """Whether one loop spans every TMA load of the kernel (K / V, Q / LSE, dO / dPsum): the persistent producer's
    tile loop. (Each UTMALDG also sits in its own small issue loop; the default's K / V loads precede its Q-tile
    loop.)"""
    from kernels.sm90.sass import instructions

    ins, _ = instructions(sass)
    loads = [a for a, op, _ in ins if op.startswith("UTMALDG")]
    return any(lo <= loads[0] and loads[-1] <= hi for lo, hi in _loops(sass))


@pytest.mark.compile
@pytest.mark.parametrize("hdim,causal", [(64, False), (128, True)])
def test_bwd_persistent_sass(tmp_path, hdim, causal):
    """The persistent kernel loads K and V inside its tile loop, which spans all its TMA loads (the default: K / V once,
    before the Q-tile loop), keeps the default's HGMMA per Q tile and a steady-state loop (kernels.sm90.sass) without
    spills. (The per-tile setup outside that loop holds 5-7 LDL and 1-6 STL at 240 registers: once per K/V tile.)"""
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops

    base = _main_sass(tmp_path, False, 0.0, causal=causal, hdim=hdim)
    pers = _main_sass(tmp_path, False, 0.0, causal=causal, hdim=hdim, extra="bwd_persistent=True")
    assert _loop_around_all_loads(pers) and not _loop_around_all_loads(base)
    ops_b, ops_p = opcode_counts(base), opcode_counts(pers)
    assert {k: v for k, v in ops_p.items() if k.startswith("HGMMA")} == \
        {k: v for k, v in ops_b.items() if k.startswith("HGMMA")}
    (loop,) = steady_state_loops(pers)
    assert not any(op.startswith(("LDL", "STL")) for op, _ in loop)
    assert count(ops_p, "LDL") <= 8 and count(ops_p, "STL") <= 8
