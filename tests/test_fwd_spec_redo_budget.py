"""AttnConfig.spec_redo_budget (sm90 forward with speculative_exp, opt-in): the second QK^Ts a consumer warpgroup may
take in one Q tile before the tile's remaining blocks run the eager step (kernels/sm90/fwd.py overlap_block, the
TileRegs.spec_left counter tested by a warp vote). It bounds speculation's cost on inputs whose row maxima keep
climbing along the visit order (late_max: the unbudgeted default 0.845-0.862x the eager step on an H100, session 54).

CPU tests: the field (validation, dict / hash, forward-only, refused on sm100, dropped where nothing speculates) and
the machine code: the budgeted loop keeps the votes and the rare arm's QK^T, adds the eager arm (more exponentials),
stays uniform (no R2UR) and spill-free, also in the persistent kernels the default calls run. GPU checks (bitwise the
default where nothing redoes, within a rounding on a ramp of maxima and on the rare arm's inputs):
tests/test_fwd_speculative_exp_gpu.py.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import loop_ops  # noqa: E402
from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    from kernels.tiles import compiled_config

    assert "spec_redo_budget" not in AttnConfig().to_dict()
    assert AttnConfig(spec_redo_budget=2).to_dict()["spec_redo_budget"] == 2
    assert AttnConfig(spec_redo_budget=2).config_hash() != AttnConfig().config_hash()
    for bad in (0, -1, 2000, True, 2.0, "2"):
        with pytest.raises(ConfigError, match="spec_redo_budget"):
            AttnConfig(spec_redo_budget=bad)
    with pytest.raises(ConfigError, match="spec_redo_budget=None"):
        AttnConfig(spec_redo_budget=2).resolve("sm100", 128, False)
    assert (compiled_config(AttnConfig(spec_redo_budget=2), "sm90", 128, True, mode="bwd")
            == compiled_config(AttnConfig(), "sm90", 128, True, mode="bwd"))


@pytest.mark.parametrize("causal", [False, True])
def test_kept_where_the_call_speculates_and_dropped_elsewhere(causal):
    assert AttnConfig(spec_redo_budget=3).resolve("sm90", 128, causal).spec_redo_budget == 3
    assert AttnConfig(spec_redo_budget=3).resolve("sm90", 192, causal).spec_redo_budget == 3
    assert AttnConfig(spec_redo_budget=3).resolve("sm90", 256, causal).spec_redo_budget == 3  # default since session 59
    # no speculation: the config (and hash) of the call without a budget
    for cfg, hdim in ((AttnConfig(spec_redo_budget=3, speculative_exp=False), 128),
                      (AttnConfig(spec_redo_budget=3, rescale_threshold=0.0), 64),
                      (AttnConfig(spec_redo_budget=3, speculative_exp=False), 256)):
        base = dataclasses.replace(cfg, spec_redo_budget=None)
        assert cfg.resolve("sm90", hdim, causal) == base.resolve("sm90", hdim, causal)


def test_kernel_takes_it_only_with_speculation():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, spec_redo_budget=2).spec_redo_budget == 2
    assert FlashFwdSm90(bf, 128, 128, False, spec_redo_budget=2).spec_redo_budget == 0
    assert FlashFwdSm90(bf, 128, 128, False, speculative_exp=True, spec_redo_budget=2,
                        rescale_threshold=0.0).spec_redo_budget == 0  # the kernel drops speculation at tau 0
    assert FlashFwdSm90(bf, 64, 64, True, speculative_exp=True, spec_redo_budget=2,
                        window_left=64).spec_redo_budget == 0  # and with a window


def _loops(cfg, hdim, causal, workdir):
    return loop_ops(cfg, hdim, causal, workdir, all_loops=True)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (192, True)])
def test_budgeted_loop_adds_the_eager_arm(hdim, causal, tmp_path):
    """The speculating (mask-free) loop with a budget: the same two warpgroup votes and the same HGMMAs (the rare arm's
    QK^T), one more warp vote (the budget test), the eager arm's exponentials on top of the speculative ones, and
    uniform code (session 54, CPU: hd64 756 -> 1055 instructions in the loop, 0 R2UR, no local memory)."""
    # (the warpgroup's votes: spec_warp_redo, hd64's default since session 64, has none; a budget drops it)
    base = _loops(AttnConfig(spec_warp_redo=False).resolve("sm90", hdim, causal), hdim, causal, str(tmp_path / "base"))
    got = _loops(AttnConfig(spec_redo_budget=2).resolve("sm90", hdim, causal), hdim, causal, str(tmp_path / "b2"))
    assert len(got) == len(base)
    b, g = base[-1], got[-1]
    n = lambda ops, p: sum(o.startswith(p) for o in ops)  # noqa: E731
    assert n(g, "BAR.RED") == n(b, "BAR.RED") == 2
    assert n(g, "HGMMA") == n(b, "HGMMA")
    assert n(g, "VOTE") > n(b, "VOTE")
    assert n(g, "MUFU.EX2") > n(b, "MUFU.EX2")
    assert g.index("MUFU.EX2") < g.index("FMNMX")  # the common path still speculates first
    assert not any(o == "R2UR" for body in got for o in body)


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
def test_persistent_split_tail_call_compiles_the_budget(tmp_path):
    """A default hd128 non-causal call of 32k (persistent with the split tail): the counter lives per tile."""
    from kernels.config import call_config

    cfg = call_config(AttnConfig(spec_redo_budget=1).resolve("sm90", 128, False), "sm90", 128, False, 32768)
    assert cfg.persistent and cfg.spec_redo_budget == 1
    loops = _loops(cfg, 128, False, str(tmp_path))
    assert sum(o.startswith("BAR.RED") for o in loops[-1]) == 2
    assert not any(o == "R2UR" for body in loops for o in body)
